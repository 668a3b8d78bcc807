"""The exactly-once protocol, written only against the storage ports.

Modules, in the order a message meets them:

* ``send``      - a sender outside any handler: token first, then the signal.
* ``receive``   - the receiver: load the partition's outbox slot, check the inbox token, run the
                  handler, commit state + outbox record atomically with an ETag claim.
* ``dispatch``  - completing a committed outbox record: fresh attempt ids, tokens, payloads,
                  signals, fences, consuming the incoming token, clearing the slot.
* ``inbox``     - inbox tokens (one per in-flight message copy), fences and parked tokens.
* ``verdict``   - what a token's state means for an arriving copy: the one place it is decided.
* ``outbox``    - the per-partition outbox slot, the claim.
* ``payloads``  - claim-check blobs for payloads too large for a queue message.
* ``topics``    - recipient lists in blobs, changed by ETag compare-and-swap.
* ``poison``    - the poison queue entries.
* ``sweeper``   - the documented orphan-cleanup rule.
* ``safeguards``- the switches the simulation turns off to prove it can fail.
"""
