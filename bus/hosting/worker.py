"""A polling worker for one endpoint: lease, process, acknowledge - the local host's loop.

It follows the Azure Functions queue trigger's rules where they matter to the protocol: a
message is deleted only after processing succeeded, a failed one becomes visible again after a
delay, and the delivery count travels with it. Transient storage errors are retried in process
(tenacity, exponential backoff with jitter) before the message is released.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

from tenacity import (
    RetryCallState,
    Retrying,
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from bus.bus import Bus
from bus.hosting.breaker import CircuitBreaker
from bus.hosting.leases import LeaseKeeper
from bus.hosting.retry import transient_retries
from bus.protocol.backpressure import QueueFull
from bus.protocol.bundles import Part, parts
from bus.protocol.receive import HandlerFailed, Incoming, Outcome
from bus.storage import NotFound, QueueMessage, StorageError, Throttled, TransientError

log = logging.getLogger(__name__)


class Worker:
    def __init__(self, bus: Bus, endpoint: str, *, batch_size: int = 16,
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
        self.receiver = bus.receiver(endpoint)
        self.queue = bus.names.queue(endpoint)
        self.batch_size = batch_size
        self.retry_delay = retry_delay
        self._tries = in_process_tries
        self._sleep = sleep
        self._wait = wait or wait_exponential_jitter(multiplier=0.05, max=2.0)
        self.batched = batched
        self.outcomes: dict[str, int] = {}
        self._keeper = (LeaseKeeper(bus.storage.queues, self.queue,
                                    lease=bus.settings.lease_seconds, limit=max_lease_renewal)
                        if renew_leases else None)
        self.breaker = breaker or CircuitBreaker(bus, endpoint, clock=bus.clock)

    def run(self, stop: threading.Event, *, idle_min: float = 0.1,
            idle_max: float = 2.0) -> None:
        """Poll until ``stop`` is set: batch after batch while there is work, and while the
        queue is empty (or the endpoint paused, or storage away) wait ``idle_min`` seconds,
        doubling up to ``idle_max`` (the Functions host's polling rule). No message ends the
        loop: ``poll_once`` settles every outcome and survives storage errors."""
        idle = idle_min
        while not stop.is_set():
            if self.poll_once():
                idle = idle_min
                continue
            stop.wait(idle)
            idle = min(idle * 2, idle_max)

    def poll_once(self) -> int:
        """Lease one batch and process it; returns how many signals it held (a bundle holds
        several: ``bus.protocol.bundles``). 0 also while the circuit breaker is open
        (``self.breaker``) and when storage could not be reached: the caller's idle back-off
        then applies, as after an empty poll."""
        try:
            if self.breaker.paused_for() > 0:
                return 0
            messages = self.bus.storage.queues.receive(
                self.queue, max_messages=self.batch_size, lease=self.bus.settings.lease_seconds)
        except Throttled as exc:
            self.breaker.throttled(exc)
            return 0
        except StorageError as exc:  # e.g. a pooled connection the server had closed
            log.warning("%s: could not lease messages (%s); will poll again", self.queue,
                        exc)
            return 0
        if not messages:
            return 0
        signals = parts(messages)  # a bundle is several signals (bus.protocol.bundles)
        with self._keeper.keeping(messages) if self._keeper else contextlib.nullcontext():
            if self.batched and len(signals) > 1:
                self.process_batch(signals)
            else:
                for part in signals:
                    self.process(part)
        return len(signals)

    def process_batch(self, signals: list[Part]) -> None:
        """Process leased signals together (``Receiver.handle_many``: fewer storage calls per
        message); a signal whose outcome is a transient error gets the one-message path with
        its in-process retries."""
        results = self.receiver.handle_many([
            Incoming(p.body, p.dequeue_count, partial(self._ack, p)) for p in signals])
        for part, result in zip(signals, results, strict=True):
            if isinstance(result, Outcome):
                self.outcomes[result.value] = self.outcomes.get(result.value, 0) + 1
            elif isinstance(result, TransientError):
                self.process(part)
            elif isinstance(result, HandlerFailed):
                log.info("handler failed (delivery %d), will retry in %g s: %s",
                         part.dequeue_count, result.delay, result)
                self._release(part, result.delay)
            elif isinstance(result, StorageError):
                self._storage_trouble(part, result)
            else:
                raise result  # a bug, as on the one-message path

    def process(self, part: Part) -> Outcome | None:
        """Process one signal (one leased message, or one part of a bundle)."""
        try:
            outcome = self._retrying()(self.receiver.handle, part.body, part.dequeue_count,
                                       lambda: self._ack(part))
        except HandlerFailed as exc:
            log.info("handler failed (delivery %d), will retry in %g s: %s",
                     part.dequeue_count, exc.delay, exc)
            self._release(part, exc.delay)
            return None
        except StorageError as exc:
            self._storage_trouble(part, exc)
            return None
        self.outcomes[outcome.value] = self.outcomes.get(outcome.value, 0) + 1
        return outcome

    def _storage_trouble(self, part: Part, exc: StorageError) -> None:
        """Release the message for a later delivery (which resumes where this one stopped)."""
        if isinstance(exc, QueueFull):
            log.info("waiting for room, releasing %s: %s", part.message.id, exc)
        else:
            log.warning("storage trouble, releasing %s: %s", part.message.id, exc)
        if isinstance(exc, Throttled):
            self.breaker.throttled(exc)
        self._release(part)

    def _retrying(self) -> Retrying:
        return transient_retries(self._tries, self._wait, self._sleep)

    @contextlib.contextmanager
    def _settling(self, message: QueueMessage) -> Iterator[QueueMessage]:
        """The message with its latest pop receipt, no renewal in between, none after."""
        if self._keeper is None:
            yield message
            return
        with self._keeper.lock:
            yield self._keeper.current(message)
            self._keeper.forget(message)

    def _ack(self, part: Part) -> None:
        """The part's outcome is durable; the message goes once all its parts are."""
        last = part.settled()
        if last or not self.bus.safeguards.whole_bundle_ack:  # off: "ack-bundle-early"
            with self._settling(part.message) as current:
                self._delete(current)

    def _delete(self, message: QueueMessage) -> None:
        try:
            self.bus.storage.queues.delete(self.queue, message)
        except NotFound:
            log.info("lease on %s was lost before the ack; the copy is now a duplicate",
                     message.id)
        except TransientError:
            log.info("ack of %s failed; the redelivered copy will be a duplicate", message.id)

    def _release(self, part: Part, delay: float | None = None) -> None:
        """Make the part's message visible again after ``delay`` (the retry policy's, for a
        handler failure) or ``retry_delay`` (storage trouble), with all its parts: those
        settled meanwhile come back as duplicates. If this fails too, the lease runs out on
        its own."""
        if not part.release():
            return  # another part of the message released it already
        with self._settling(part.message) as current, contextlib.suppress(StorageError):
            self.bus.storage.queues.extend(
                self.queue, current, lease=self.retry_delay if delay is None else delay)
