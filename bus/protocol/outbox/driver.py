"""Driving one committed record from outside the receiver, one step at a time.

The Durable Functions orchestration (``bus.hosting.functions``) calls these as activities:
``prepare`` (tokens, phase SENDING), ``signal`` (a batch of copies), ``finish`` (fences,
incoming token). Activities run at least once and any number of them may overlap with a
receiver that helps the same record along, so every step first checks that the slot still
holds the record it was given (by incoming message id) and is a no-op when it does not: the
record was then finished by someone else, which the protocol allows at any point. ``prepare``
and ``finish`` also check that the record is not finished already (its incoming token gone),
so a re-run orchestration does not send its signals again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from bus.errors import Contention
from bus.protocol.outbox.dispatch import Dispatcher
from bus.protocol.outbox.slot import ClaimLost, Outbox, Slot
from bus.protocol.records import Phase, RecordKey
from bus.protocol.safeguards import Safeguards

log = logging.getLogger(__name__)

ALL_ON = Safeguards()
_ROUNDS = 10


class OutboxDriver:
    def __init__(self, *, outbox: Outbox, dispatcher: Dispatcher,
                 clock: Callable[[], float], safeguards: Safeguards = ALL_ON) -> None:
        self._outbox = outbox
        self._dispatcher = dispatcher
        self._clock = clock
        self._safeguards = safeguards

    def prepare(self, key: RecordKey) -> int | None:
        """Place every token; returns how many copies to signal, None when already finished."""
        for _ in range(_ROUNDS):
            slot = self._load(key)
            if slot is None or self._finished(slot):
                return None
            try:
                # Always fresh attempt ids: an earlier run of this activity may have placed
                # tokens for the current ones and still have a request in flight.
                slot = self._dispatcher.prepare(slot, committed_by_me=False)
            except ClaimLost:
                continue
            assert slot.record is not None
            return len(slot.record.outgoing)
        raise Contention(f"outbox slot {key.partition!r} kept changing")

    def signal(self, key: RecordKey, indexes: Sequence[int]) -> int:
        """Send the chosen copies; returns how many were sent (0 when already finished)."""
        slot = self._load(key)
        if slot is None or slot.record is None or slot.record.phase is not Phase.SENDING:
            return 0
        chosen = [i for i in indexes if 0 <= i < len(slot.record.outgoing)]
        self._dispatcher.signal(slot.record, chosen)
        return len(chosen)

    def finish(self, key: RecordKey) -> bool:
        """Fence, consume the incoming token. False: someone else finished the record."""
        for _ in range(_ROUNDS):
            slot = self._load(key)
            if slot is None or self._finished(slot):
                return False
            try:
                if self._unsent(slot):
                    self._dispatcher.complete(slot, committed_by_me=False)
                else:
                    self._dispatcher.finish(slot)
            except ClaimLost:
                continue
            return True
        raise Contention(f"outbox slot {key.partition!r} kept changing")

    def recover(self, older_than: float) -> int:
        """Finish every unfinished record committed more than ``older_than`` seconds ago;
        returns how many. For maintenance: catches records whose orchestration failed for
        good. One token read per partition holding a record. A record that cannot be finished
        now (a full or missing queue, storage trouble) is logged and left for the next pass:
        it never keeps the records after it from being finished."""
        finished = 0
        cutoff = self._clock() - older_than
        for slot in self._outbox.pending():
            assert slot.record is not None
            try:
                if slot.record.committed_at > cutoff or self._finished(slot):
                    continue
                self._dispatcher.complete(slot, committed_by_me=False)
                finished += 1
            except ClaimLost:
                continue  # someone else is on it
            except Exception as exc:
                log.warning("the outbox record of %s in partition %r could not be finished "
                            "(%s: %s); the next maintenance pass tries again",
                            slot.record.message_id, slot.partition, type(exc).__name__, exc)
        return finished

    def _finished(self, slot: Slot) -> bool:
        assert slot.record is not None
        return self._dispatcher.is_finished(slot.record)

    @staticmethod
    def _unsent(slot: Slot) -> bool:
        record = slot.record
        return record is not None and record.phase is Phase.COMMITTED and bool(record.outgoing)

    def _load(self, key: RecordKey) -> Slot | None:
        slot = self._outbox.load(key.partition)
        if not self._safeguards.own_record_steps and slot.record is not None:  # a break
            return slot if slot.record.message_id == key.message_id else None
        if slot.record is None or not key.names(slot.record):
            return None
        return slot
