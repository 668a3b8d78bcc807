"""What the dashboard reads from the bus and does to it: one place between the HTTP routes and
the bus's own operations (the same calls ``python -m bus dlq|sessions`` makes).

Readings the Endpoints page polls go through the shared ``Poller``. Reading a poison queue
leases its entries for a moment (``PoisonedMessages.entries``), and a replay or purge that runs
while another read holds them would not see them: every poison-queue operation of one endpoint
is therefore serialised in this process, and the entries read are cached like the depth, so
the Poisoned messages page and the poison counts share one read per interval.
"""

from __future__ import annotations

import threading

from bus.audit import AuditRecord
from bus.bus import Bus, Pause
from bus.errors import ConfigurationError
from bus.observability.heartbeat import Instance
from bus.operations import conversation, overview
from bus.operations.dashboard.poller import Poller, Reading
from bus.protocol.outbox.deferral import DeferredMessage
from bus.protocol.poison.poisoned import PoisonedMessage, ReplayResult
from bus.protocol.sessions.admin import SessionInfo, Sessions


class UnknownEndpoint(LookupError):
    """The app defines no such endpoint."""


class Monitor:
    """The dashboard's view of one bus."""

    def __init__(self, bus: Bus, poller: Poller) -> None:
        self.bus = bus
        self.poller = poller
        self._locks = {name: threading.Lock() for name in bus.topology.endpoints}

    @property
    def endpoints(self) -> list[str]:
        return sorted(self.bus.topology.endpoints)

    def check(self, endpoint: str) -> str:
        if endpoint not in self.bus.topology.endpoints:
            raise UnknownEndpoint(f"no endpoint {endpoint!r}: this app defines "
                                  f"{', '.join(self.endpoints) or 'none'}")
        return endpoint

    # -- polled readings ------------------------------------------------------------------
    def depth(self, endpoint: str) -> Reading[int]:
        queue = self.bus.names.queue(endpoint)
        return self.poller.get(("depth", endpoint),
                               lambda: self.bus.storage.queues.depth(queue))

    def oldest(self, endpoint: str) -> Reading[float | None]:
        """When the message at the front of the queue was put on it (a peek), or None."""
        queue = self.bus.names.queue(endpoint)
        return self.poller.get(("oldest", endpoint),
                               lambda: self.bus.storage.queues.oldest(queue))

    def poisoned(self, endpoint: str) -> Reading[list[PoisonedMessage]]:
        def read() -> list[PoisonedMessage]:
            with self._locks[endpoint]:
                return self.bus.poisoned(endpoint).entries(adopt=False)  # a read changes nothing
        return self.poller.get(("poison", endpoint), read)

    def instances(self) -> Reading[list[Instance]]:
        """Every instance's last heartbeat (one query, shared by the endpoints' rows)."""
        return self.poller.get(("instances",), self.bus.instances)

    def paused(self, endpoint: str) -> Reading[Pause | None]:
        return self.poller.get(("paused", endpoint), lambda: self.bus.paused(endpoint))

    def deferred_count(self, endpoint: str) -> Reading[int]:
        return self.poller.get(("deferred", endpoint),
                               lambda: len(self.bus.deferred(endpoint).list()))

    def scheduled_count(self, endpoint: str) -> Reading[int]:
        return self.poller.get(("scheduled", endpoint),
                               lambda: len(self.scheduled(endpoint)))

    def stats(self, endpoint: str, period: float) -> Reading[overview.EndpointStats]:
        def read() -> overview.EndpointStats:
            now = self.poller.now()  # the bus's clock where it is not the wall's (simulation)
            return overview.endpoint_stats(self.bus, endpoint, now - period, now)
        return self.poller.get(("stats", endpoint, period), read)

    # -- direct reads (one page view each) --------------------------------------------------
    def deferred(self, endpoint: str) -> list[DeferredMessage]:
        return self.bus.deferred(endpoint).list()

    def sessions(self, endpoint: str) -> tuple[list[SessionInfo], float, float]:
        """The sessions (stuck first), the time they were judged at, the reorder window."""
        found = self.bus.sessions(endpoint)
        return found.list(), found.now(), found.window

    def scheduled(self, endpoint: str) -> list[overview.ScheduledMessage]:
        return overview.scheduled(self.bus, endpoint)

    def conversation(self, id: str) -> conversation.Conversation:
        return conversation.conversation(self.bus, id)

    def audit(self, limit: int) -> list[AuditRecord]:
        return self.bus.audit_trail(limit)

    # -- actions ----------------------------------------------------------------------------
    def replay(self, endpoint: str, ids: set[str],
               drop_expiry: bool) -> dict[str, ReplayResult]:
        with self._locks[endpoint]:
            try:
                return self.bus.poisoned(endpoint).replay(ids, drop_expiry=drop_expiry)
            finally:
                self.poller.forget(("poison", endpoint), ("depth", endpoint), ("oldest", endpoint))

    def purge(self, endpoint: str, ids: set[str]) -> tuple[list[str], dict[str, str]]:
        """The ids purged, and those kept with why (``PoisonedMessages.refusals``)."""
        with self._locks[endpoint]:
            try:
                poisoned = self.bus.poisoned(endpoint)
                return poisoned.purge(ids), poisoned.refusals
            finally:
                self.poller.forget(("poison", endpoint))

    def pause(self, endpoint: str, seconds: float, reason: str) -> None:
        self.bus.pause(endpoint, seconds, reason)
        self.poller.forget(("paused", endpoint))

    def resume(self, endpoint: str) -> None:
        self.bus.resume(endpoint)
        self.poller.forget(("paused", endpoint))

    def release(self, endpoint: str, message_id: str, deferrals: int | None) -> bool:
        try:
            return self.bus.deferred(endpoint).release(message_id, deferrals=deferrals)
        finally:
            self.poller.forget(("deferred", endpoint), ("depth", endpoint))

    def skip(self, endpoint: str, session: str, partition: str | None = None) -> int:
        try:
            return self._session_admin(endpoint, session, partition).skip(session, partition)
        finally:
            self.poller.forget(("depth", endpoint))

    def close(self, endpoint: str, session: str, partition: str | None = None) -> int:
        try:
            return self._session_admin(endpoint, session, partition).close(session, partition)
        finally:
            self.poller.forget(("depth", endpoint), ("poison", endpoint))

    def _session_admin(self, endpoint: str, session: str, partition: str | None) -> Sessions:
        """The endpoint's sessions, once ``session`` is found there (AmbiguousSession when
        its key has rows in several partitions and ``partition`` is None)."""
        found = self.bus.sessions(endpoint)
        if found.get(session, partition) is None:
            raise UnknownEndpoint(f"{endpoint} has no session {session!r}")
        return found


def check_bus(bus: Bus) -> None:
    """Refuse a bus the dashboard cannot show (at start, with what to fix)."""
    if not bus.topology.endpoints:
        raise ConfigurationError("the app defines no endpoints: the dashboard shows an app's "
                                 "endpoints; pass --app with the module that defines them")
