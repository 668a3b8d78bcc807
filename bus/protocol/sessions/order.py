"""Sessions: per-key FIFO delivery with session state, exactly once, on unordered queues.

A handler that declares a session key (``Endpoint.handles(M, partition=..., session=...)``)
receives the messages of each *stream* of a session in the order their sender numbered them.
A stream is one sender (an endpoint's partition, or a client) sending to one destination and
session; its copies carry ``stream`` and ``sequence`` (1, 2, 3, ...) in the envelope.

The receiver keeps one **session row** per session in the message's state partition (row key
``~bus.session~<session key>``): the next sequence number each stream expects, the copies
that arrived ahead of their turn, the handler's session state, and whether the session is
closed. The row is read with the partition's outbox slot (one request) and written in the
same entity-group transaction as the business state and the outbox record, so the session's
progress, its state and the handler's effects commit together or not at all.

For an arriving copy of stream ``s`` with sequence ``k`` (its inbox token live), the row
decides (``plan``):

* ``k`` is the next expected: the handler runs; the commit advances the stream to ``k + 1``
  and, if ``k + 1`` is waiting, asks for its release once the commit is durable (the record's
  release requests run when it is finished: ``dispatch`` D6);
* ``k`` is ahead: the copy is set aside without running the handler - the commit adds it to
  the row's waiting list, and finishing the record defers its token (``deferral``);
* ``k`` is behind (the session moved past it: skipped as a gap) or the session is closed: the
  copy is poisoned with the reason, so it is accounted for in the poison queue.

A gap (a missing sequence number) whose first waiting successor has waited longer than the
endpoint's ``reorder_window`` blocks the session (reported: ``blocked_since``) or, with
``skip_gaps``, is skipped: the stream moves on to the lowest waiting number and the gap is
recorded in the row. A copy that comes after its number was skipped is poisoned. Maintenance
releases the first waiting copy of such a session (``overdue``), so a skip needs no further
traffic; an operator can skip or close a session by hand (``Sessions``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bus.envelope import Envelope
from bus.errors import StateError, UnreadableRecord
from bus.protocol.records import Release
from bus.storage import Entity, EntityValue, Refused, TableOp
from bus.storage.limits import StorageLimits, check_entity, check_key, split_text

SESSION_ROW = "~bus.session~"
"""Row key prefix of session rows (``~`` starts the bus's own rows: no state key can)."""
MAX_GAPS = 32
"""Skipped gaps a session row remembers (the latest ones; each is also logged)."""


SESSION_CHARS = 256
"""The longest session key."""
MAX_AHEAD = 10_000
"""How far ahead of its stream's next expected number a copy may be and still wait for its
turn; one further ahead is refused (poisoned with the reason) without moving the session, so
no copy - a sender's bug, or a producer's copy in its own stream - can make a session that
skips gaps jump past every real copy to come."""
MAX_COUNTER_CHARS = 131_072
"""Room in a partition's outbox record for its sequence counters (about a quarter of the
record's 1 MiB, two bytes a character): a counter takes its destination and session key and
``COUNTER_OVERHEAD_CHARS``. A handler partition that would number its sends in one session
more is refused (StateError) instead of making every later record of the partition too large
to commit: thousands of sessions with short keys, some 480 with the longest ones."""
COUNTER_OVERHEAD_CHARS = 16
"""A counter's characters besides its key, in the record's JSON (quotes, colon, number)."""
MAX_WAITING_PER_SOURCE = 100
"""Copies from one sender (``source``) that may wait in one session at a time; another is
refused (poisoned, to be replayed once the session has moved on), so one sender cannot fill
the session row's room that every sender's out-of-order copies share: a waiting copy takes
at most about 2.5 KB of the row's 1 MiB (a 1,024-character stream), so one sender's share is
at most about a quarter of it."""


def check_session(key: object, limits: StorageLimits) -> str:
    """``key`` if it can be a session key (a non-empty string of at most ``SESSION_CHARS``
    characters that a table key may hold), else StateError saying why."""
    if not isinstance(key, str) or not key or len(key) > SESSION_CHARS:
        raise StateError(f"a session key must be a string of 1 to {SESSION_CHARS} "
                         f"characters, not {str(key)[:80]!r}")
    try:
        check_key("session key", session_row_key(key), limits)
    except Refused as exc:
        raise StateError(str(exc)) from exc
    return key


def session_row_key(session: str) -> str:
    return SESSION_ROW + session


def stream_key(destination: str, session: str) -> str:
    """The key of a sender's counter for one destination and session (neither can hold a
    ``/``: both are table keys)."""
    return f"{destination}/{session}"


def handler_stream(endpoint: str, partition: str) -> str:
    """The stream name of a handler's sends: its endpoint and state partition."""
    return f"{endpoint}/{partition}"


def client_stream(client: str) -> str:
    """The stream name of a client's sends (``Settings.client_name``)."""
    return f"client:{client}"


def stream_of_another(envelope: Envelope) -> str | None:
    """Why a numbered copy's stream is not its sender's (a poison reason), or None: a
    client numbers in ``client:<its source>``, a handler in ``<its endpoint>/<partition>``
    - the copy's ``source`` either way. With signing on, a key's sources authenticate
    ``source``, so this binds a stream to the keys that may sign for it: a producer cannot
    take numbers in another's stream (the app's own, say)."""
    stream, source = envelope.stream, envelope.source
    if stream is None or stream == client_stream(source) or stream.startswith(f"{source}/"):
        return None
    return (f"stream {stream[:100]!r} is not its sender's ({source[:100]!r} numbers in "
            f"{client_stream(source)[:100]!r} or {source[:100]!r}/<partition>)")


class Waiting(BaseModel):
    """A copy set aside because it arrived ahead of its turn."""

    model_config = ConfigDict(frozen=True)
    stream: str
    sequence: int
    message_id: str
    generation: int
    """Its token's generation when it was set aside: the deferral a release names."""
    since: float


class Gap(BaseModel):
    """Sequence numbers a stream skipped (``first`` to ``last``), when and why."""

    model_config = ConfigDict(frozen=True)
    stream: str
    first: int
    last: int
    at: float
    by: Literal["window", "operator"]


class SessionRow(BaseModel):
    """What a session row holds (JSON in the row's string properties)."""

    model_config = ConfigDict(frozen=True)
    v: Literal[1] = 1
    streams: dict[str, int] = Field(default_factory=dict)
    """Stream -> the next sequence number it expects (1 when absent)."""
    waiting: tuple[Waiting, ...] = ()
    state: dict[str, Any] = Field(default_factory=dict)
    """The handlers' session state (``ctx.session.state``)."""
    closed_at: float | None = None
    blocked_since: float | None = None
    """Set while a gap older than the reorder window blocks the session (reported)."""
    skip: bool = False
    """Written by earlier versions for an operator's skip: every stream with copies waiting
    skips its gap (read as before; ``skip_streams`` now)."""
    skip_streams: tuple[str, ...] = ()
    """The streams an operator asked to skip past their gap (``Sessions.skip``): those that
    had copies waiting then - a later reorder in another stream waits for its turn."""
    gaps: tuple[Gap, ...] = ()
    handled: int = 0
    """Messages handled in this session."""
    updated_at: float = 0.0

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def expected(self, stream: str) -> int:
        return self.streams.get(stream, 1)

    def waiting_for(self, stream: str) -> list[Waiting]:
        return sorted((w for w in self.waiting if w.stream == stream), key=lambda w: w.sequence)

    def oldest_wait(self) -> float | None:
        return min((w.since for w in self.waiting), default=None)


# -- the decision ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Handle:
    """Run the handler; commit ``row`` (then the handler's own changes to it) with the effects
    and release ``releases`` once the commit is durable."""

    row: SessionRow
    releases: tuple[Release, ...] = ()


@dataclass(frozen=True)
class SetAside:
    """Do not run the handler: commit ``row`` (the copy added to its waiting list) and defer
    the copy's token; release ``releases`` (a waiting copy whose turn a skip made it)."""

    row: SessionRow
    releases: tuple[Release, ...] = ()


@dataclass(frozen=True)
class Refuse:
    """Poison the copy with ``reason`` (the session moved past it, or is closed)."""

    reason: str


Plan = Handle | SetAside | Refuse


@dataclass(frozen=True)
class Gaps:
    """An endpoint's rule for gaps: how long a gap may stay open, and what happens then."""

    window: float
    skip: bool


def plan(row: SessionRow, session: str, envelope: Envelope, generation: int, now: float, *,
         gaps: Gaps, endpoint: str, check_sequence: bool = True) -> Plan:
    """What to do with a copy of ``session`` whose token is live (``generation``: its
    token's). ``check_sequence`` off is the simulation's ``skip-sequence-check`` break."""
    if row.closed:
        return Refuse(f"session {session!r} was closed before this message arrived")
    stream, k = envelope.stream, envelope.sequence
    if stream is None or k is None or not check_sequence:
        return Handle(_touched(row, now))  # not numbered by its sender: in arrival order
    expected = row.expected(stream)
    if k < expected:
        return Refuse(f"sequence {k} of stream {stream!r} arrived after session {session!r} "
                      f"had moved on to {expected} (skipped as a gap)")
    clash = next((w for w in row.waiting_for(stream)
                  if w.sequence == k and w.message_id != envelope.message_id), None)
    if clash is not None:
        return Refuse(f"sequence {k} of stream {stream!r} in session {session!r} is already "
                      f"taken by message {clash.message_id}")
    crowded = _crowded(row, stream, k, expected, envelope.source) if k > expected else None
    if crowded is not None:
        return Refuse(f"sequence {k} of stream {stream[:100]!r} in session {session!r}: "
                      f"{crowded}")
    skipped = k > expected and _skipping(row, stream, now, gaps)
    if skipped:
        row, expected = _skip(row, stream, k, now), min(
            [k, *(w.sequence for w in row.waiting_for(stream))])
    if k == expected:
        advanced = _advance(row, stream, k, now)
        return Handle(advanced, _next_release(advanced, stream, k + 1, endpoint))
    entry = Waiting(stream=stream, sequence=k, message_id=envelope.message_id,
                    generation=generation, since=now)
    waiting = tuple(w for w in row.waiting if (w.stream, w.sequence) != (stream, k))
    aside = row.model_copy(update={"waiting": (*waiting, entry), "updated_at": now})
    if _overdue(aside, stream, now, gaps.window) and aside.blocked_since is None:
        aside = aside.model_copy(update={"blocked_since": now})
    # Only a skip makes a waiting copy's turn here: otherwise its predecessor's commit asked
    # for its release already, and asking again would send its signal once more.
    return SetAside(aside, _next_release(aside, stream, aside.expected(stream), endpoint)
                    if skipped else ())


def _crowded(row: SessionRow, stream: str, k: int, expected: int, source: str) -> str | None:
    """Why a copy ahead of its turn may not wait (the end of a poison reason), or None."""
    if k - expected > MAX_AHEAD:
        return (f"{k - expected} ahead of the next expected ({expected}), more than the "
                f"{MAX_AHEAD} a session waits for; replay it once the session has moved on")
    if any(w.stream == stream and w.sequence == k for w in row.waiting):
        return None  # its own place, taken again (a redelivery set aside before)
    theirs = sum(1 for w in row.waiting if _sent_by(w.stream, source))
    if theirs >= MAX_WAITING_PER_SOURCE:
        return (f"{theirs} copies from {source[:100]!r} already wait in the session for "
                f"earlier numbers (at most {MAX_WAITING_PER_SOURCE}); replay it once the "
                f"session has moved on")
    return None


def _sent_by(stream: str, source: str) -> bool:
    """Whether ``stream`` is one ``source`` numbers in (as ``stream_of_another`` holds every
    numbered copy to)."""
    return stream == client_stream(source) or stream.startswith(f"{source}/")


def _touched(row: SessionRow, now: float) -> SessionRow:
    return row.model_copy(update={"handled": row.handled + 1, "updated_at": now})


def _advance(row: SessionRow, stream: str, k: int, now: float) -> SessionRow:
    """The row once ``k`` of ``stream`` is handled: the session is not blocked (a gap that
    remains blocks it again when a copy behind it arrives), and an operator's skip stays
    asked for only while copies wait."""
    streams = {**row.streams, stream: k + 1}
    waiting = tuple(w for w in row.waiting if (w.stream, w.sequence) != (stream, k))
    skipping = tuple(s for s in row.skip_streams if any(w.stream == s for w in waiting))
    return row.model_copy(update={"streams": streams, "waiting": waiting,
                                  "blocked_since": None, "skip": row.skip and bool(waiting),
                                  "skip_streams": skipping,
                                  "handled": row.handled + 1, "updated_at": now})


def _overdue(row: SessionRow, stream: str, now: float, window: float) -> bool:
    """Whether the stream's first waiting copy has waited longer than ``window``."""
    first = row.waiting_for(stream)
    return bool(first) and now - min(w.since for w in first) >= window


def skip_requested(row: SessionRow) -> SessionRow:
    """The row once an operator asked to skip the gaps it has now: those of the streams with
    copies waiting."""
    streams = {*row.skip_streams, *(w.stream for w in row.waiting)}
    return row.model_copy(update={"skip_streams": tuple(sorted(streams))})


def _operator_skips(row: SessionRow, stream: str) -> bool:
    return row.skip or stream in row.skip_streams


def _skipping(row: SessionRow, stream: str, now: float, gaps: Gaps) -> bool:
    return _operator_skips(row, stream) or (gaps.skip and _overdue(row, stream, now, gaps.window))


def _skip(row: SessionRow, stream: str, k: int, now: float) -> SessionRow:
    """The stream moved on past its gap, to its lowest waiting number (or ``k``). A gap is
    recorded only when numbers were skipped: the lowest waiting copy may be the expected one
    itself (released in its turn and not arrived yet), and then nothing is."""
    lowest = min([k, *(w.sequence for w in row.waiting_for(stream))])
    gap = Gap(stream=stream, first=row.expected(stream), last=lowest - 1, at=now,
              by="operator" if _operator_skips(row, stream) else "window")
    gaps = (*row.gaps, gap)[-MAX_GAPS:] if gap.last >= gap.first else row.gaps
    others = any(w.stream != stream for w in row.waiting)  # an operator's skip: theirs too
    return row.model_copy(update={
        "streams": {**row.streams, stream: lowest}, "skip": row.skip and others,
        "skip_streams": tuple(s for s in row.skip_streams if s != stream),
        "blocked_since": None, "gaps": gaps, "updated_at": now})


def _next_release(row: SessionRow, stream: str, sequence: int,
                  endpoint: str) -> tuple[Release, ...]:
    """The release request for the stream's waiting copy with ``sequence``, if it waits."""
    return tuple(Release(endpoint=endpoint, message_id=w.message_id, generation=w.generation)
                 for w in row.waiting_for(stream) if w.sequence == sequence)


def closing_releases(row: SessionRow, endpoint: str) -> tuple[Release, ...]:
    """Every waiting copy of a session being closed: released, each is poisoned on arrival
    (the session is closed), so none is left deferred and unaccounted for."""
    return tuple(Release(endpoint=endpoint, message_id=w.message_id, generation=w.generation)
                 for w in row.waiting)


# -- numbering a sender's copies -------------------------------------------------------------
@dataclass
class Numbering:
    """A handler's sequence counters, as its partition's outbox slot holds them
    (``OutboxRecord.sequences``): this call's copies are numbered after them, and the new
    counters commit with the record."""

    stream: str
    counters: dict[str, int] = field(default_factory=dict)

    def next(self, destination: str, session: str) -> tuple[str, int]:
        """The stream and number of the next copy to ``destination`` in ``session``;
        StateError when it would need one counter more than the record keeps room for."""
        key = stream_key(destination, session)
        if key not in self.counters:
            self._room_for(key)
        self.counters[key] = self.counters.get(key, 0) + 1
        return self.stream, self.counters[key]

    def _room_for(self, key: str) -> None:
        taken = sum(len(k) + COUNTER_OVERHEAD_CHARS for k in self.counters)
        if taken + len(key) + COUNTER_OVERHEAD_CHARS > MAX_COUNTER_CHARS:
            raise StateError(
                f"stream {self.stream[:100]!r} numbers its sends in {len(self.counters)} "
                f"sessions already, all the counters its partition's outbox record keeps room "
                f"for ({MAX_COUNTER_CHARS} characters, docs/sessions.md); a handler partition "
                f"sends in a bounded number of sessions: partition the sender finer, or send "
                f"to this session from another partition")


# -- the row in storage ----------------------------------------------------------------------
def encode(partition: str, session: str, row: SessionRow, limits: StorageLimits) -> Entity:
    """The session row as an entity: its JSON over string properties, plus ``waiting_since``
    (the oldest waiting copy's time, 0 when none) and ``closed`` for queries. StateError when
    the session's state makes it larger than a table row holds."""
    text = row.model_dump_json()
    chunks = split_text(text, limits.property_bytes)
    properties: dict[str, EntityValue] = {
        "chunks": len(chunks), "waiting_since": row.oldest_wait() or 0.0,
        "closed": row.closed, "session": session}
    properties.update({f"r{i}": chunk for i, chunk in enumerate(chunks)})
    entity = Entity(partition, session_row_key(session), properties)
    try:
        check_entity(entity, limits)
    except Refused as exc:
        raise StateError(f"the state of session {session!r} is larger than a table row "
                         f"holds ({exc})") from exc
    return entity


def decode(partition: str, properties: Mapping[str, EntityValue] | None) -> SessionRow:
    """The row's content (a new session when there is no row), or UnreadableRecord."""
    if properties is None:
        return SessionRow()
    try:
        count = properties.get("chunks", 0)
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"chunk count {count!r}")
        text = "".join(str(properties[f"r{i}"]) for i in range(count))
        return SessionRow.model_validate(json.loads(text))
    except (KeyError, ValueError, ValidationError) as exc:
        raise UnreadableRecord(
            f"a session row of partition {partition!r} cannot be read "
            f"({str(exc).splitlines()[0]})") from exc


def write_op(partition: str, session: str, row: SessionRow, limits: StorageLimits,
             etag: str | None = None) -> TableOp:
    return TableOp("replace", encode(partition, session, row, limits), etag)


def json_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The session state as JSON keeps it: StateError for a value JSON cannot hold."""
    try:
        return dict(json.loads(json.dumps(dict(state), allow_nan=False)))
    except (TypeError, ValueError) as exc:
        raise StateError(f"session state must be JSON (str, int, float, bool, None, lists "
                         f"and dicts of them): {exc}") from exc


def counter_partition(stream: str, destination: str, session: str) -> str:
    """The send ledger partition of a client stream's counter for one destination and
    session (hashed: the three together can be longer than a key holds)."""
    digest = hashlib.sha256(f"{stream}\n{destination}\n{session}".encode()).hexdigest()
    return f"~seq~{digest[:40]}"
