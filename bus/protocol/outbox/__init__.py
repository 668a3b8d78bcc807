"""The outbox: the per-partition slot a commit claims, and completing what it committed.

* ``slot``     - the per-partition outbox slot, read and claimed by ETag (R3, R6).
* ``dispatch`` - completing a committed record (D1-D6): fresh attempt ids, tokens, payloads,
                 signals, fences, consuming the incoming token, clearing the slot.
* ``driver``   - the same completion one step at a time (the Durable orchestration).
* ``deferral`` - messages a handler set aside, fetched and released by id.
"""
