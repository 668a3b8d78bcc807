"""Receiving a signal (R1-R8): admitted, claimed, handled, committed, completed.

* ``admission`` - R1-R2: decode, verify, route, not yet due, payload, partition; for every
                  reader of a queue (the receiver, a Spark read).
* ``receiver``  - the receiver and its claim (R3, R4, R6, R7): a single signal is a batch of
                  one.
* ``handling``  - R5: the handler run against its partition, with immediate retries.
* ``slotcache`` - claims from the memory of this process's own commits.
* ``lanes``     - a round's independent requests (slot loads, commits, acknowledgements) side
                  by side.
* ``settle``    - a message's unfinished record completed before its poisoned token goes (a
                  purge).
"""
