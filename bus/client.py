"""The client API: sending and publishing from outside a handler (a script, a web app, a Spark
job), alone, many at once, or once per message id."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import as_completed
from datetime import timedelta

from tenacity import Retrying

from bus.addressing import destination_name
from bus.backoff import FIRST_WAIT, LONGEST_WAIT, backoff, transient_retries
from bus.context import seconds, ttl_seconds
from bus.envelope import Envelope
from bus.errors import NotProvisioned, SendFailed
from bus.messages import Command, Event, Message, require_command, require_event
from bus.middleware import Outgoing, SendNext, sending_chain
from bus.parts import Parts
from bus.storage import Missing


class Client:
    """Send commands and publish events through ``parts`` (``Bus`` is one)."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

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
        outgoing = self._outgoing(message, message_id or self.parts.new_id(), to, headers,
                                  delay=delay, ttl=ttl)

        def token_and_signal(out: Outgoing) -> None:
            # Room first, then numbers: a send refused for a full queue takes none.
            first = self.parts.safeguards.room_before_numbers
            self.parts.sender.send(self._envelopes(out, correlation_id, room_checked=first),
                                   room_checked=first)

        with _provisioned(), self._sending_span(outgoing, correlation_id):
            self._through_middleware(outgoing, token_and_signal)
        return outgoing.message_id

    def _sending_span(self, out: Outgoing, correlation_id: str | None,
                      ) -> contextlib.AbstractContextManager[object]:
        """A client send's span: ``send <endpoint>`` for a command, ``publish <topic>`` for
        an event; current while its copies are made, so they carry its context."""
        message = out.message
        return self.parts.telemetry.sending(
            "publish" if isinstance(message, Event) else "send",
            destination_name(message, out.to, self.parts.topology.routes),
            message_id=out.message_id,
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
        with self.parts.seams.pool(max_in_flight) as pool:
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
        return Outgoing(message, message_id, self.parts.settings.client_name, to,
                        dict(headers or {}), seconds(delay), ttl=ttl_seconds(ttl))

    def _through_middleware(self, outgoing: Outgoing, terminal: SendNext) -> None:
        sending_chain(self.parts.middleware, terminal)(outgoing)

    def send_once(self, command: Command, *, message_id: str, to: str | None = None,
                  correlation_id: str | None = None,
                  headers: Mapping[str, str] | None = None,
                  ttl: float | timedelta | None = None) -> bool:
        """Send a command unless a call with the same ``message_id`` already did.

        Safe to call again after a crash, a timeout or from a re-run job: the send ledger
        (``bus.protocol.send.ledger``) makes the message's effect happen once per message id within
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
            recorded.append(bool(retrying(self.parts.ledger.send, message_id, envelopes)))

        with _provisioned(), self._sending_span(outgoing, correlation_id):
            self._through_middleware(outgoing, ledger)
        return bool(recorded and recorded[0])

    def send_once_many(self, messages: Sequence[tuple[Command | Event, str]], *,
                       to: str | None = None, headers: Mapping[str, str] | None = None,
                       origin: str = "", ttl: float | timedelta | None = None,
                       ) -> list[bool | None]:
        """Send each command (to its owner, or ``to``) and publish each event, each unless a
        copy of its ``message_id`` went to that destination before - for many messages at
        once: a data pipeline's rows, in a few requests (``bus.protocol.send.marked``: the tokens
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
                        copies[index].extend(self._envelopes(out, None, numbered=False,
                                                             marked=True))

                self._through_middleware(
                    self._outgoing(message, message_id, target, headers, ttl=lifetime), collect)
            flat = [envelope for envelopes in copies for envelope in envelopes]
            retrying = self._send_retries()
            with self.parts.telemetry.signalling(flat):
                created = iter(retrying(self.parts.marked.send, flat, origin))
        return [any([next(created) for _ in envelopes]) if envelopes else None
                for envelopes in copies]

    def _send_retries(self) -> Retrying:
        """A client's retries of a transient storage error (``Settings.send_attempts``)."""
        return transient_retries(self.parts.settings.send_attempts,
                                 backoff(FIRST_WAIT, LONGEST_WAIT, self.parts.seams.random),
                                 self.parts.seams.sleep)

    def _creating_span(self, out: Outgoing) -> contextlib.AbstractContextManager[object]:
        """One message of a batch send: its ``create`` span."""
        message = out.message
        destination = destination_name(message, out.to, self.parts.topology.routes)
        return self.parts.telemetry.creating(destination, message_id=out.message_id,
                                       correlation_id=out.message_id,
                                       message_type=message.message_type)

    def _envelopes(self, out: Outgoing, correlation_id: str | None, *,
                   numbered: bool = True, room_checked: bool = False,
                   marked: bool = False) -> list[Envelope]:
        """The copies of a client send, as the sending middleware left it; those for handlers
        with sessions numbered in the client's streams (``bus.protocol.send.counters``) unless
        ``numbered`` is False. ``room_checked``: every destination's room is checked before
        a number is taken (QueueFull). ``marked``: for a marked send, whose tokens lie in
        the destination's shard 0 (``bus.protocol.tokens.shards``)."""
        return self.parts.addressing(self.parts.settings.client_name).envelopes(
            out.message, message_id=out.message_id,
            correlation_id=correlation_id or out.message_id, causation_id=None,
            headers=out.headers, to=out.to, delay=out.delay, ttl=out.ttl,
            sequencer=self.parts.counters.next if numbered else None,
            check_room=self.parts.courier.check_room if room_checked else None,
            attempt_ids=self.parts.new_id if marked else None)


@contextlib.contextmanager
def _provisioned() -> Iterator[None]:
    """A queue, table or container a send needs is missing: the topology is not deployed."""
    try:
        yield
    except Missing as exc:
        raise NotProvisioned(
            f"{exc}: the bus's queues, tables and containers are not there - call "
            "bus.provision() once, or deploy infra/ (docs/deploy.md)") from exc
