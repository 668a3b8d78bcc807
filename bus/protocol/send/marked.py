"""Marked sends: many messages at once, each once per message id, in a few requests.

``Bus.send_once`` gives a sender a handler's guarantee through its ledger, at about five
requests per message. A data pipeline sends millions of rows from many tasks at once; each task
may run again (a retry, a speculative copy) and so may the whole job. It needs the same
guarantee at a fraction of a request per message. So each copy's token is created together
with a **send mark**, a row ``~sent~<message id>`` in the destination's own token partition
that names the token's attempt id, in one entity-group transaction (up to 50 copies a request):

0. A row in the marks' log naming the message ids, due when their retention has passed
   (``bus.protocol.tokens.marklog``): how the sweeper finds old marks without reading all.
1. ``[insert mark, insert token] x n`` for copies with fresh attempt ids. Marks are insert-only:
   when one exists already the transaction fails as a whole, the marks of the copies are read,
   those that have one leave, and the transaction goes again. A copy has a token only if it
   has a mark naming that token, so a message id never gets a second token at a destination.
   A request whose answer was lost is sent again as it was: if it had landed, the conflict
   shows the marks as this call's own (the attempt ids it chose).
2. The claim-check blobs of the copies to signal: those created now, and those whose mark
   names a token still waiting (live, or poisoned by the sweeper as a presumed orphan) and
   says no signal of it was sent: an earlier call stopped before its signal went, or before
   the signal's answer.
3. Their signals, bundled per destination. A repeated signal is harmless: the token admits one
   processing.
4. Once the signals' sends answered, a note on their marks that they went (a conditional
   replace of each mark, in transactions: about one request per 100 copies). A signal, once
   sent, stays on its queue until a receiver is done with it (queue messages here never
   expire), so a call made again before the copies are consumed sends nothing twice: a data
   job run again on the same rows leaves the queue's depth as it was. A note is written only
   after the send answered; one written before would leave a copy whose send then failed
   without a signal for good (the break "note-before-signal"). A note that fails costs one
   more signal on the next call, nothing else.

A call that stops anywhere can be made again with the same message ids: nothing marked is
created twice, and what still waits without a signal gets one. If nobody calls again, the sweeper
poisons a live token that never got a signal as a presumed orphan after ``orphan_age`` and reports
it.

The sweeper forgets a mark once it is older than ``Settings.ledger_retention_seconds`` *and* its
token is gone (processed): a message is never sent twice while it waits, however long. The same
message id sent after that is a new message, as with the send ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bus.envelope import Envelope
from bus.errors import Contention
from bus.ids import IdFactory
from bus.protocol.copies.courier import Courier, due_at
from bus.protocol.tokens.inbox import Lineage, Mark, Token, TokenState
from bus.protocol.tokens.marklog import MarkLog
from bus.storage import Conflict, StorageError, TransientError

log = logging.getLogger(__name__)

_ROUNDS = 20
_LOG_TRIES = 3


class MarkedSender:
    """Sends copies through send marks (module doc). ``together`` off, ``marked`` off and
    ``note_after`` off are the simulation's breaks "mark-apart", "unmarked-sends" and
    "note-before-signal"."""

    def __init__(self, *, courier: Courier, new_id: IdFactory,
                 resign: Callable[[Envelope], Envelope], mark_log: MarkLog,
                 retention: float, together: bool = True, marked: bool = True,
                 note_after: bool = True) -> None:
        self._courier = courier
        self._mark_log = mark_log
        self._retention = retention
        self._inbox = courier.inbox
        self._new_id = new_id
        self._resign = resign
        self._together = together
        self._marked = marked
        self._note_after = note_after

    def send(self, envelopes: Sequence[Envelope], origin: str = "") -> list[bool]:
        """Send each copy unless a copy of its message id went to its destination before.
        Returns, per copy, True when this call created it - or, with ``origin``, a call with
        the same origin did (the attempts of one Spark job). Raises PayloadError before anything
        is written when a payload is over the limit; a StorageError when a step keeps failing
        (calling again with the same message ids is always safe); QueueFull for a full
        destination (its copies are marked: calling again sends their signals)."""
        self._courier.check_payloads(envelopes)
        created = [False] * len(envelopes)
        signal: list[tuple[Envelope, Mark | None]] = []
        by_destination: dict[str, list[int]] = {}
        for index, envelope in enumerate(envelopes):
            by_destination.setdefault(envelope.destination, []).append(index)
        for destination, indexes in by_destination.items():
            marking = self._mark(destination, [envelopes[i] for i in indexes], origin)
            for index in indexes:
                created[index] = envelopes[index].message_id in marking.mine
            signal.extend(marking.waiting)
        copies = [envelope for envelope, _ in signal]
        self._courier.put_payloads(copies)
        if not self._note_after:
            self._note([mark for _, mark in signal])
        problems = self._courier.signal_many(copies)
        if self._note_after:
            self._note([mark for (_, mark), problem in zip(signal, problems, strict=True)
                        if problem is None])
        problem = next((p for p in problems if p is not None), None)
        if problem is not None:
            raise problem
        return created

    def _note(self, marks: list[Mark | None]) -> None:
        """Step 4: note on the marks that their signals went (per destination). A failure
        is logged, not raised: the signals went, and a later call only sends one more."""
        by_destination: dict[str, list[Mark]] = {}
        for mark in marks:
            if mark is not None:
                by_destination.setdefault(mark.endpoint, []).append(mark)
        for destination, noted in by_destination.items():
            try:
                self._inbox.note_signalled(noted)
            except StorageError as exc:
                log.info("the signals of %d copies to %s went, but noting it on their marks "
                         "failed (a later call sends them again): %s", len(noted),
                         destination, exc)

    def _mark(self, destination: str, copies: list[Envelope], origin: str) -> _Marking:
        """Step 1 for the copies of one destination: the message ids this call created, and
        the copies to signal (as this call made them, or as the mark names them) with their
        marks."""
        unique = list({e.message_id: e for e in reversed(copies)}.values())[::-1]
        if self._marked:
            self._log(destination, [e.message_id for e in unique])
        marking = _Marking(destination, origin)
        per = max(1, self._inbox.limits.transaction_operations // 2)
        for start in range(0, len(unique), per):
            self._mark_chunk(marking, unique[start:start + per])
        return marking

    def _log(self, destination: str, message_ids: list[str]) -> None:
        """Step 0: the marks' log row (``marklog``), before any mark: the sweeper finds the
        marks by it once their retention has passed. A row whose answer was lost is written
        again (a second row naming the same marks is harmless)."""
        now = self._courier.now()
        for attempt in range(_LOG_TRIES):
            try:
                self._mark_log.record(destination, message_ids, now, now + self._retention)
                return
            except TransientError:
                if attempt == _LOG_TRIES - 1:
                    raise

    def _mark_chunk(self, marking: _Marking, chunk: list[Envelope]) -> None:
        marking.tried.update((e.message_id, e.attempt_id) for e in chunk)
        pending = list(chunk)
        for _ in range(_ROUNDS):
            if not pending:
                return
            try:
                marks = self._inbox.create_marked(
                    marking.destination,
                    [(e.attempt_id, e.message_id, due_at(e)) for e in pending],
                    self._courier.now(), origin=marking.origin, together=self._together,
                    marked=self._marked, lineages=[Lineage.of(e) for e in pending])
            except Conflict:
                pending = self._resolve(marking, pending)
                continue
            except TransientError:
                continue  # the outcome is unknown: the same request again tells (a conflict)
            made = {mark.message_id: mark for mark in marks}
            marking.mine.update(e.message_id for e in pending)
            marking.waiting.extend((e, made.get(e.message_id)) for e in pending)
            return
        raise Contention(f"the send marks at {marking.destination} kept changing")

    def _resolve(self, marking: _Marking, pending: list[Envelope]) -> list[Envelope]:
        """After a conflict: the copies whose mark exists leave ``pending``; a mark naming the
        attempt id this call tried (or this call's origin) is this call's own. Each one whose
        token still waits without a signal sent joins ``waiting`` under its mark's attempt id.
        Returns the copies still to mark."""
        destination = marking.destination
        found = self._inbox.marks(destination, [e.message_id for e in pending])
        if not found:  # no mark: a token was in the way (a break's); go again with new ids
            fresh = [self._resign(e.model_copy(update={"attempt_id": self._new_id()}))
                     for e in pending]
            marking.tried.update((e.message_id, e.attempt_id) for e in fresh)
            return fresh
        tokens = self._inbox.read_many(destination, [m.attempt_id for m in found.values()])
        left: list[Envelope] = []
        for envelope in pending:
            mark = found.get(envelope.message_id)
            if mark is None:
                left.append(envelope)
                continue
            if marking.owns(mark):
                marking.mine.add(envelope.message_id)
            token = tokens.get(mark.attempt_id)
            if token is not None and _waits(token) and not mark.signalled:
                marking.waiting.append((self._as_marked(envelope, mark), mark))
        return left

    def _as_marked(self, envelope: Envelope, mark: Mark) -> Envelope:
        """The copy under the attempt id its mark names (signed anew if that changed it)."""
        if envelope.attempt_id == mark.attempt_id:
            return envelope
        return self._resign(envelope.model_copy(update={"attempt_id": mark.attempt_id}))


@dataclass
class _Marking:
    """Step 1 at one destination: what this call tried and what came of it."""

    destination: str
    origin: str
    tried: dict[str, str] = field(default_factory=dict)  # message id -> attempt id
    mine: set[str] = field(default_factory=set)
    waiting: list[tuple[Envelope, Mark | None]] = field(default_factory=list)
    """The copies to signal, each with its mark (None: the break "unmarked-sends")."""

    def owns(self, mark: Mark) -> bool:
        """Whether this call made ``mark`` (or a call of the same origin did)."""
        return mark.attempt_id == self.tried.get(mark.message_id) or bool(
            self.origin and mark.origin == self.origin)


def _waits(token: Token) -> bool:
    """Whether a marked copy's token still waits for a signal to be processed."""
    return token.state in (TokenState.LIVE, TokenState.PENDING) or (
        token.state is TokenState.POISONED and token.orphan)
