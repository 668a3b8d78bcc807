"""Idempotent sends from outside a handler: the sender's own outbox, keyed by message id.

``Bus.send`` puts each copy on its way exactly once *per call*; a caller that crashes and calls
again sends twice. Data pipelines re-run tasks and whole jobs, so they need more: the ledger
gives a sender the guarantee a handler has. The first call for a message id records the
message (every copy, with its attempt id) in a ledger row - an outbox record in a partition of
its own - and completes it exactly like a handler's record (``dispatch``: tokens, phase
SENDING, signals, fences). Then the row is marked DONE and kept. A later call with the same id
finds the row: DONE means nothing to do; anything else means an earlier call died midway, and
this one finishes the job from the persisted phase (with fresh attempt ids if no signal can
have gone out yet - the same rule that protects handlers' records).

Rows are kept for ``Settings.ledger_retention_seconds`` (7 days by default) and then removed by
``forget``: a re-send after that sends again, like a duplicate-detection window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bus.envelope import Envelope
from bus.errors import Contention
from bus.ids import IdFactory
from bus.protocol.outbox.dispatch import Dispatcher
from bus.protocol.outbox.slot import SLOT_ROW, ClaimLost, Outbox, Slot
from bus.protocol.records import OutboxRecord, Phase
from bus.protocol.safeguards import Safeguards
from bus.storage import PreconditionFailed, Tables

LEDGER_SOURCE = "~ledger"
"""The ``endpoint`` of ledger records (no inbox token belongs to it)."""
_ROUNDS = 10


class Ledger:
    def __init__(self, *, tables: Tables, table: str, dispatcher_for: Callable[
            [Outbox], Dispatcher], clock: Callable[[], float], new_id: IdFactory,
                 safeguards: Safeguards) -> None:
        self._new_id = new_id
        self._safeguards = safeguards
        self._tables = tables
        self._table = table
        self._outbox = Outbox(tables, table)
        self._dispatcher = dispatcher_for(self._outbox)
        self._clock = clock

    def send(self, message_id: str, envelopes: Sequence[Envelope]) -> bool:
        """Send ``envelopes`` (the copies of message ``message_id``) unless an earlier call
        did. Returns True when this call recorded the message, False when it was recorded
        before (finished now, whoever started it). Raises a StorageError when the outcome is
        unknown: calling again is always safe."""
        key = message_id  # the envelope's id pattern (A-Z a-z 0-9 _ -) is a valid table key
        if not self._safeguards.send_ledger:
            key = f"{key}-{self._new_id()}"  # the "forget-sent" break: every call is new
        for _ in range(_ROUNDS):
            try:
                slot, mine = self._record(key, message_id, envelopes)
                assert slot.record is not None
                if slot.record.phase is Phase.DONE:
                    return False
                self._complete(slot, committed_by_me=mine)
            except ClaimLost:
                continue  # another caller moved the row on; look again
            return mine
        raise Contention(f"ledger row of {message_id!r} kept changing")

    def forget(self, older_than: float) -> int:
        """Remove DONE rows recorded more than ``older_than`` seconds ago; returns how many."""
        cutoff = self._clock() - older_than
        removed = 0
        for slot in self._outbox.pending():
            assert slot.record is not None
            if slot.record.phase is Phase.DONE and slot.record.committed_at < cutoff:
                # Deleting is safe here, unlike an endpoint's slot: a delayed create of this
                # row cannot arrive days later (Azure refuses requests signed 15 min ago).
                try:
                    self._tables.delete(self._table, slot.partition, SLOT_ROW, etag=slot.etag)
                except PreconditionFailed:
                    continue
                removed += 1
        return removed

    def _record(self, key: str, message_id: str,
                envelopes: Sequence[Envelope]) -> tuple[Slot, bool]:
        """The ledger row of ``message_id``, created by this call (True) or found (False)."""
        record = OutboxRecord(endpoint=LEDGER_SOURCE, message_id=message_id,
                              attempt_id=message_id, outgoing=tuple(envelopes),
                              committed_at=self._clock())
        try:  # create-only first: a new id costs no read
            return self._outbox.commit(Slot(key, None, None), [], record), True
        except ClaimLost:
            pass
        slot = self._outbox.load(key)
        if slot.record is None:  # removed by ``forget`` just now: the window is over
            return self._outbox.commit(slot, [], record), True
        return slot, False

    def _complete(self, slot: Slot, *, committed_by_me: bool) -> None:
        slot = self._dispatcher.prepare(slot, committed_by_me=committed_by_me)
        record = slot.record
        assert record is not None
        self._dispatcher.signal(record)
        self._dispatcher.fence_superseded(record)
        self._outbox.update(slot, record.done())

