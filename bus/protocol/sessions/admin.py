"""The sessions of an endpoint, for operators and maintenance: list, show, skip, close.

Session rows live in the endpoint's state table, beside the business rows
(``bus.protocol.sessions.order``). Listing them is a query of the row keys that start with
``~bus.session~`` (a scan of the table on the service's side: for tooling, not hot paths).

An operator's change to a session row is written in one transaction with the partition's
outbox slot rewritten unchanged, both by compare-and-swap, so it claims the partition as a
handler's commit does: a handler run prepared against the row as it was fails its own
compare-and-swap and runs again. Skipping and closing then release the copies waiting in the
session: each arrives through the receiver, which skips the gap before it or, the session
being closed, poisons it with the reason - so nothing waiting is lost or left behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bus.audit import Audit
from bus.errors import AmbiguousSession, Contention
from bus.protocol.copies.courier import Courier
from bus.protocol.outbox.deferral import release
from bus.protocol.outbox.dispatch import Dispatcher
from bus.protocol.outbox.slot import ClaimLost, Outbox, Slot
from bus.protocol.safeguards import Safeguards
from bus.protocol.sessions.order import (
    SESSION_ROW,
    SessionRow,
    Waiting,
    decode,
    session_row_key,
    skip_requested,
    write_op,
)
from bus.protocol.tokens.inbox import TokenState, finished
from bus.storage import Entity, Tables

log = logging.getLogger(__name__)

_ROUNDS = 5


@dataclass(frozen=True)
class SessionInfo:
    """One session as its row says now."""

    endpoint: str
    partition: str
    session: str
    row: SessionRow
    etag: str
    reorder_window: float = 300.0
    """Its endpoint's reorder window (``Endpoint(reorder_window=...)``): how long a gap may
    hold its copies up before the session counts as stuck."""

    @property
    def waiting(self) -> tuple[Waiting, ...]:
        return self.row.waiting

    @property
    def closed(self) -> bool:
        return self.row.closed

    def waited(self, now: float) -> float:
        """How long its oldest waiting copy has waited (0 when nothing waits)."""
        oldest = self.row.oldest_wait()
        return 0.0 if oldest is None else max(0.0, now - oldest)

    def stuck(self, now: float, window: float) -> bool:
        """Whether a gap has held up its waiting copies longer than ``window``."""
        return bool(self.waiting) and self.waited(now) >= window

    def summary(self, now: float | None = None,
                window: float | None = None) -> dict[str, object]:
        """What ``python -m bus sessions`` prints of it (JSON): its status (closed, stuck,
        waiting or open), the next number per stream, what waits and since when. ``now``:
        the time to judge it at (default: this machine's clock); ``window``: the reorder
        window it counts as stuck after (default: its endpoint's)."""
        now = time.time() if now is None else now
        window = self.reorder_window if window is None else window
        return {
            "session": self.session, "partition": self.partition,
            "status": ("closed" if self.closed else "stuck" if self.stuck(now, window)
                       else "waiting" if self.waiting else "open"),
            "next": dict(self.row.streams), "waiting": len(self.waiting),
            "waited_seconds": round(self.waited(now), 3),
            "first_waiting": {w.stream: w.sequence for w in self.row.waiting
                              if w.sequence == min(x.sequence for x in self.row.waiting
                                                   if x.stream == w.stream)},
            "handled": self.row.handled, "gaps": len(self.row.gaps),
            "blocked_since": self.row.blocked_since, "closed_at": self.row.closed_at}


class Sessions:
    """The sessions of one endpoint."""

    def __init__(self, *, endpoint: str, tables: Tables, table: str, outbox: Outbox,
                 courier: Courier, clock: Callable[[], float], window: float,
                 skip_gaps: bool, dispatcher: Dispatcher,
                 safeguards: Safeguards | None = None, audit: Audit | None = None) -> None:
        """``dispatcher``: completes the partition's unfinished record before an operator's
        change (a copy set aside is deferred when its record finishes); ``audit``: records
        each skip and close before it runs (``bus.audit``)."""
        self._audit = audit
        self._dispatcher = dispatcher
        self._complete_first = (safeguards or Safeguards()).complete_before_session_action
        self.endpoint = endpoint
        self.window = window
        self.skip_gaps = skip_gaps
        self._tables = tables
        self._table = table
        self._outbox = outbox
        self._courier = courier
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    def list(self) -> list[SessionInfo]:
        """Every session of the endpoint: stuck ones first (longest waiting first), then
        those with copies waiting, open ones, and closed ones last."""
        now = self._clock()
        found = [self._info(row) for row in self._tables.query(
            self._table, row_key_prefix=SESSION_ROW)]
        return sorted(found, key=lambda s: (s.closed, not s.stuck(now, self.window),
                                            not s.waiting, -s.waited(now), s.session))

    def get(self, session: str, partition: str | None = None) -> SessionInfo | None:
        """The session ``session`` - in ``partition``, or wherever its row is - or None.
        Raises AmbiguousSession when ``partition`` is None and the key has rows in several
        partitions (its messages map to more than one)."""
        rows = [row for row in self._tables.query(self._table, row_key=session_row_key(session))
                if partition is None or row.partition_key == partition]
        if len(rows) > 1:
            raise AmbiguousSession(
                f"session {session!r} of {self.endpoint!r} has a row in "
                f"{len(rows)} partitions ({', '.join(repr(r.partition_key) for r in rows)}): "
                "name one (partition=, --partition)")
        return self._info(rows[0]) if rows else None

    def skip(self, session: str, partition: str | None = None) -> int:
        """Move the session past its gaps now, whatever the reorder window: returns how many
        waiting copies were released to go on (0: nothing waits, so nothing to skip to).
        ``partition``: where its row is, when its key has rows in several (``get``)."""
        self._record("skip", session, partition)
        info = self._change(session, partition, skip_requested)
        if info is not None:
            info = self._without_poisoned(info)  # they would hold the skip up (see there)
        if info is None or not info.waiting:
            return 0
        return self._release(_firsts(info.waiting))

    def close(self, session: str, partition: str | None = None) -> int:
        """Close the session: later copies of it are poisoned with the reason, and so is each
        copy waiting in it (released to be). Returns how many were waiting. ``partition``:
        as for ``skip``."""
        self._record("close", session, partition)
        now = self._clock()
        info = self._change(session, partition, lambda row: row if row.closed else
                            row.model_copy(update={"closed_at": now, "updated_at": now}))
        return 0 if info is None else self._release(info.waiting)

    def _record(self, action: str, session: str, partition: str | None) -> None:
        if self._audit is not None:
            self._audit(action, self.endpoint, {
                "session": session, **({"partition": partition} if partition else {})})

    def forget(self, session: str, partition: str, message_id: str) -> bool:
        """Take ``message_id``'s copies out of the session's waiting list: the message will
        never come (an operator purged it), so its number is a gap like any other. Whether
        the row listed it."""
        listed = [False]

        def without(row: SessionRow) -> SessionRow:
            kept = tuple(w for w in row.waiting if w.message_id != message_id)
            listed[0] = len(kept) != len(row.waiting)
            return row.model_copy(update={"waiting": kept}) if listed[0] else row

        self._change(session, partition, without)
        return listed[0]

    def release_overdue(self) -> int:
        """Maintenance: for an endpoint that skips gaps, release the first waiting copy of
        each stream whose gap is older than the reorder window (it arrives, and the receiver
        skips the gap); an endpoint that blocks only reports them. And every copy still
        waiting in a closed session (``_release_closed``). Returns how many were released."""
        now = self._clock()
        released = 0
        for info in self.list():
            if info.closed:
                released += self._release_closed(info)
                continue
            if not info.stuck(now, self.window):
                continue
            if not self.skip_gaps:
                log.warning("%s: session %r blocked by a gap for %.0f s (%d waiting)",
                            self.endpoint, info.session, info.waited(now), len(info.waiting))
                continue
            moved = self._without_poisoned(info)
            if moved is None:
                continue
            released += self._release(_firsts(moved.waiting))
        return released

    def _release_closed(self, info: SessionInfo) -> int:
        """Release the copies still waiting in a closed session (each is poisoned on arrival),
        as closing it did: an operator's close writes the row and then releases, and one that
        stopped in between (its process gone, a lost answer never retried) left them deferred
        with nobody to release them. Copies released and poisoned since, or gone, leave the
        list first, so a closed session costs nothing once its copies are through."""
        if not info.waiting:
            return 0
        moved = self._without_poisoned(info, gone_too=True)
        return 0 if moved is None else self._release(moved.waiting)

    def _without_poisoned(self, info: SessionInfo, *,
                          gone_too: bool = False) -> SessionInfo | None:
        """The session without the waiting copies that were released in their turn and then
        poisoned (their handler rejected them, or failed on every delivery): they wait no
        more, but their entries stay in the row (a poisoned copy commits nothing), and the
        first of a stream stands for a copy still to come - releasing it again does nothing,
        and the receiver skips only to it, so the session would never move on. None when
        the session is gone. ``gone_too``: copies whose token is gone leave as well (in a
        closed session nothing waits for them)."""
        poisoned = {(w.stream, w.sequence, w.message_id) for w in info.waiting
                    if self._poisoned_since(w, gone_too=gone_too)}
        if not poisoned:
            return info
        return self._change(info.session, info.partition, lambda row: row.model_copy(
            update={"waiting": tuple(w for w in row.waiting
                                     if (w.stream, w.sequence, w.message_id) not in poisoned)}))

    def _poisoned_since(self, waiting: Waiting, *, gone_too: bool = False) -> bool:
        """Whether the copy was released since it was set aside, then poisoned: a
        copy still set aside, released and on its way, or set aside again, is not
        (``gone_too``: nor is one whose token is gone, unless asked)."""
        token = self._courier.inbox.find(self.endpoint, waiting.message_id)
        if token is None:
            return gone_too
        return token.state is TokenState.POISONED and token.generation > waiting.generation

    def _change(self, session: str, partition: str | None,
                change: Callable[[SessionRow], SessionRow]) -> SessionInfo | None:
        """Apply ``change`` to the session's row with the partition's slot (both by
        compare-and-swap, tried again when either moved)."""
        for _ in range(_ROUNDS):
            info = self.get(session, partition)
            if info is None:
                return None
            slot = self._outbox.load(info.partition)
            if self._complete_first and self._unfinished(slot):
                # A copy set aside is in the row's waiting list from its commit, but deferred
                # only when that record finishes: finish it first, or a release now misses it.
                self._dispatcher.complete(slot, committed_by_me=False)
                continue
            row = change(info.row)
            op = write_op(info.partition, session, row, self._tables.limits, info.etag)
            try:
                self._outbox.touch_with(slot, [op])
            except ClaimLost:
                continue
            return SessionInfo(self.endpoint, info.partition, session, row, info.etag,
                               self.window)
        raise Contention(f"session {session!r} of {self.endpoint!r} kept changing")

    def _unfinished(self, slot: Slot) -> bool:
        record = slot.record
        return record is not None and not finished(
            record, self._courier.inbox.read(self.endpoint, record.attempt_id))

    def _release(self, waiting: Sequence[Waiting]) -> int:
        return sum(release(self._courier, self.endpoint, w.message_id, w.generation)
                   for w in waiting)

    def _info(self, row: Entity) -> SessionInfo:
        session = row.row_key[len(SESSION_ROW):]
        return SessionInfo(self.endpoint, row.partition_key, session,
                           decode(row.partition_key, row.properties), row.etag, self.window)


def _firsts(waiting: Sequence[Waiting]) -> tuple[Waiting, ...]:
    """The first waiting copy of each stream."""
    firsts: dict[str, Waiting] = {}
    for entry in sorted(waiting, key=lambda w: w.sequence):
        firsts.setdefault(entry.stream, entry)
    return tuple(firsts.values())
