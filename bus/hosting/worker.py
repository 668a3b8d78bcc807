"""A polling worker for one endpoint: lease, settle - the loop of a host of one's own.

It leases batches of messages and keeps their leases while they are processed
(``bus.hosting.leases``); what becomes of each signal - acknowledged, released after a delay,
poisoned - is the settlement's (``bus.hosting.settlement``), the same rules the Functions
trigger follows. As the Functions host does, a message is deleted only after its outcome is
durable and a released one becomes visible again after a delay, its dequeue count grown.

Run one worker per endpoint per process: each poll leases up to ``batch_size`` queue messages
(32, the most one receive returns; a bundle carries up to 32 signals) and processes their
signals as one round, whose independent requests go side by side
(``Settings.round_concurrency``). More loops over one queue split it into smaller rounds,
which cost more requests per message (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from tenacity import RetryCallState
from tenacity.wait import wait_base

from bus.backoff import exponential_jitter
from bus.bus import Bus
from bus.hosting.breaker import CircuitBreaker
from bus.hosting.leases import LeaseKeeper
from bus.hosting.settlement import Settlement
from bus.observability.depth import QueueDepths
from bus.storage import NotFound, QueueMessage, StorageError, Throttled, TransientError

log = logging.getLogger(__name__)


class Worker:
    def __init__(self, bus: Bus, endpoint: str, *, batch_size: int = 32,
                 retry_delay: float = 1.0, in_process_tries: int = 3,
                 sleep: Callable[[float], None] = time.sleep,
                 wait: wait_base | Callable[[RetryCallState], float] | None = None,
                 batched: bool = True, renew_leases: bool = True,
                 max_lease_renewal: float = 3600.0,
                 breaker: CircuitBreaker | None = None) -> None:
        """``renew_leases``: renew the leases of messages being processed at half their
        length, for at most ``max_lease_renewal`` seconds (``bus.hosting.leases``); the
        simulation turns it off (its clock is virtual, its leases expire on purpose)."""
        self.bus = bus
        self.receiver = bus.parts.receiver(endpoint)
        self.queue = bus.names.queue(endpoint)
        self.batch_size = batch_size
        self.retry_delay = retry_delay
        self.batched = batched
        self.outcomes: dict[str, int] = {}
        self._keeper = (LeaseKeeper(bus.storage.queues, self.queue,
                                    lease=bus.settings.lease_seconds, limit=max_lease_renewal)
                        if renew_leases else None)
        self.breaker = breaker or CircuitBreaker(bus, endpoint, clock=bus.parts.clock)
        self.settlement = Settlement(
            bus, endpoint, self, in_process_tries=in_process_tries, sleep=sleep,
            wait=wait or exponential_jitter(),
            breaker=self.breaker)
        self.depths = QueueDepths(bus.storage.queues, {endpoint: self.queue},
                                  bus.settings.queue_depth_seconds, bus.parts.clock)
        bus.parts.telemetry.watch_depths(self.depths)  # eobus.queue.depth while this worker lives

    poisons_at_max = False
    """The worker moves nothing to a poison queue on its own (``Host.poisons_at_max``)."""

    def run(self, stop: threading.Event, *, idle_min: float = 0.1,
            idle_max: float = 2.0) -> None:
        """Poll until ``stop`` is set: batch after batch while there is work, and while the
        queue is empty (or the endpoint paused, or storage away) wait ``idle_min`` seconds,
        doubling up to ``idle_max`` (the Functions host's polling rule). No message ends the
        loop: ``poll_once`` settles every outcome and survives storage errors. While it runs,
        this process's heartbeat names the endpoint (``bus.observability.heartbeat``)."""
        heartbeat = self.bus.parts.heartbeat("worker")
        with (heartbeat.serving(self.receiver.endpoint) if heartbeat is not None
              else contextlib.nullcontext()):
            idle = idle_min
            while not stop.is_set():
                if self.poll_once():
                    idle = idle_min
                    continue
                stop.wait(idle)
                idle = min(idle * 2, idle_max)

    def poll_once(self) -> int:
        """Lease one batch and process it; returns how many signals it held (a bundle holds
        several: ``bus.protocol.copies.bundles``). 0 also while the circuit breaker is open
        (``self.breaker``) and when storage could not be reached: the caller's idle back-off
        then applies, as after an empty poll."""
        try:
            if self.breaker.paused_for() > 0:
                return 0
            started = time.time_ns()
            messages = self.bus.storage.queues.receive(
                self.queue, max_messages=self.batch_size, lease=self.bus.settings.lease_seconds)
            self.bus.parts.telemetry.received(self.receiver.endpoint, len(messages), started)
        except Throttled as exc:
            self.breaker.throttled(exc)
            return 0
        except StorageError as exc:  # e.g. a pooled connection the server had closed
            log.warning("%s: could not lease messages (%s); will poll again", self.queue,
                        exc)
            return 0
        if not messages:
            return 0
        with self._keeper.keeping(messages) if self._keeper else contextlib.nullcontext():
            settled = self.settlement.settle(messages, together=self.batched)
        for result in settled:
            if result.delivery is not None:
                outcome = result.delivery.outcome.value
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return len(settled)

    @contextlib.contextmanager
    def _settling(self, message: QueueMessage) -> Iterator[QueueMessage]:
        """The message with its latest pop receipt, no renewal in between, none after."""
        if self._keeper is None:
            yield message
            return
        with self._keeper.settling(message) as current:
            yield current

    def delete(self, message: QueueMessage) -> None:
        """Every part of ``message`` is settled (``Host.delete``)."""
        with self._settling(message) as current, self.bus.parts.telemetry.settling(
                self.receiver.endpoint, "delete"):
            self._delete(current)

    def _delete(self, message: QueueMessage) -> None:
        try:
            self.bus.storage.queues.delete(self.queue, message)
        except NotFound:
            log.info("lease on %s was lost before the ack; the copy is now a duplicate",
                     message.id)
        except TransientError:
            log.info("ack of %s failed; the redelivered copy will be a duplicate", message.id)

    def release(self, message: QueueMessage, delay: float | None, cause: Exception) -> None:
        """Make ``message`` visible again after ``delay`` (the retry policy's, for a handler
        failure) or ``retry_delay`` (storage trouble). If this fails too, the lease runs out
        on its own."""
        with self._settling(message) as current, self.bus.parts.telemetry.settling(
                self.receiver.endpoint, "release"), contextlib.suppress(StorageError):
            self.bus.storage.queues.extend(
                self.queue, current, lease=self.retry_delay if delay is None else delay)
