"""Turning a message into addressed envelopes: one per destination endpoint.

A command goes to the endpoint its sender names, or to the endpoint the topology routes its type
to. An event goes to every subscriber in its topic's recipient list, each copy with its own
attempt id (and so its own inbox token).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timezone
from typing import Protocol

from bus.envelope import Envelope, payload_text
from bus.errors import RoutingError
from bus.ids import IdFactory
from bus.messages import Command, Event, Message, topic_of
from bus.naming import check_endpoint
from bus.observability import Telemetry
from bus.serialization import Serializer


class Subscribers(Protocol):
    """Who subscribes to a topic (``bus.protocol.copies.topics.Topics``, the topic files)."""

    def subscribers(self, topic: str) -> list[str]:
        """The endpoints subscribed to ``topic`` now."""
        ...


SessionOf = Callable[[str, Message], "str | None"]
"""The session key a destination's handler gives a message (None: that handler has none)."""
Sequencer = Callable[[str, str], tuple[str, int]]
"""Numbers a copy for a destination and session: its stream and sequence number."""


class Addressing:
    def __init__(self, *, source: str, routes: Mapping[str, str], topics: Subscribers,
                 serializer: Serializer, new_id: IdFactory, clock: Callable[[], float],
                 known: Collection[str] | None = None,
                 seal: Callable[[Envelope], Envelope] = lambda e: e,
                 session_of: SessionOf | None = None,
                 telemetry: Telemetry | None = None) -> None:
        self.source = source
        self.telemetry = telemetry or Telemetry()
        self._routes = routes
        self._session_of = session_of
        self._known = known
        self._topics = topics
        self._serializer = serializer
        self._new_id = new_id
        self._clock = clock
        self._seal = seal  # encrypt and sign each copy as it is made (``Sealer.seal``)

    def envelopes(self, message: Message, *, message_id: str, correlation_id: str,
                  causation_id: str | None, headers: Mapping[str, str] | None = None,
                  to: str | None = None, delay: float = 0.0,
                  ttl: float | None = None,
                  sequencer: Sequencer | None = None,
                  check_room: Callable[[str], None] | None = None,
                  attempt_ids: IdFactory | None = None) -> list[Envelope]:
        """The copies of ``message``; ``delay`` seconds > 0 schedules their delivery, ``ttl``
        seconds > 0 ends their time-to-live that long after they are due (None: never). A
        copy for a handler with sessions carries its session key and, with a ``sequencer``,
        its stream and sequence number (``bus.protocol.sessions.order``). ``check_room`` is
        called for every destination before any copy is numbered: a send it refuses takes no
        number. ``attempt_ids`` makes the copies' attempt ids (default: the addressing's, which
        name token shards; marked sends' must name none)."""
        if delay < 0:
            raise ValueError(f"delay must be 0 or more seconds, not {delay}")
        check_ttl(ttl)
        destinations, topic = self._destinations(message, to)
        if check_room is not None:
            for destination in destinations:
                check_room(destination)
        data = self._serializer.dumps(message)
        text, encoding = payload_text(data, self._serializer.text)
        now = self._clock()
        headers = dict(headers or {})
        self.telemetry.inject(headers)  # before sealing: the signature covers the headers
        sent_at = datetime.fromtimestamp(now, tz=timezone.utc)
        not_before = datetime.fromtimestamp(now + delay, tz=timezone.utc) if delay else None
        expires_at = _expiry(now + delay, ttl)
        new_attempt = attempt_ids or self._new_id
        return [
            self._seal(Envelope(
                message_id=message_id, attempt_id=new_attempt(), kind=message.message_kind,
                message_type=message.message_type, source=self.source, destination=destination,
                topic=topic, correlation_id=correlation_id, causation_id=causation_id,
                headers=dict(headers), sent_at=sent_at,
                content_type=self._serializer.content_type, payload=text,
                payload_encoding=encoding, not_before=not_before, expires_at=expires_at,
                **self._numbering(destination, message, sequencer)))
            for destination in destinations
        ]

    def destination_name(self, message: Message, to: str | None) -> str:
        return destination_name(message, to, self._routes)

    def _numbering(self, destination: str, message: Message,
                   sequencer: Sequencer | None) -> dict[str, object]:
        """The session fields of the copy for ``destination``."""
        session = self._session_of(destination, message) if self._session_of else None
        if session is None:
            return {}
        if sequencer is None:
            return {"session": session}
        stream, sequence = sequencer(destination, session)
        return {"session": session, "stream": stream, "sequence": sequence}

    def _destinations(self, message: Message, to: str | None) -> tuple[list[str], str | None]:
        if isinstance(message, Command):
            if to is None:
                to = self._routes.get(message.message_type)
            if to is None:
                raise RoutingError(
                    f"no destination for command {message.message_type}: pass to='endpoint' or "
                    "register an endpoint that handles it")
            if self._known is not None and to not in self._known:
                raise RoutingError(
                    f"unknown endpoint {to!r} for {message.message_type}: known endpoints are "
                    f"{', '.join(sorted(self._known))}; declare others with routes=")
            return [check_endpoint(to)], None
        if isinstance(message, Event):
            if to is not None:
                raise RoutingError("events are published to their topic; 'to' is for commands")
            topic = topic_of(type(message))
            return self._topics.subscribers(topic), topic
        raise TypeError(f"{type(message).__name__} is neither a Command nor an Event")


def destination_name(message: Message, to: str | None, routes: Mapping[str, str]) -> str:
    """Where ``message`` goes, for a span's name: its topic, or the endpoint it is sent or
    routed to (empty when it has none: sending it then fails)."""
    if isinstance(message, Event):
        return topic_of(type(message))
    return to or routes.get(message.message_type, "")


def check_ttl(ttl: float | None) -> None:
    """ValueError unless ``ttl`` is None (never expires) or a finite number of seconds > 0."""
    if ttl is not None and not (isinstance(ttl, (int, float)) and not isinstance(ttl, bool)
                                and math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"ttl must be a number of seconds > 0 (or a timedelta; None: the "
                         f"message never expires), not {ttl!r}")


def _expiry(due: float, ttl: float | None) -> datetime | None:
    """When a copy due at ``due`` (epoch seconds) expires; the time-to-live counts from when
    it is due, so a scheduled copy never expires before it can be delivered."""
    if ttl is None:
        return None
    try:
        return datetime.fromtimestamp(due + ttl, tz=timezone.utc)
    except (OverflowError, ValueError, OSError) as exc:
        raise ValueError(f"ttl of {ttl} seconds ends after the latest time an envelope can "
                         "carry (the year 9999)") from exc
