"""The exactly-once protocol, written only against the storage ports.

Modules, in the order a message meets them (tests/unit/test_package_map.py keeps this
list complete):

* ``send``       - a sender outside any handler: token first, then the signal.
* ``sendgroup``  - concurrent sends of one process sharing their requests.
* ``counters``   - sequence numbers of a client's sends to handlers with sessions.
* ``ledger``     - sending once per message id from outside a handler.
* ``marked``     - many messages at once, each once per message id: tokens with send marks.
* ``sealing``    - a copy encrypted and signed as it is made; checked and opened on receipt.
* ``courier``    - putting one copy on its way: token, claim-check payload, signal.
* ``bundles``    - several signals for one queue in one queue message.
* ``payloads``   - claim-check blobs for payloads too large for a queue message.
* ``topics``     - recipient lists in blobs, changed by ETag compare-and-swap.
* ``backpressure`` - bounded queues and a bound on sends in flight.
* ``delivery``   - what the receiver is given (a signal) and answers (its outcome).
* ``steps``      - the steps of a delivery named once: R1-R8 receiving, D1-D6 completing.
* ``admission``  - R1-R2 of receiving: decode, verify, route, not yet due, payload,
                   partition.
* ``receive``    - the receiver and its claim: load the partition's outbox slot, check the
                   inbox token, commit state + outbox record atomically with an ETag claim,
                   complete the record; a single signal is a batch of one.
* ``handling``   - R5: the handler run against its partition, with immediate retries.
* ``sessions``   - per-key order: numbered copies, the session row, set aside until their turn.
* ``poisoning``  - poisoning a signal with the reason, its token parked.
* ``inbox``      - inbox tokens (one per in-flight message copy), fences and parked tokens.
* ``verdict``    - what a token's state means for an arriving copy: the one place it is decided.
* ``outbox``     - the per-partition outbox slot, the claim.
* ``records``    - what an outbox slot holds.
* ``slotcache``  - claims from the memory of this process's own commits.
* ``dispatch``   - completing a committed outbox record: fresh attempt ids, tokens, payloads,
                   signals, fences, consuming the incoming token, clearing the slot.
* ``driver``     - the same completion one step at a time (the Durable orchestration).
* ``deferral``   - messages a handler set aside, fetched and released by id.
* ``session_admin`` - an endpoint's sessions for operators and maintenance: skip, close.
* ``poison``     - the poison queue entries.
* ``deadletters`` - listing, replaying and purging them.
* ``sweeper``    - the documented orphan-cleanup rule.
* ``safeguards`` - the switches the simulation turns off to prove it can fail.
"""
