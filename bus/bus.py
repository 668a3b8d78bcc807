"""The Bus: one object that wires the protocol to a storage backend and a topology."""

from __future__ import annotations

import random as _random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from bus.addressing import Addressing
from bus.context import seconds
from bus.endpoint import Endpoint
from bus.envelope import Envelope
from bus.hosting.retry import transient_retries
from bus.ids import IdFactory, random_id
from bus.messages import Command, Event, Message
from bus.naming import Names
from bus.protocol.courier import Courier
from bus.protocol.deadletters import DeadLetters
from bus.protocol.dispatch import Dispatcher
from bus.protocol.driver import OutboxDriver
from bus.protocol.inbox import Inbox
from bus.protocol.ledger import Ledger
from bus.protocol.outbox import Outbox
from bus.protocol.payloads import Payloads
from bus.protocol.poison import PoisonQueue
from bus.protocol.receive import Receiver
from bus.protocol.safeguards import Safeguards
from bus.protocol.send import Sender
from bus.protocol.sweeper import Sweeper
from bus.protocol.topics import Topics
from bus.retry import backoff
from bus.serialization import JsonSerializer, Serializer
from bus.settings import Settings
from bus.storage import Entity, NotFound, Storage
from bus.topology import Topology

_PAUSE_KEY = ("~bus", "~pause")  # a row key users cannot write (state keys never start with ~)


@dataclass(frozen=True)
class Pause:
    until: float  # epoch seconds
    reason: str


