"""The operator API: set-up, pausing an endpoint, poisoned messages, deferred messages, sessions,
reading state, maintenance. The CLI and the dashboard are built on it."""

from __future__ import annotations

from dataclasses import dataclass

from bus.audit import AuditRecord
from bus.context import check_key
from bus.errors import StateError
from bus.naming import RESERVED_PREFIX
from bus.observability import heartbeat
from bus.observability.heartbeat import EndpointHealth, Instance
from bus.parts import Parts
from bus.protocol import steps
from bus.protocol.outbox.deferral import Deferrals
from bus.protocol.poison.poisoned import PoisonedMessages
from bus.protocol.sessions.admin import Sessions
from bus.protocol.upkeep.sweeper import Sweeper
from bus.storage import Entity, EntityValue, NotFound, StorageError

_PAUSE_KEY = ("~bus", "~pause")  # a row key users cannot write (state keys never start with ~)


@dataclass(frozen=True)
class Pause:
    until: float  # epoch seconds
    reason: str


class Operator:
    """Look after the endpoints of ``parts`` (``Bus`` is one)."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    # -- set-up -----------------------------------------------------------------------------
    def provision(self) -> None:
        """Create every queue, table and container, and subscribe endpoints (and reader
        endpoints) to their topics.

        Idempotent: run it at every start-up (or deploy the same resources with Bicep).
        """
        parts = self.parts
        names, topology = parts.names, parts.topology
        queues, blobs, tables = parts.storage.queues, parts.storage.blobs, parts.storage.tables
        tables.create_table(names.tokens_table)
        tables.create_table(names.audit_table)
        tables.create_table(names.ledger_table)
        tables.create_table(names.instances_table)
        blobs.create_container(names.payload_container)
        blobs.create_container(names.topic_container)
        for name in topology.endpoints:
            queues.create_queue(names.queue(name))
            queues.create_queue(names.poison_queue(name))
            tables.create_table(names.state_table(name))
        for name in topology.readers:  # a reader keeps no state of the bus's
            queues.create_queue(names.queue(name))
            queues.create_queue(names.poison_queue(name))
        for topic, subscribers in topology.subscriptions.items():
            for endpoint in subscribers:
                parts.topics.subscribe(topic, endpoint)

    def pipeline(self, endpoint: str) -> list[str]:
        """The stages one delivery at ``endpoint`` goes through, outermost first, by their
        step codes (``bus.protocol.steps``, docs/protocol.md); the bracketed ones are
        middleware (yours), run in R5 around the handler."""
        ep = self.parts.topology.endpoint(endpoint)
        return steps.pipeline(tuple(m.name for m in (*self.parts.middleware, *ep.middleware)))

    # -- what the endpoints hold -------------------------------------------------------------
    def sessions(self, endpoint: str) -> Sessions:
        """The sessions of ``endpoint``: list, show, skip a gap, close
        (``bus.protocol.sessions.admin``)."""
        return self.parts.sessions(endpoint)

    def poisoned(self, endpoint: str) -> PoisonedMessages:
        """The poison queue of ``endpoint``: list, replay (exactly once; an expired message
        with ``drop_expiry=True`` to have it handled after all), purge."""
        parts = self.parts
        settler = parts.settler(endpoint)
        return PoisonedMessages(
            endpoint=parts.topology.endpoint(endpoint).name, names=parts.names,
            queues=parts.observed.queues, inbox=parts.inbox, payloads=parts.payloads,
            clock=parts.clock, new_id=parts.new_id, peek_lease=parts.settings.peek_lease_seconds,
            sealer=parts.sealer, safeguards=parts.safeguards,
            settle=settler.settle if settler is not None else None, audit=parts.audit.record,
            crash_retry_delays=parts.settings.crash_retry_delays,
            host_deliveries=parts.settings.max_delivery_count + 1)

    def deferred(self, endpoint: str) -> Deferrals:
        """The messages ``endpoint``'s handlers deferred: list, fetch by id, release."""
        return Deferrals(endpoint=self.parts.topology.endpoint(endpoint).name,
                         courier=self.parts.courier, audit=self.parts.audit.record)

    def read_state(self, endpoint: str, partition: str, key: str) -> dict[str, EntityValue] | None:
        """One state row of ``endpoint``, as its handlers' last commit left it (None: no such
        row) - for reports, tools and tests; reads only. A handler reads its own partition
        through ``ctx.state`` instead: that read is part of its claim."""
        tables = self.parts.observed.tables
        check_key("partition key", partition, tables.limits)
        check_key("state key", key, tables.limits)
        if key.startswith(RESERVED_PREFIX):
            raise StateError(f"state keys starting with {RESERVED_PREFIX!r} are reserved")
        try:
            row = tables.get(self._state_table_of(endpoint), partition, key)
        except NotFound:
            return None
        return dict(row.properties)

    # -- the circuit breaker's shared switch (see bus.hosting.breaker) ---------------------
    def pause(self, endpoint: str, seconds: float, reason: str = "") -> None:
        """Stop every worker of ``endpoint`` from consuming for ``seconds`` (they notice
        within their check interval, 5 s by default). Messages wait in the queue."""
        if seconds <= 0:
            raise ValueError("pause for a positive number of seconds (resume() ends a pause)")
        table = self._state_table_of(endpoint)
        self.parts.audit.record("pause", endpoint, {"seconds": seconds, "reason": reason})
        self.parts.observed.tables.replace(table, Entity(
            *_PAUSE_KEY, {"until": self.parts.clock() + seconds, "reason": reason}))

    def resume(self, endpoint: str) -> None:
        """End a pause of ``endpoint`` (no-op when it is not paused)."""
        table = self._state_table_of(endpoint)
        self.parts.audit.record("resume", endpoint, {})
        self.parts.observed.tables.delete(table, *_PAUSE_KEY)

    def paused(self, endpoint: str) -> Pause | None:
        """The current pause of ``endpoint``, if any (one read)."""
        try:
            row = self.parts.observed.tables.get(self._state_table_of(endpoint), *_PAUSE_KEY)
        except NotFound:
            return None
        until = row.properties.get("until")
        if not isinstance(until, (int, float)) or until <= self.parts.clock():
            return None
        return Pause(float(until), str(row.properties.get("reason", "")))

    def audit_trail(self, limit: int = 100) -> list[AuditRecord]:
        """The latest ``limit`` operator actions of the last 30 days, newest first: who
        replayed, purged, paused, resumed, released, skipped or closed what, and when
        (``bus.audit``)."""
        return self.parts.audit.recent(limit)

    # -- is anything running (bus.observability.heartbeat) ------------------------------------
    def instances(self) -> list[Instance]:
        """The processes serving endpoints, from their heartbeats (live or not; one read),
        most recently seen first (``bus.observability.heartbeat``)."""
        return heartbeat.instances(self.parts.observed.tables, self.parts.names.instances_table)

    def health(self, now: float | None = None) -> list[EndpointHealth]:
        """Per endpoint (the app's, then its readers'): its live instances at ``now`` (default:
        the clock), its queue's and poison queue's lengths (two requests an endpoint);
        ``unserved`` when messages wait and no live instance serves it."""
        parts = self.parts
        now = parts.clock() if now is None else now
        known = self.instances()
        names = [(name, False) for name in sorted(parts.topology.endpoints)]
        names += [(name, True) for name in sorted(parts.topology.readers)]
        return [EndpointHealth(
            name, reader, tuple(i.id for i in known if name in i.endpoints and i.live(now)),
            self._length(parts.names.queue(name)), self._length(parts.names.poison_queue(name)))
            for name, reader in names]

    def _length(self, queue: str) -> int | None:
        try:
            return self.parts.observed.queues.depth(queue)
        except StorageError:
            return None

    def _state_table_of(self, endpoint: str) -> str:
        return self.parts.names.state_table(self.parts.topology.endpoint(endpoint).name)

    # -- maintenance -----------------------------------------------------------------------
    def sweeper(self) -> Sweeper:
        """The orphan-cleanup rule over every endpoint (``bus.protocol.upkeep.sweeper``)."""
        parts = self.parts
        settings = parts.settings
        return Sweeper(inbox=parts.inbox, payloads=parts.payloads,
                       poison_for=parts.poison_queue, clock=parts.clock,
                       ghost_horizon=settings.ghost_horizon_seconds,
                       orphan_age=settings.orphan_age_seconds,
                       resend=parts.courier.resend,
                       release_resend=settings.release_resend_seconds,
                       outbox_for=parts.outbox,
                       pending_age=settings.pending_age_seconds,
                       mark_retention=settings.ledger_retention_seconds,
                       mark_log=parts.mark_log, safeguards=parts.safeguards)

    def flush_stats(self) -> None:
        """Write every receiver's per-minute statistics now (they are written at most every
        ``Settings.stats_flush_seconds`` otherwise): for a host that stops, and for tests."""
        for receiver in self.parts.receivers():
            receiver.flush_stats()
