"""The parts of one bus, built once: what it stores in, its names and topology, its settings and
seams, and the protocol's pieces made from them.

``Parts`` is the one place that builds them. The client API (``bus.client.Client``), the
operator API (``bus.operator.Operator``), the hosts and the Spark jobs take what they need from
it; ``Bus`` is both APIs over one ``Parts``. Tests and the simulation build ``Parts`` with
their own seams (``bus.testing.seamed_bus``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TypeVar

from bus.addressing import Addressing
from bus.audit import AuditTrail
from bus.endpoint import Endpoint, check_middleware
from bus.errors import ConfigurationError, StateError
from bus.messages import Message
from bus.middleware import Middleware
from bus.naming import Names
from bus.observability import Telemetry
from bus.observability.heartbeat import Heartbeat, Kind
from bus.observability.stats import StatsBook
from bus.protocol.copies.backpressure import Room
from bus.protocol.copies.courier import Courier
from bus.protocol.copies.payloads import Payloads
from bus.protocol.copies.sealing import Sealer
from bus.protocol.copies.topics import Topics
from bus.protocol.outbox.dispatch import Dispatcher
from bus.protocol.outbox.driver import OutboxDriver
from bus.protocol.outbox.slot import Outbox
from bus.protocol.poison.poisoning import Poisoning
from bus.protocol.poison.queue import PoisonQueue
from bus.protocol.receive.admission import Admission, EndpointRouting, Routing
from bus.protocol.receive.handling import Handling
from bus.protocol.receive.lanes import Lanes
from bus.protocol.receive.receiver import Receiver
from bus.protocol.receive.settle import Settler
from bus.protocol.receive.slotcache import SlotCache
from bus.protocol.send.counters import Counters
from bus.protocol.send.ledger import Ledger
from bus.protocol.send.marked import MarkedSender
from bus.protocol.send.sender import Sender
from bus.protocol.sessions.admin import Sessions
from bus.protocol.sessions.order import check_session, client_stream
from bus.protocol.tokens.inbox import Inbox
from bus.protocol.tokens.marklog import MarkLog
from bus.protocol.tokens.shards import ShardedIds
from bus.seams import Seams
from bus.serialization import JsonSerializer, Serializer
from bus.settings import Settings
from bus.storage import Storage
from bus.storage.observed import observed_storage
from bus.topology import Readers, Topology

T = TypeVar("T")


class Parts:
    """The parts of one bus over ``storage``, built once (arguments as ``Bus`` takes them).

    ``seams``: the real clock, ids, sleeps and safeguards unless a test or the simulation
    gives its own (``bus.seams``). Per endpoint, the receiver is built once and kept; the
    other per-endpoint pieces (admission, outbox, poisoning, ...) are cheap and made on call.
    """

    def __init__(self, storage: Storage, endpoints: Sequence[Endpoint] = (), *,
                 prefix: str = "", routes: Mapping[type[Message] | str, str] | None = None,
                 settings: Settings | None = None, serializer: Serializer | None = None,
                 middleware: Sequence[Middleware] = (),
                 max_queue_depths: Mapping[str, int] | None = None,
                 readers: Readers | None = None, telemetry: Telemetry | None = None,
                 seams: Seams | None = None) -> None:
        seams = seams or Seams()
        self.seams = seams
        self.clock, self.new_id, self.safeguards = seams.clock, seams.new_id, seams.safeguards
        self.middleware = check_middleware("Bus", middleware)
        self.names = Names(prefix)
        self.topology = Topology(endpoints, routes, readers)
        self.topology.check_names(self.names)
        depth_limits = self.topology.depth_limits(max_queue_depths or {})
        self.storage = storage
        """The storage as given (hosts lease and settle through it)."""
        self.telemetry = telemetry or Telemetry()
        # The protocol's own requests go through a wrapper that times them when asked (the
        # storage duration metric); ``storage`` stays what the caller gave, type included.
        self.observed = (observed_storage(storage, self.telemetry)
                         if self.telemetry.storage_metrics else storage)
        """The storage the protocol's requests go through."""
        self.settings = settings or Settings()
        self._heartbeat: Heartbeat | None = None
        self._heartbeat_lock = threading.Lock()
        self.lanes = Lanes(seams.lanes, self.settings.round_concurrency)
        """Where every receiver of this bus runs its rounds' independent requests."""
        self.attempt_ids = ShardedIds(self.new_id, self.settings.token_shards, seams.shard_run)
        """Attempt ids spread over the token shards (``bus.protocol.tokens.shards``); the
        plain ``new_id`` makes every other id (marked sends' attempt ids among them)."""
        self.serializer: Serializer = serializer or JsonSerializer()
        self.topics = Topics(self.observed.blobs, self.names.topic_container)
        self.inbox = Inbox(self.observed.tables, self.names.tokens_table)
        self.payloads = Payloads(self.observed.blobs, self.names.payload_container,
                                 self.settings.max_payload_bytes)
        self.sealer = Sealer(self.settings.signing, self.settings.encryption)
        self._check_signing_sources()
        self.courier = self._courier(depth_limits)
        self.sender = Sender(courier=self.courier, new_id=self.attempt_ids, sleep=seams.sleep,
                             attempts=self.settings.send_attempts,
                             group=self.settings.group_sends, gate=seams.gate,
                             fence=self.safeguards.fence_unknown_sends)
        self.ledger = Ledger(tables=self.observed.tables, table=self.names.ledger_table,
                             dispatcher_for=self.dispatcher, clock=self.clock,
                             new_id=self.new_id, safeguards=self.safeguards)
        self.counters = Counters(tables=self.observed.tables, table=self.names.ledger_table,
                                 stream=client_stream(self.settings.client_name),
                                 new_id=self.new_id)
        self.mark_log = MarkLog(self.observed.tables, self.names.tokens_table, self.new_id)
        self.marked = MarkedSender(courier=self.courier, new_id=self.new_id,
                                   resign=self.sealer.resign, mark_log=self.mark_log,
                                   retention=self.settings.ledger_retention_seconds,
                                   together=self.safeguards.marks_with_tokens,
                                   marked=self.safeguards.send_marks,
                                   note_after=self.safeguards.note_after_signal)
        self.audit = AuditTrail(self.observed.tables, self.names.audit_table, self.clock,
                                self.new_id)
        self._receivers: dict[str, Receiver] = {}

    def _courier(self, depth_limits: Mapping[str, int]) -> Courier:
        settings = self.settings
        room = Room(queues=self.observed.queues, names=self.names, clock=self.clock,
                    limits=depth_limits,
                    ttl=settings.depth_check_seconds)
        return Courier(
            queues=self.observed.queues, names=self.names, inbox=self.inbox,
            payloads=self.payloads, clock=self.clock, in_flight=settings.max_in_flight_sends,
            bundles=settings.signal_bundles,
            token_before_payload=self.safeguards.token_before_payload, sealer=self.sealer,
            telemetry=self.telemetry, room=room)

    def _check_signing_sources(self) -> None:
        """The signing key must be allowed to sign as every source this bus sends as: its
        endpoints and ``Settings.client_name`` (else every copy it sent would be poisoned)."""
        signing = self.settings.signing
        if not signing.on:
            return
        key = signing.signer()
        ours = {*self.topology.endpoints, self.settings.client_name}
        refused = sorted(source for source in ours if not key.allows(source))
        if refused:
            raise ConfigurationError(
                f"the signing key {key.key_id!r} may not sign for {', '.join(refused)}, which "
                f"this app sends as: add them to its sources (BUS_SIGNING_SOURCES__"
                f"{key.key_id}) or sign with a key for any source (docs/signing.md)")

    # -- per endpoint ------------------------------------------------------------------------
    def receiver(self, endpoint: str) -> Receiver:
        """``endpoint``'s receiver (built on first use, then kept: it remembers its commits)."""
        if endpoint not in self._receivers:
            self._receivers[endpoint] = self._build_receiver(self.topology.endpoint(endpoint))
        return self._receivers[endpoint]

    def receivers(self) -> list[Receiver]:
        """The receivers built so far."""
        return list(self._receivers.values())

    def outbox(self, endpoint: str) -> Outbox:
        """The outbox slots of ``endpoint``: any endpoint under this prefix, also one another
        app defines (a token's origin)."""
        return Outbox(self.observed.tables, self.names.state_table(endpoint),
                      reserve_growth=self.safeguards.reserve_record_growth)

    def dispatcher(self, outbox: Outbox) -> Dispatcher:
        return Dispatcher(courier=self.courier, outbox=outbox, new_id=self.attempt_ids,
                          safeguards=self.safeguards, telemetry=self.telemetry)

    def outbox_driver(self, endpoint: str) -> OutboxDriver:
        """Step-by-step dispatch of ``endpoint``'s committed records (Durable activities,
        maintenance)."""
        outbox = self.outbox(self.topology.endpoint(endpoint).name)
        return OutboxDriver(outbox=outbox, dispatcher=self.dispatcher(outbox), clock=self.clock,
                            safeguards=self.safeguards)

    def admission(self, endpoint: str, routing: Routing[T], *,
                  expire_early: bool = True) -> Admission[T]:
        """The admission of ``endpoint``'s queue for a reader that takes copies as ``routing``
        does: the receiver's (``EndpointRouting``; it checks expiry after its claim:
        ``expire_early=False``) and a Spark read's are built here alike."""
        return Admission(
            endpoint=endpoint, routing=routing, inbox=self.inbox, payloads=self.payloads,
            poisoning=self.poisoning(endpoint), queues=self.observed.queues,
            queue=self.names.queue(endpoint), clock=self.clock, safeguards=self.safeguards,
            sealer=self.sealer, expire_early=expire_early)

    def sessions(self, endpoint: str) -> Sessions:
        """The sessions of ``endpoint``, as an operator acts on them
        (``bus.protocol.sessions.admin``)."""
        ep = self.topology.endpoint(endpoint)
        outbox = self.outbox(ep.name)
        return Sessions(endpoint=ep.name, tables=self.observed.tables,
                        table=self.names.state_table(ep.name), outbox=outbox,
                        courier=self.courier, clock=self.clock, window=ep.reorder_window,
                        skip_gaps=ep.skip_gaps, dispatcher=self.dispatcher(outbox),
                        safeguards=self.safeguards, audit=self.audit.record)

    def settler(self, endpoint: str) -> Settler | None:
        """What completes a message's unfinished record before a purge deletes its token
        (``bus.protocol.receive.settle``); None for an endpoint with no handlers here."""
        ep = self.topology.endpoint(endpoint)
        if not ep.routes:
            return None
        outbox = self.outbox(ep.name)
        return Settler(endpoint=ep, routing=EndpointRouting(ep, self.serializer,
                                                            self.inbox.limits),
                       payloads=self.payloads, sealer=self.sealer, inbox=self.inbox,
                       outbox=outbox, dispatcher=self.dispatcher(outbox),
                       sessions=self.sessions(ep.name),
                       complete=self.safeguards.settle_before_purge)

    def poisoning(self, endpoint: str) -> Poisoning:
        return Poisoning(endpoint=endpoint, inbox=self.inbox,
                         poison=self.poison_queue(endpoint), clock=self.clock)

    def poison_queue(self, endpoint: str) -> PoisonQueue:
        return PoisonQueue(self.observed.queues, self.names.poison_queue(endpoint), endpoint,
                           blobs=self.observed.blobs, container=self.payloads.container,
                           new_id=self.new_id)

    def addressing(self, source: str) -> Addressing:
        """Where what ``source`` sends goes, and the copies it makes."""
        return Addressing(source=source, routes=self.topology.routes, topics=self.topics,
                          serializer=self.serializer, new_id=self.attempt_ids, clock=self.clock,
                          known=self.topology.destinations, seal=self.sealer.seal,
                          session_of=self._session_of, telemetry=self.telemetry)

    def heartbeat(self, kind: Kind) -> Heartbeat | None:
        """This process's heartbeat (``bus.observability.heartbeat``): one per ``Bus``, of the kind
        first asked for; None when ``Settings.heartbeat_seconds`` is None."""
        every = self.settings.heartbeat_seconds
        if every is None:
            return None
        with self._heartbeat_lock:
            if self._heartbeat is None:
                self._heartbeat = Heartbeat(self.observed.tables, self.names.instances_table,
                                            kind, every, self.clock)
            return self._heartbeat

    def stats_book(self, endpoint: str) -> StatsBook | None:
        """Where ``endpoint``'s receiver tallies its signals (``Settings.stats_flush_seconds``)."""
        every = self.settings.stats_flush_seconds
        if every is None:
            return None
        return StatsBook(self.observed.tables, self.names.state_table(endpoint), every,
                         self.clock)

    def _build_receiver(self, endpoint: Endpoint) -> Receiver:
        outbox = self.outbox(endpoint.name)
        poisoning = self.poisoning(endpoint.name)
        routing = EndpointRouting(endpoint, self.serializer, self.inbox.limits,
                                  refuse_reserved=self.safeguards.refuse_reserved_keys)
        admission = self.admission(endpoint.name, routing,
                                   expire_early=not self.safeguards.expire_after_claim)
        handling = Handling(
            endpoint=endpoint, tables=self.observed.tables,
            state_table=self.names.state_table(endpoint.name),
            addressing=self.addressing(endpoint.name), inbox=self.inbox, outbox=outbox,
            poisoning=poisoning,
            clock=self.clock, max_delivery_count=self.settings.max_delivery_count,
            safeguards=self.safeguards, middleware=(*self.middleware, *endpoint.middleware),
            sleep=self.seams.sleep, random=self.seams.random)
        return Receiver(
            admission=admission, handling=handling, poisoning=poisoning, inbox=self.inbox,
            outbox=outbox, payloads=self.payloads, dispatcher=self.dispatcher(outbox),
            safeguards=self.safeguards, slots=SlotCache(self.settings.slot_cache_size),
            lanes=self.lanes, telemetry=self.telemetry,
            parent_on_message=self.settings.process_span_parent == "message",
            stats=self.stats_book(endpoint.name))

    def _session_of(self, destination: str, message: Message) -> str | None:
        """The session key the destination's handler gives ``message`` (None when that
        handler has no sessions, or the destination is not defined in this app: such copies
        are handled in arrival order)."""
        endpoint = self.topology.endpoints.get(destination)
        session = endpoint.session_of(message.message_type) if endpoint is not None else None
        if session is None:
            return None
        try:
            return check_session(session(message), self.observed.tables.limits)
        except StateError:
            raise
        except Exception as exc:
            raise StateError(f"the session function of {destination!r} for "
                             f"{message.message_type} raised {exc!r}") from exc
