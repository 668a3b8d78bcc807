"""The exactly-once protocol, written only against the storage ports.

Its parts, in the order a message meets them; each sub-package's docstring lists its modules
(tests/unit/test_package_map.py keeps every list complete), and docs/architecture.md's layers
say which may import which:

* ``steps``      - the steps of a delivery named once: R1-R8 receiving, D1-D6 completing.
* ``safeguards`` - the switches the simulation turns off to prove it can fail.
* ``records``    - what an outbox slot holds: the records the protocol persists.
* ``tokens``     - inbox tokens and what a token's state means for an arriving copy.
* ``copies``     - putting one copy on its way: token, sealed payload or claim check, signal;
                   topics and back-pressure.
* ``delivery``   - what the receiver is given (a signal) and answers (its outcome).
* ``outbox``     - the per-partition slot (the claim) and completing a committed record.
* ``sessions``   - per-key order: numbered copies, the session row, operators' actions.
* ``poison``     - a copy set aside with its reason; listing, replaying and purging.
* ``send``       - sends from outside a handler: alone, grouped, once per message id.
* ``receive``    - the receiver: admission, claim, handling, commit, completion.
* ``upkeep``     - the orphan-cleanup rule.
"""
