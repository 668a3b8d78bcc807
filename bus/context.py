"""What a handler sees: the message's metadata, its state partition, and send/publish."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from bus.addressing import Addressing, check_ttl
from bus.envelope import Envelope
from bus.errors import StateError
from bus.ids import derived_message_id
from bus.messages import Command, Event, Message, require_command, require_event
from bus.middleware import Middleware, Outgoing, sending_chain
from bus.naming import RESERVED_PREFIX
from bus.storage import Entity, EntityValue, NotFound, Refused, TableOp, Tables
from bus.storage.limits import StorageLimits, check_entity
from bus.storage.limits import check_key as check_storage_key

Row = dict[str, EntityValue]
_RESERVED_PROPERTIES = {"PartitionKey", "RowKey", "Timestamp", "etag", "odata.etag"}


def seconds(delay: float | timedelta) -> float:
    """A delay given as seconds or a timedelta, in seconds."""
    return delay.total_seconds() if isinstance(delay, timedelta) else float(delay)


def ttl_seconds(ttl: float | timedelta | None) -> float | None:
    """A time-to-live given as seconds or a timedelta, in seconds (None: the message never
    expires); ValueError unless it is more than 0 - before any middleware sees the send."""
    value = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    check_ttl(value)
    return value


def check_key(kind: str, key: str, limits: StorageLimits) -> str:
    """``key`` if it can be a partition or state key (non-empty, and a key the table service
    accepts: ``limits``), else StateError saying why."""
    if not isinstance(key, str) or not key:
        raise StateError(f"{kind} must be a non-empty string: {key!r}")
    try:
        check_storage_key(kind, key, limits)
    except Refused as exc:
        raise StateError(str(exc)) from exc
    return key


@dataclass
class SessionView:
    """``ctx.session``: the session this message belongs to, its state, and ``close``."""

    key: str
    state: dict[str, Any]
    """The session's state: read it, change it; committed with the handler's effects."""
    closing: bool = False
    sequence: int | None = None
    """This message's sequence number in its stream (None: not numbered by its sender)."""

    def close(self) -> None:
        """End the session when this handler commits: later messages of it are poisoned
        with the reason, and copies waiting for their turn are released to be poisoned."""
        self.closing = True


class Numbered(Protocol):
    """A handler call's sequence counters (``bus.protocol.sessions.order.Numbering``): they number
    its copies to sessions, and commit with its outbox record."""

    counters: dict[str, int]

    def next(self, destination: str, session: str) -> tuple[str, int]:
        """The stream and the next sequence number of a copy for ``destination``'s
        ``session``."""
        ...


class PartitionState:
    """The business state of one partition: rows addressed by key, each a dict of values.

    Reads go to Table Storage (and see this handler's own writes); writes are kept until the
    handler returns and are then committed atomically with the outbox record.
    """

    def __init__(self, tables: Tables, table: str, partition: str,
                 known: Mapping[str, Mapping[str, EntityValue] | None] | None = None) -> None:
        self._tables = tables
        self._table = table
        self.partition = partition
        # ``known``: rows already read with the claim (``Endpoint.handles(reads=)``).
        self._read: dict[str, Row | None] = {
            key: dict(row) if row is not None else None for key, row in (known or {}).items()}
        self._written: dict[str, Row | None] = {}

    def get(self, key: str) -> Row | None:
        key = self._check(key)
        if key in self._written:
            row = self._written[key]
            return dict(row) if row is not None else None
        if key not in self._read:
            try:
                entity = self._tables.get(self._table, self.partition, key)
                self._read[key] = dict(entity.properties)
            except NotFound:
                self._read[key] = None
        row = self._read[key]
        return dict(row) if row is not None else None

    def put(self, key: str, values: Mapping[str, EntityValue]) -> None:
        """Write the row ``key`` (when the handler returns). StateError for a row the table
        cannot hold: a reserved property name, too many properties, a value too large or out
        of range, the row over an entity's size (``StorageLimits``)."""
        key = self._check(key)
        bad = _RESERVED_PROPERTIES & set(values)
        if bad:
            raise StateError(f"property names {sorted(bad)} are reserved by Table Storage")
        try:
            check_entity(Entity(self.partition, key, dict(values)), self._tables.limits)
        except Refused as exc:
            raise StateError(f"state row {key!r} cannot be stored: {exc}") from exc
        self._written[key] = dict(values)

    def delete(self, key: str) -> None:
        key = self._check(key)
        self.get(key)  # a delete of a missing row would fail the whole transaction
        self._written[key] = None

    def operations(self) -> list[TableOp]:
        ops: list[TableOp] = []
        for key, row in self._written.items():
            if row is not None:
                ops.append(TableOp("replace", Entity(self.partition, key, row)))
            elif self._read.get(key) is not None:
                ops.append(TableOp("delete", Entity(self.partition, key)))
        most = self._tables.limits.transaction_operations - 1  # and the outbox slot
        if len(ops) > most:
            raise StateError(f"a handler may change at most {most} rows per message, not "
                             f"{len(ops)}")
        return ops

    def _check(self, key: str) -> str:
        check_key("state key", key, self._tables.limits)
        if key.startswith(RESERVED_PREFIX):
            raise StateError(f"state keys starting with {RESERVED_PREFIX!r} are reserved")
        return key


