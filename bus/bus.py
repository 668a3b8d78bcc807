"""The Bus: one object that wires the protocol to a storage backend and a topology."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from tenacity import Retrying

from bus.addressing import Addressing, destination_name
from bus.backoff import FIRST_WAIT, LONGEST_WAIT, backoff, transient_retries
from bus.context import check_key, seconds, ttl_seconds
from bus.endpoint import Endpoint, check_middleware
from bus.envelope import Envelope
from bus.errors import ConfigurationError, NotProvisioned, SendFailed, StateError
from bus.messages import Command, Event, Message, require_command, require_event
from bus.middleware import Middleware, Outgoing, SendNext, sending_chain
from bus.naming import RESERVED_PREFIX, Names
from bus.observability import Telemetry
from bus.observability.stats import StatsBook
from bus.protocol import steps
from bus.protocol.admission import Admission, EndpointRouting, Routing
from bus.protocol.backpressure import Room
from bus.protocol.counters import Counters
from bus.protocol.courier import Courier
from bus.protocol.deadletters import DeadLetters
from bus.protocol.deferral import Deferrals
from bus.protocol.dispatch import Dispatcher
from bus.protocol.driver import OutboxDriver
from bus.protocol.handling import Handling
from bus.protocol.inbox import Inbox
from bus.protocol.ledger import Ledger
from bus.protocol.marked import MarkedSender
from bus.protocol.outbox import Outbox
from bus.protocol.payloads import Payloads
from bus.protocol.poison import PoisonQueue
from bus.protocol.poisoning import Poisoning
from bus.protocol.receive import Receiver
from bus.protocol.sealing import Sealer
from bus.protocol.send import Sender
from bus.protocol.session_admin import Sessions
from bus.protocol.sessions import check_session, client_stream
from bus.protocol.slotcache import SlotCache
from bus.protocol.sweeper import Sweeper
from bus.protocol.topics import Topics
from bus.seams import Seams
from bus.serialization import JsonSerializer, Serializer
from bus.settings import Settings
from bus.storage import Entity, EntityValue, Missing, NotFound, Storage
from bus.storage.observed import observed_storage
from bus.topology import Readers, Topology

T = TypeVar("T")
_PAUSE_KEY = ("~bus", "~pause")  # a row key users cannot write (state keys never start with ~)


@dataclass(frozen=True)
class Pause:
    until: float  # epoch seconds
    reason: str


class Bus:
    """Send, publish, receive and maintain, against one storage account.

    ``middleware`` runs around every handler and every send, outside each endpoint's own
    (``bus.middleware``). ``max_queue_depths`` bounds the queues of endpoints this app sends to
    but does not define (an endpoint's own ``max_queue_depth`` wins). ``readers``: endpoints
    hosted elsewhere (Spark jobs) and the topics each subscribes to (``bus.topology``).
    ``telemetry``: where spans and metrics go (``bus.observability``; by default the global
    OpenTelemetry providers, no-ops unless an SDK is installed). The
    simulation and tests
    that move time build a bus with other seams (clock, ids, sleeps, safeguards) through
    ``bus.testing.seamed_bus``.
    """

    def __init__(self, storage: Storage, endpoints: Sequence[Endpoint] = (), *,
                 prefix: str = "", routes: Mapping[type[Message] | str, str] | None = None,
                 settings: Settings | None = None, serializer: Serializer | None = None,
                 middleware: Sequence[Middleware] = (),
                 max_queue_depths: Mapping[str, int] | None = None,
                 readers: Readers | None = None, telemetry: Telemetry | None = None) -> None:
        self._assemble(storage, endpoints, prefix=prefix, routes=routes, settings=settings,
                       serializer=serializer, middleware=middleware,
                       max_queue_depths=max_queue_depths, seams=Seams(), readers=readers,
                       telemetry=telemetry)

    def _assemble(self, storage: Storage, endpoints: Sequence[Endpoint], *, prefix: str,
                  routes: Mapping[type[Message] | str, str] | None, settings: Settings | None,
                  serializer: Serializer | None, middleware: Sequence[Middleware],
                  max_queue_depths: Mapping[str, int] | None, seams: Seams,
                  readers: Readers | None = None, telemetry: Telemetry | None = None) -> None:
        """Wire the parts; ``seams`` are the real clock, ids and sleeps but in tests."""
        clock, new_id, sleep, gate = seams.clock, seams.new_id, seams.sleep, seams.gate
        self.middleware = check_middleware("Bus", middleware)
        self.names = Names(prefix)
        self.topology = Topology(endpoints, routes, readers)
        self.topology.check_names(self.names)
        depth_limits = self.topology.depth_limits(max_queue_depths or {})
        self.storage = storage
        """The storage as given (hosts lease and settle through it)."""
        self.telemetry = telemetry or Telemetry()
        # The protocol's own requests through a wrapper that times them, when asked (the
        # storage duration metric); ``storage`` stays what the caller gave, type included.
        if self.telemetry.storage_metrics:
            storage = observed_storage(storage, self.telemetry)
        self._storage = storage
        self.settings = settings or Settings()
        self.serializer: Serializer = serializer or JsonSerializer()
        self.clock = clock
        self.new_id = new_id
        self.safeguards = seams.safeguards
        self.topics = Topics(storage.blobs, self.names.topic_container)
        self.inbox = Inbox(storage.tables, self.names.tokens_table)
        self.payloads = Payloads(storage.blobs, self.names.payload_container,
                                 self.settings.max_payload_bytes)
        self.sealer = Sealer(self.settings.signing, self.settings.encryption)
        self._check_signing_sources()
        self.courier = Courier(
            queues=storage.queues, names=self.names, inbox=self.inbox, payloads=self.payloads,
            clock=clock, in_flight=self.settings.max_in_flight_sends,
            bundles=self.settings.signal_bundles,
            token_before_payload=self.safeguards.token_before_payload, sealer=self.sealer,
            telemetry=self.telemetry,
            room=Room(queues=storage.queues, names=self.names, clock=clock,
                      limits=depth_limits,
                      ttl=self.settings.depth_check_seconds))
        self.sender = Sender(courier=self.courier, new_id=new_id, sleep=sleep,
                              attempts=self.settings.send_attempts,
                              group=self.settings.group_sends, gate=gate,
                              fence=self.safeguards.fence_unknown_sends)
        self._receivers: dict[str, Receiver] = {}
        self._sleep = sleep
        self._random = seams.random
        self.ledger = Ledger(tables=storage.tables, table=self.names.ledger_table,
                             dispatcher_for=self._dispatcher, clock=clock, new_id=new_id,
                             safeguards=self.safeguards)
        self.counters = Counters(tables=storage.tables, table=self.names.ledger_table,
                                 stream=client_stream(self.settings.client_name),
                                 new_id=new_id)
        self.marked = MarkedSender(courier=self.courier, new_id=new_id,
                                   resign=self.sealer.resign,
                                   together=self.safeguards.marks_with_tokens,
                                   marked=self.safeguards.send_marks)

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

    # -- set-up -----------------------------------------------------------------------------
    def provision(self) -> None:
        """Create every queue, table and container, and subscribe endpoints (and reader
        endpoints) to their topics.

        Idempotent: run it at every start-up (or deploy the same resources with Bicep).
        """
        queues, blobs, tables = self.storage.queues, self.storage.blobs, self.storage.tables
        tables.create_table(self.names.tokens_table)
        tables.create_table(self.names.ledger_table)
        blobs.create_container(self.names.payload_container)
        blobs.create_container(self.names.topic_container)
        for name in self.topology.endpoints:
            queues.create_queue(self.names.queue(name))
            queues.create_queue(self.names.poison_queue(name))
            tables.create_table(self.names.state_table(name))
        for name in self.topology.readers:  # a reader keeps no state of the bus's
            queues.create_queue(self.names.queue(name))
            queues.create_queue(self.names.poison_queue(name))
        for topic, subscribers in self.topology.subscriptions.items():
            for endpoint in subscribers:
                self.topics.subscribe(topic, endpoint)

    # -- sending from outside a handler -------------------------------------------------------
    def send(self, command: Command, *, to: str | None = None, message_id: str | None = None,
             correlation_id: str | None = None, headers: Mapping[str, str] | None = None,
             delay: float | timedelta = 0.0, ttl: float | timedelta | None = None) -> str:
        """Send a command; returns its message id. ``delay`` schedules its delivery (any
        length: beyond the queue's 7-day limit the receiver puts it back until it is due).
        ``ttl`` (> 0) is its time-to-live, counted from when it is due: a copy that arrives
        later is poisoned as expired instead of handled. None: it never expires."""
        require_command(command, "bus.send")
        return self._send(command, to, message_id, correlation_id, headers, delay=delay,
                          ttl=ttl)

    def publish(self, event: Event, *, message_id: str | None = None,
                correlation_id: str | None = None,
                headers: Mapping[str, str] | None = None,
                delay: float | timedelta = 0.0, ttl: float | timedelta | None = None) -> str:
        """Publish an event to every current subscriber of its topic; returns its message id
        (``delay`` and ``ttl``: as for ``send``; each subscriber's copy expires on its own)."""
        require_event(event, "bus.publish")
        return self._send(event, None, message_id, correlation_id, headers, delay=delay,
                          ttl=ttl)

    def _send(self, message: Message, to: str | None, message_id: str | None,
              correlation_id: str | None, headers: Mapping[str, str] | None, *,
              delay: float | timedelta = 0.0, ttl: float | timedelta | None = None) -> str:
        outgoing = self._outgoing(message, message_id or self.new_id(), to, headers,
                                  delay=delay, ttl=ttl)

        def token_and_signal(out: Outgoing) -> None:
            self.sender.send(self._envelopes(out, correlation_id))

        with _provisioned(), self._sending_span(outgoing, correlation_id):
            self._through_middleware(outgoing, token_and_signal)
        return outgoing.message_id

    def _sending_span(self, out: Outgoing, correlation_id: str | None,
                      ) -> contextlib.AbstractContextManager[object]:
        """A client send's span: ``send <endpoint>`` for a command, ``publish <topic>`` for
        an event; current while its copies are made, so they carry its context."""
        message = out.message
        return self.telemetry.sending(
            "publish" if isinstance(message, Event) else "send",
            destination_name(message, out.to, self.topology.routes), message_id=out.message_id,
            correlation_id=correlation_id or out.message_id, message_type=message.message_type)

    def send_many(self, messages: Iterable[Command | Event], *, max_in_flight: int = 8,
                  to: str | None = None) -> list[str]:
        """Send each command (to its owner, or ``to``) and publish each event, up to
        ``max_in_flight`` at once, and wait for every outcome; returns the message ids in
        order. A burst never queues unbounded work in memory, and no send is fire-and-forget:
        when some fail, SendFailed says which (the others were sent).
        """
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        batch = list(messages)

        def one(message: Command | Event) -> str:
            if isinstance(message, Command):
                return self._send(message, to, None, None, None)
            return self._send(message, None, None, None, None)

        ids: dict[int, str] = {}
        errors: dict[int, Exception] = {}
        with ThreadPoolExecutor(max_workers=max_in_flight,
                                thread_name_prefix="bus-send") as pool:
            # Each send in the caller's context: its span is a child of the caller's.
            futures = {pool.submit(contextvars.copy_context().run, one, message): index
                       for index, message in enumerate(batch)}
            for future in as_completed(futures):
                index = futures[future]
                try:
                    ids[index] = future.result()
                except Exception as exc:
                    errors[index] = exc
        if errors:
            raise SendFailed(ids, errors)
        return [ids[index] for index in range(len(batch))]

    def _outgoing(self, message: Message, message_id: str, to: str | None,
                  headers: Mapping[str, str] | None, *, delay: float | timedelta = 0.0,
                  ttl: float | timedelta | None = None) -> Outgoing:
        return Outgoing(message, message_id, self.settings.client_name, to,
                        dict(headers or {}), seconds(delay), ttl=ttl_seconds(ttl))

    def _through_middleware(self, outgoing: Outgoing, terminal: SendNext) -> None:
        sending_chain(self.middleware, terminal)(outgoing)

    def send_once(self, command: Command, *, message_id: str, to: str | None = None,
                  correlation_id: str | None = None,
                  headers: Mapping[str, str] | None = None,
                  ttl: float | timedelta | None = None) -> bool:
        """Send a command unless a call with the same ``message_id`` already did.

        Safe to call again after a crash, a timeout or from a re-run job: the send ledger
        (``bus.protocol.ledger``) makes the message's effect happen once per message id within
        ``Settings.ledger_retention_seconds``. Returns True when this call recorded the message,
        False when an earlier call had (then this call finished whatever was left) or a
        middleware dropped the send.

        ``ttl``: as for ``send``, counted from the call that recorded the message (a later
        call finishing its sends does not extend it).
        """
        require_command(command, "bus.send_once")
        return self._send_once(command, to, message_id, correlation_id, headers, ttl=ttl)

    def publish_once(self, event: Event, *, message_id: str,
                     correlation_id: str | None = None,
                     headers: Mapping[str, str] | None = None,
                     ttl: float | timedelta | None = None) -> bool:
        """Publish an event unless a call with the same ``message_id`` already did (see
        ``send_once``). The subscribers are those of the first call."""
        require_event(event, "bus.publish_once")
        return self._send_once(event, None, message_id, correlation_id, headers, ttl=ttl)

    def _send_once(self, message: Message, to: str | None, message_id: str,
                   correlation_id: str | None, headers: Mapping[str, str] | None, *,
                   ttl: float | timedelta | None) -> bool:
        recorded: list[bool] = []
        outgoing = self._outgoing(message, message_id, to, headers, ttl=ttl)

        def ledger(out: Outgoing) -> None:
            # The envelopes are built once: a retry must record the same copies.
            # Not numbered: a repeated call would take a number it then does not use.
            envelopes = self._envelopes(out, correlation_id, numbered=False)
            retrying = self._send_retries()
            recorded.append(bool(retrying(self.ledger.send, message_id, envelopes)))

        with _provisioned(), self._sending_span(outgoing, correlation_id):
            self._through_middleware(outgoing, ledger)
        return bool(recorded and recorded[0])

    def send_once_many(self, messages: Sequence[tuple[Command | Event, str]], *,
                       to: str | None = None, headers: Mapping[str, str] | None = None,
                       origin: str = "", ttl: float | timedelta | None = None,
                       ) -> list[bool | None]:
        """Send each command (to its owner, or ``to``) and publish each event, each unless a
        copy of its ``message_id`` went to that destination before - for many messages at
        once: a data pipeline's rows, in a few requests (``bus.protocol.marked``: the tokens
        and their send marks 50 to a transaction, the signals bundled), where ``send_once``
        makes about five per message.

        Safe to call again after a crash or from a re-run job. Returns, per message, True when
        this call sent it (a copy of it), False when an earlier call had, None when it had no
        copy to send (an event without subscribers, a send a middleware dropped). Calls that
        give the same ``origin`` (the attempts of one job) count each other's sends as their
        own. Message ids are remembered per destination for
        ``Settings.ledger_retention_seconds`` after the message was processed; a message still
        waiting is never sent twice. ``ttl``: every message's, as for ``send``, counted from
        the call that sent its copy.
        """
        lifetime = ttl_seconds(ttl)
        for message, _ in messages:
            if not isinstance(message, (Command, Event)):
                raise TypeError(f"send_once_many sends commands and events, not "
                                f"{type(message).__name__}")
        copies: list[list[Envelope]] = [[] for _ in messages]
        with _provisioned():
            for index, (message, message_id) in enumerate(messages):
                target = to if isinstance(message, Command) else None

                def collect(out: Outgoing, index: int = index) -> None:
                    with self._creating_span(out):
                        copies[index].extend(self._envelopes(out, None, numbered=False))

                self._through_middleware(
                    self._outgoing(message, message_id, target, headers, ttl=lifetime), collect)
            flat = [envelope for envelopes in copies for envelope in envelopes]
            retrying = self._send_retries()
            with self.telemetry.signalling(flat):
                created = iter(retrying(self.marked.send, flat, origin))
        return [any([next(created) for _ in envelopes]) if envelopes else None
                for envelopes in copies]

    def _send_retries(self) -> Retrying:
        """A client's retries of a transient storage error (``Settings.send_attempts``)."""
        return transient_retries(self.settings.send_attempts,
                                 backoff(FIRST_WAIT, LONGEST_WAIT, self._random), self._sleep)

    def _creating_span(self, out: Outgoing) -> contextlib.AbstractContextManager[object]:
        """One message of a batch send: its ``create`` span."""
        message = out.message
        destination = destination_name(message, out.to, self.topology.routes)
        return self.telemetry.creating(destination, message_id=out.message_id,
                                       correlation_id=out.message_id,
                                       message_type=message.message_type)

    def _envelopes(self, out: Outgoing, correlation_id: str | None, *,
                   numbered: bool = True) -> list[Envelope]:
        """The copies of a client send, as the sending middleware left it; those for handlers
        with sessions numbered in the client's streams (``bus.protocol.counters``) unless
        ``numbered`` is False."""
        return self.addressing(self.settings.client_name).envelopes(
            out.message, message_id=out.message_id,
            correlation_id=correlation_id or out.message_id, causation_id=None,
            headers=out.headers, to=out.to, delay=out.delay, ttl=out.ttl,
            sequencer=self.counters.next if numbered else None)

    # -- receiving -------------------------------------------------------------------------
    def receiver(self, endpoint: str) -> Receiver:
        if endpoint not in self._receivers:
            self._receivers[endpoint] = self._build_receiver(self.topology.endpoint(endpoint))
        return self._receivers[endpoint]

    def outbox_driver(self, endpoint: str) -> OutboxDriver:
        """Step-by-step dispatch of ``endpoint``'s committed records (Durable activities,
        maintenance)."""
        outbox, dispatcher = self._outbox(self.topology.endpoint(endpoint).name)
        return OutboxDriver(outbox=outbox, dispatcher=dispatcher, clock=self.clock,
                            safeguards=self.safeguards)

    def _outbox(self, endpoint: str) -> tuple[Outbox, Dispatcher]:
        outbox = Outbox(self._storage.tables, self.names.state_table(endpoint))
        return outbox, self._dispatcher(outbox)

    def _dispatcher(self, outbox: Outbox) -> Dispatcher:
        return Dispatcher(courier=self.courier, outbox=outbox, new_id=self.new_id,
                          safeguards=self.safeguards, telemetry=self.telemetry)

    def admission(self, endpoint: str, routing: Routing[T]) -> Admission[T]:
        """The admission of ``endpoint``'s queue for a reader that takes copies as ``routing``
        does: the receiver's (``EndpointRouting``) and a Spark read's are built here alike."""
        return Admission(
            endpoint=endpoint, routing=routing, inbox=self.inbox, payloads=self.payloads,
            poisoning=self._poisoning(endpoint), queues=self._storage.queues,
            queue=self.names.queue(endpoint), clock=self.clock, safeguards=self.safeguards,
            sealer=self.sealer)

    def _poisoning(self, endpoint: str) -> Poisoning:
        return Poisoning(endpoint=endpoint, inbox=self.inbox,
                         poison=self.poison_queue(endpoint), clock=self.clock)

    def _build_receiver(self, endpoint: Endpoint) -> Receiver:
        outbox, dispatcher = self._outbox(endpoint.name)
        poisoning = self._poisoning(endpoint.name)
        admission = self.admission(
            endpoint.name, EndpointRouting(endpoint, self.serializer, self.inbox.limits))
        handling = Handling(
            endpoint=endpoint, tables=self._storage.tables,
            state_table=self.names.state_table(endpoint.name),
            addressing=self.addressing(endpoint.name), inbox=self.inbox, outbox=outbox,
            poisoning=poisoning,
            clock=self.clock, max_delivery_count=self.settings.max_delivery_count,
            safeguards=self.safeguards, middleware=(*self.middleware, *endpoint.middleware),
            sleep=self._sleep, random=self._random)
        return Receiver(
            admission=admission, handling=handling, poisoning=poisoning, inbox=self.inbox,
            outbox=outbox, payloads=self.payloads, dispatcher=dispatcher,
            safeguards=self.safeguards, slots=SlotCache(self.settings.slot_cache_size),
            telemetry=self.telemetry,
            parent_on_message=self.settings.process_span_parent == "message",
            stats=self._stats_book(endpoint.name))

    def _stats_book(self, endpoint: str) -> StatsBook | None:
        """Where ``endpoint``'s receiver tallies its signals (``Settings.stats_flush_seconds``)."""
        every = self.settings.stats_flush_seconds
        if every is None:
            return None
        return StatsBook(self._storage.tables, self.names.state_table(endpoint), every,
                         self.clock)

    def flush_stats(self) -> None:
        """Write every receiver's per-minute statistics now (they are written at most every
        ``Settings.stats_flush_seconds`` otherwise): for a host that stops, and for tests."""
        for receiver in self._receivers.values():
            receiver.flush_stats()

    def pipeline(self, endpoint: str) -> list[str]:
        """The stages one delivery at ``endpoint`` goes through, outermost first, by their
        step codes (``bus.protocol.steps``, docs/protocol.md); the bracketed ones are
        middleware (yours), run in R5 around the handler."""
        ep = self.topology.endpoint(endpoint)
        return steps.pipeline(tuple(m.name for m in (*self.middleware, *ep.middleware)))

    def addressing(self, source: str) -> Addressing:
        return Addressing(source=source, routes=self.topology.routes, topics=self.topics,
                          serializer=self.serializer, new_id=self.new_id, clock=self.clock,
                          known=self.topology.destinations, seal=self.sealer.seal,
                          session_of=self._session_of, telemetry=self.telemetry)

    def _session_of(self, destination: str, message: Message) -> str | None:
        """The session key the destination's handler gives ``message`` (None when that
        handler has no sessions, or the destination is not defined in this app: such copies
        are handled in arrival order)."""
        endpoint = self.topology.endpoints.get(destination)
        session = endpoint.session_of(message.message_type) if endpoint is not None else None
        if session is None:
            return None
        try:
            return check_session(session(message), self._storage.tables.limits)
        except StateError:
            raise
        except Exception as exc:
            raise StateError(f"the session function of {destination!r} for "
                             f"{message.message_type} raised {exc!r}") from exc

    def sessions(self, endpoint: str) -> Sessions:
        """The sessions of ``endpoint``: list, show, skip a gap, close
        (``bus.protocol.session_admin``)."""
        ep = self.topology.endpoint(endpoint)
        return Sessions(endpoint=ep.name, tables=self._storage.tables,
                        table=self.names.state_table(ep.name), outbox=self._outbox_of(ep.name),
                        courier=self.courier, clock=self.clock, window=ep.reorder_window,
                        skip_gaps=ep.skip_gaps)

    def dead_letters(self, endpoint: str) -> DeadLetters:
        """The poison queue of ``endpoint``: list, replay (exactly once; an expired message
        with ``drop_expiry=True`` to have it handled after all), purge."""
        return DeadLetters(endpoint=self.topology.endpoint(endpoint).name, names=self.names,
                           queues=self._storage.queues, inbox=self.inbox,
                           payloads=self.payloads, clock=self.clock, new_id=self.new_id,
                           peek_lease=self.settings.peek_lease_seconds,
                           resign=self.sealer.resign, safeguards=self.safeguards)

    def read_state(self, endpoint: str, partition: str, key: str) -> dict[str, EntityValue] | None:
        """One state row of ``endpoint``, as its handlers' last commit left it (None: no such
        row) - for reports, tools and tests; reads only. A handler reads its own partition
        through ``ctx.state`` instead: that read is part of its claim."""
        check_key("partition key", partition, self._storage.tables.limits)
        check_key("state key", key, self._storage.tables.limits)
        if key.startswith(RESERVED_PREFIX):
            raise StateError(f"state keys starting with {RESERVED_PREFIX!r} are reserved")
        try:
            row = self._storage.tables.get(self.names.state_table(
                self.topology.endpoint(endpoint).name), partition, key)
        except NotFound:
            return None
        return dict(row.properties)

    def deferred(self, endpoint: str) -> Deferrals:
        """The messages ``endpoint``'s handlers deferred: list, fetch by id, release."""
        return Deferrals(endpoint=self.topology.endpoint(endpoint).name, courier=self.courier)

    # -- the circuit breaker's shared switch (see bus.hosting.breaker) ---------------------
    def pause(self, endpoint: str, seconds: float, reason: str = "") -> None:
        """Stop every worker of ``endpoint`` from consuming for ``seconds`` (they notice
        within their check interval, 5 s by default). Messages wait in the queue."""
        if seconds <= 0:
            raise ValueError("pause for a positive number of seconds (resume() ends a pause)")
        self._storage.tables.replace(self._state_table_of(endpoint), Entity(
            *_PAUSE_KEY, {"until": self.clock() + seconds, "reason": reason}))

    def resume(self, endpoint: str) -> None:
        """End a pause of ``endpoint`` (no-op when it is not paused)."""
        self._storage.tables.delete(self._state_table_of(endpoint), *_PAUSE_KEY)

    def paused(self, endpoint: str) -> Pause | None:
        """The current pause of ``endpoint``, if any (one read)."""
        try:
            row = self._storage.tables.get(self._state_table_of(endpoint), *_PAUSE_KEY)
        except NotFound:
            return None
        until = row.properties.get("until")
        if not isinstance(until, (int, float)) or until <= self.clock():
            return None
        return Pause(float(until), str(row.properties.get("reason", "")))

    def _state_table_of(self, endpoint: str) -> str:
        return self.names.state_table(self.topology.endpoint(endpoint).name)

    def _outbox_of(self, endpoint: str) -> Outbox:
        # Any endpoint under this prefix, also one another app defines (a token's origin).
        return Outbox(self._storage.tables, self.names.state_table(endpoint))

    def poison_queue(self, endpoint: str) -> PoisonQueue:
        return PoisonQueue(self._storage.queues, self.names.poison_queue(endpoint), endpoint,
                           blobs=self._storage.blobs, container=self.payloads.container,
                           new_id=self.new_id)

    # -- maintenance -----------------------------------------------------------------------
    def sweeper(self) -> Sweeper:
        return Sweeper(inbox=self.inbox, payloads=self.payloads, poison_for=self.poison_queue,
                       clock=self.clock, ghost_horizon=self.settings.ghost_horizon_seconds,
                       orphan_age=self.settings.orphan_age_seconds,
                       resend=self.courier.resend,
                       release_resend=self.settings.release_resend_seconds,
                       outbox_for=self._outbox_of,
                       pending_age=self.settings.pending_age_seconds,
                       mark_retention=self.settings.ledger_retention_seconds,
                       safeguards=self.safeguards)


@contextlib.contextmanager
def _provisioned() -> Iterator[None]:
    """A queue, table or container a send needs is missing: the topology is not deployed."""
    try:
        yield
    except Missing as exc:
        raise NotProvisioned(
            f"{exc}: the bus's queues, tables and containers are not there - call "
            "bus.provision() once, or deploy infra/ (docs/deploy.md)") from exc