class Bus:
    """Send, publish, receive and maintain, against one storage account.

    ``clock``, ``new_id``, ``sleep`` and ``random`` are injectable so the simulation can make runs
    deterministic; leave them alone otherwise.
    """

    def __init__(self, storage: Storage, endpoints: Sequence[Endpoint] = (), *,
                 prefix: str = "", routes: Mapping[type[Message] | str, str] | None = None,
                 settings: Settings | None = None, serializer: Serializer | None = None,
                 clock: Callable[[], float] = time.time, new_id: IdFactory = random_id,
                 sleep: Callable[[float], None] = time.sleep,
                 safeguards: Safeguards | None = None,
                 random: Callable[[], float] = _random.random) -> None:
        self.storage = storage
        self.names = Names(prefix)
        self.topology = Topology(endpoints, routes)
        self.topology.check_names(self.names)
        self.settings = settings or Settings()
        self.serializer: Serializer = serializer or JsonSerializer()
        self.clock = clock
        self.new_id = new_id
        self.safeguards = safeguards or Safeguards()
        self.topics = Topics(storage.blobs, self.names.topic_container)
        self.inbox = Inbox(storage.tables, self.names.tokens_table)
        self.payloads = Payloads(storage.blobs, self.names.payload_container)
        self.courier = Courier(queues=storage.queues, names=self.names, inbox=self.inbox,
                               payloads=self.payloads, clock=clock)
        self._sender = Sender(courier=self.courier, new_id=new_id, sleep=sleep,
                              attempts=self.settings.send_attempts)
        self._receivers: dict[str, Receiver] = {}
        self._sleep = sleep
        self._random = random
        self.ledger = Ledger(tables=storage.tables, table=self.names.ledger_table,
                             dispatcher_for=self._dispatcher, clock=clock, new_id=new_id,
                             safeguards=self.safeguards)

    # -- set-up -----------------------------------------------------------------------------
    def provision(self) -> None:
        """Create every queue, table and container, and subscribe endpoints to their topics.

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
        for topic, subscribers in self.topology.subscriptions.items():
            for endpoint in subscribers:
                self.topics.subscribe(topic, endpoint)

    # -- sending from outside a handler -------------------------------------------------------
    def send(self, command: Command, *, to: str | None = None, message_id: str | None = None,
             correlation_id: str | None = None, headers: Mapping[str, str] | None = None,
             delay: float | timedelta = 0.0) -> str:
        """Send a command; returns its message id. ``delay`` schedules its delivery (any
        length: beyond the queue's 7-day limit the receiver puts it back until it is due)."""
        return self._send(command, to, message_id, correlation_id, headers, delay=delay)

    def publish(self, event: Event, *, message_id: str | None = None,
                correlation_id: str | None = None,
                headers: Mapping[str, str] | None = None,
                delay: float | timedelta = 0.0) -> str:
        """Publish an event to every current subscriber of its topic; returns its message id
        (``delay``: as for ``send``)."""
        return self._send(event, None, message_id, correlation_id, headers, delay=delay)

    def _send(self, message: Message, to: str | None, message_id: str | None,
              correlation_id: str | None, headers: Mapping[str, str] | None, *,
              delay: float | timedelta = 0.0) -> str:
        message_id = message_id or self.new_id()
        self._sender.send(self._envelopes(message, to, message_id, correlation_id, headers,
                                          delay=delay))
        return message_id

    def send_once(self, command: Command, *, message_id: str, to: str | None = None,
                  correlation_id: str | None = None,
                  headers: Mapping[str, str] | None = None) -> bool:
        """Send a command unless a call with the same ``message_id`` already did.

        Safe to call again after a crash, a timeout or from a re-run job: the send ledger
        (``bus.protocol.ledger``) makes the message's effect happen once per message id within
        ``Settings.ledger_retention_seconds``. Returns True when this call recorded the message,
        False when an earlier call had (then this call finished whatever was left).
        """
        return self._send_once(command, to, message_id, correlation_id, headers)

    def publish_once(self, event: Event, *, message_id: str,
                     correlation_id: str | None = None,
                     headers: Mapping[str, str] | None = None) -> bool:
        """Publish an event unless a call with the same ``message_id`` already did (see
        ``send_once``). The subscribers are those of the first call."""
        return self._send_once(event, None, message_id, correlation_id, headers)

    def _send_once(self, message: Message, to: str | None, message_id: str,
                   correlation_id: str | None, headers: Mapping[str, str] | None) -> bool:
        # The envelopes are built once: a retry must record the same copies.
        envelopes = self._envelopes(message, to, message_id, correlation_id, headers)
        retrying = transient_retries(self.settings.send_attempts,
                                     backoff(0.05, 2.0, self._random), self._sleep)
        return bool(retrying(self.ledger.send, message_id, envelopes))

    def _envelopes(self, message: Message, to: str | None, message_id: str,
                   correlation_id: str | None, headers: Mapping[str, str] | None, *,
                   delay: float | timedelta = 0.0) -> list[Envelope]:
        return self.addressing(self.settings.client_name).envelopes(
            message, message_id=message_id, correlation_id=correlation_id or message_id,
            causation_id=None, headers=headers, to=to, delay=seconds(delay))

    # -- receiving -------------------------------------------------------------------------
    def receiver(self, endpoint: str) -> Receiver:
        if endpoint not in self._receivers:
            self._receivers[endpoint] = self._build_receiver(self.topology.endpoint(endpoint))
        return self._receivers[endpoint]

    def outbox_driver(self, endpoint: str) -> OutboxDriver:
        """Step-by-step dispatch of ``endpoint``'s committed records (Durable activities,
        maintenance)."""
        outbox, dispatcher = self._outbox(self.topology.endpoint(endpoint).name)
        return OutboxDriver(outbox=outbox, dispatcher=dispatcher, clock=self.clock)

    def _outbox(self, endpoint: str) -> tuple[Outbox, Dispatcher]:
        outbox = Outbox(self.storage.tables, self.names.state_table(endpoint))
        return outbox, self._dispatcher(outbox)

    def _dispatcher(self, outbox: Outbox) -> Dispatcher:
        return Dispatcher(courier=self.courier, outbox=outbox, new_id=self.new_id,
                          safeguards=self.safeguards)

    def _build_receiver(self, endpoint: Endpoint) -> Receiver:
        table = self.names.state_table(endpoint.name)
        outbox, dispatcher = self._outbox(endpoint.name)
        return Receiver(
            endpoint=endpoint, inbox=self.inbox, outbox=outbox, payloads=self.payloads,
            dispatcher=dispatcher, poison=self.poison_queue(endpoint.name),
            addressing=self.addressing(endpoint.name), tables=self.storage.tables,
            state_table=table, serializer=self.serializer, clock=self.clock,
            max_delivery_count=self.settings.max_delivery_count, safeguards=self.safeguards,
            queues=self.storage.queues, queue=self.names.queue(endpoint.name),
            sleep=self._sleep, random=self._random)

    def addressing(self, source: str) -> Addressing:
        return Addressing(source=source, routes=self.topology.routes, topics=self.topics,
                          serializer=self.serializer, new_id=self.new_id, clock=self.clock,
                          known=self.topology.destinations)

    def dead_letters(self, endpoint: str) -> DeadLetters:
        """The poison queue of ``endpoint``: list, replay (exactly once), purge."""
        return DeadLetters(endpoint=self.topology.endpoint(endpoint).name, names=self.names,
                           queues=self.storage.queues, inbox=self.inbox,
                           payloads=self.payloads, clock=self.clock)

    # -- the circuit breaker's shared switch (see bus.hosting.breaker) ---------------------
    def pause(self, endpoint: str, seconds: float, reason: str = "") -> None:
        """Stop every worker of ``endpoint`` from consuming for ``seconds`` (they notice
        within their check interval, 5 s by default). Messages wait in the queue."""
        if seconds <= 0:
            raise ValueError("pause for a positive number of seconds (resume() ends a pause)")
        self.storage.tables.replace(self._state_table_of(endpoint), Entity(
            *_PAUSE_KEY, {"until": self.clock() + seconds, "reason": reason}))

    def resume(self, endpoint: str) -> None:
        """End a pause of ``endpoint`` (no-op when it is not paused)."""
        self.storage.tables.delete(self._state_table_of(endpoint), *_PAUSE_KEY)

    def paused(self, endpoint: str) -> Pause | None:
        """The current pause of ``endpoint``, if any (one read)."""
        try:
            row = self.storage.tables.get(self._state_table_of(endpoint), *_PAUSE_KEY)
        except NotFound:
            return None
        until = row.properties.get("until")
        if not isinstance(until, (int, float)) or until <= self.clock():
            return None
        return Pause(float(until), str(row.properties.get("reason", "")))

    def _state_table_of(self, endpoint: str) -> str:
        return self.names.state_table(self.topology.endpoint(endpoint).name)

    def poison_queue(self, endpoint: str) -> PoisonQueue:
        return PoisonQueue(self.storage.queues, self.names.poison_queue(endpoint), endpoint)

    # -- maintenance -----------------------------------------------------------------------
    def sweeper(self) -> Sweeper:
        return Sweeper(inbox=self.inbox, payloads=self.payloads, poison_for=self.poison_queue,
                       clock=self.clock, ghost_horizon=self.settings.ghost_horizon_seconds,
                       orphan_age=self.settings.orphan_age_seconds)