@dataclass
class Context:
    """Passed to every handler with the message.

    ``send`` and ``publish`` do not send anything yet: the messages are recorded in the outbox
    with the state changes and dispatched after the commit, exactly once.
    """

    endpoint: str
    envelope: Envelope
    dequeue_count: int
    state: PartitionState
    _addressing: Addressing
    _outgoing: list[Envelope]
    _sends: int = 0
    _sending: tuple[Middleware, ...] = ()
    deferrals: int = 0
    """How many times this message was deferred and released before this delivery."""
    deferred: bool = False
    """Whether the handler called ``defer``."""
    releases: list[tuple[str, str, int | None]] = field(default_factory=list)
    """``(endpoint, message id)`` of the deferred messages the handler released."""
    session: SessionView | None = None
    """The message's session (its state, ``close``) when its handler declares one."""
    _numbering: Numbered | None = None

    @property
    def message_id(self) -> str:
        return self.envelope.message_id

    @property
    def correlation_id(self) -> str:
        return self.envelope.correlation_id

    @property
    def headers(self) -> Mapping[str, str]:
        return self.envelope.headers

    def send(self, command: Command, *, to: str | None = None,
             headers: Mapping[str, str] | None = None, delay: float | timedelta = 0.0,
             ttl: float | timedelta | None = None) -> str:
        """Send ``command`` when the handler commits; ``delay`` schedules its delivery (any
        length: beyond the queue's 7-day limit the receiver puts it back until it is due).
        ``ttl`` (> 0) is its time-to-live, counted from when it is due: a copy that arrives
        later is poisoned as expired instead of handled. None: it never expires."""
        require_command(command, "ctx.send")
        return self._add(command, to, headers, delay, ttl)

    def publish(self, event: Event, *, headers: Mapping[str, str] | None = None,
                delay: float | timedelta = 0.0, ttl: float | timedelta | None = None) -> str:
        """Publish ``event`` to every subscriber when the handler commits (``delay`` and
        ``ttl``: as for ``send``; each subscriber's copy expires on its own)."""
        require_event(event, "ctx.publish")
        return self._add(event, None, headers, delay, ttl)

    def _add(self, message: Message, to: str | None, headers: Mapping[str, str] | None,
             delay: float | timedelta, ttl: float | timedelta | None) -> str:
        lifetime = ttl_seconds(ttl)
        message_id = derived_message_id(self.envelope.message_id, self._sends)
        self._sends += 1
        outgoing = Outgoing(message, message_id, self.endpoint, to, dict(headers or {}),
                            seconds(delay), self, ttl=lifetime)
        sending_chain(self._sending, self._record)(outgoing)
        return message_id

    def _record(self, outgoing: Outgoing) -> None:
        """The last sending stage: into this attempt's outbox record - the message's
        ``create`` span around it, whose context its copies carry."""
        addressing = self._addressing
        with addressing.telemetry.creating(
                addressing.destination_name(outgoing.message, outgoing.to),
                message_id=outgoing.message_id, correlation_id=self.envelope.correlation_id,
                message_type=outgoing.message.message_type):
            self._outgoing.extend(addressing.envelopes(
                outgoing.message, message_id=outgoing.message_id,
                correlation_id=self.envelope.correlation_id,
                causation_id=self.envelope.message_id, headers=outgoing.headers, to=outgoing.to,
                delay=outgoing.delay, ttl=outgoing.ttl,
                sequencer=self._numbering.next if self._numbering is not None else None))

    def defer(self) -> None:
        """Set this message aside instead of consuming it: when the handler returns, its state
        changes and sends commit as usual and the message waits, unprocessed, until it is
        released by id (``release_deferred`` or ``Bus.deferred(endpoint).release``). Record
        ``message_id`` in your state to find it again. See ``bus.protocol.outbox.deferral``.

        Not for a message in a session: its session orders it (StateError)."""
        if self.session is not None:
            raise StateError("a message in a session cannot be deferred: the session holds "
                             "back what comes after it; keep what you wait for in "
                             "ctx.session.state instead")
        self.deferred = True

    def release_deferred(self, message_id: str, *, endpoint: str | None = None,
                         deferrals: int | None = None) -> None:
        """Release a message deferred at ``endpoint`` (this one by default) once this handler
        commits; it is then delivered to its handler again. Releasing a message that is not
        deferred does nothing.

        The request is for one deferral: the ``deferrals``-th (the deferring handler's
        ``ctx.deferrals``, if you recorded it), by default the one the message is in as this
        handler runs. Once the message is released and deferred again, the request does
        nothing, however often it is repeated."""
        self.releases.append((endpoint or self.endpoint, message_id, deferrals))

    @property
    def outgoing(self) -> tuple[Envelope, ...]:
        return tuple(self._outgoing)
