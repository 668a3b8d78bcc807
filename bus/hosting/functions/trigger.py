"""One queue-triggered delivery, adapted to the Functions host's queue rules.

The host deletes a message when the function returns, makes it visible again when it raises,
and copies it to ``<queue>-poison`` when it raises on delivery ``maxDequeueCount`` (unchanged,
without a reason, its token still live). That last rule is right for a handler that keeps
failing (the receiver poisons those itself, with the reason, before the host would) but not
for storage errors: the message is fine, the storage was not, and the bus, not the host,
should poison it with the reason. So storage errors are handled here, per signal (each part
of a bundle on its own), with the **delivery count** a signal has had across copies of it:
the ``deliveries`` its envelope carries (0 on a signal as sent; docs/envelope.md) plus the
host's dequeue count. With ``max`` the max delivery count (``maxDequeueCount``):

* below ``max`` and before the host's last delivery: raise, the host redelivers;
* on the host's **second-to-last** delivery: put a copy back on the queue after
  ``REQUEUE_DELAY_SECONDS``, carrying its delivery count, and return - one last delivery
  after a pause longer than the host's retry delay, for storage that is away for a while;
* at ``max`` (the copy's first delivery, or the host's last of the original): poison it the
  way the receiver poisons a failing handler (``Receiver.give_up``: the reason, the last
  error, its token parked), so ``python -m bus dlq`` lists and replays it, and return.

Nothing cycles: the count only grows, across copies too. Why the copy is put back one
delivery early: when the host's delete of the original fails after the function returned,
the original comes back with its dequeue count one higher. Put back on the host's last
delivery, it would come back over ``maxDequeueCount`` and the host would poison it without
invoking the function - a spurious entry while the copy is live. Put back on the
second-to-last, it comes back on the last and is invoked: a duplicate once the copy was
processed, processed if it comes first (the copy is then a duplicate), and poisoned with the
reason if storage still fails (the copy then finds its token parked). One entry at most;
only a second failed delete in a row brings the original back over the limit, and that
entry is then stale (token gone) or a second one of a parked message - harmless to replay.

Handler failures are counted the same way (the receiver gets the delivery count, not the
dequeue count), so a copy's handler is retried only for the deliveries left.

The circuit breaker (``Bus.pause``) is honoured too: while the endpoint is paused a delivered
message is put back unchanged (its count included) with a visibility delay until the pause
ends (the pause row is read at most every 5 s per instance), so messages wait in the queue,
not in the function.
"""

from __future__ import annotations

import base64
import logging

from tenacity import Retrying

from bus.bus import Bus
from bus.envelope import bundle_parts, carried_deliveries, with_deliveries
from bus.hosting.breaker import CircuitBreaker
from bus.hosting.retry import transient_retries
from bus.protocol.courier import MAX_VISIBILITY_DELAY
from bus.protocol.receive import Delivery, Outcome
from bus.storage import StorageError

log = logging.getLogger(__name__)

REQUEUE_DELAY_SECONDS = 30.0
"""Visibility delay of a copy put back after storage errors (before its last delivery)."""


class QueueTrigger:
    """The body of an endpoint's queue-triggered function, minus the Functions types."""

    def __init__(self, bus: Bus, endpoint: str, *, max_dequeue_count: int,
                 inline_dispatch_max: int | None, in_process_tries: int = 3) -> None:
        self.bus = bus
        self.endpoint = endpoint
        self.receiver = bus.receiver(endpoint)
        self.queue = bus.names.queue(endpoint)
        self.max_dequeue_count = max_dequeue_count
        self.breaker = CircuitBreaker(bus, endpoint, clock=bus.clock)
        self.inline_dispatch_max = inline_dispatch_max
        self._tries = in_process_tries

    def deliver(self, raw: bytes, dequeue_count: int) -> Delivery:
        """Process one message body (already base64-decoded by the host).

        Returns normally when the message may be deleted; raises to have it redelivered.
        """
        paused = self.breaker.paused_for()
        if paused > 0:
            self.bus.storage.queues.send(self.queue, base64.b64encode(raw).decode("ascii"),
                                         delay=min(paused, MAX_VISIBILITY_DELAY))
            return Delivery(Outcome.REQUEUED)
        signals = bundle_parts(raw)
        if signals is None:
            return self._deliver(raw, dequeue_count)
        return self._deliver_parts(signals, dequeue_count)

    def _deliver_parts(self, parts: list[bytes], dequeue_count: int) -> Delivery:
        """A bundle's signals in turn, each with its own delivery count; one put back goes
        alone. The first failure is raised after the others were tried: the host redelivers
        the bundle, and the signals settled by then are duplicates on the next delivery."""
        delivered: list[Delivery] = []
        failure: Exception | None = None
        for part in parts:
            try:
                delivered.append(self._deliver(part, dequeue_count))
            except Exception as exc:  # HandlerFailed, StorageError: raised after the rest
                failure = failure or exc
        if failure is not None:
            raise failure
        return Delivery(Outcome.PROCESSED, parts=tuple(delivered))

    def _deliver(self, raw: bytes, dequeue_count: int) -> Delivery:
        """One signal, with its delivery count: carried by the copy plus the host's."""
        raw, carried = carried_deliveries(raw)
        deliveries = carried + dequeue_count
        try:
            return self._retrying()(self.receiver.deliver, raw, deliveries,
                                    inline_max=self.inline_dispatch_max)
        except StorageError as exc:
            return self._storage_trouble(raw, dequeue_count, deliveries, exc)

    def _storage_trouble(self, raw: bytes, dequeue_count: int, deliveries: int,
                         cause: StorageError) -> Delivery:
        """Raise, put a copy back, or poison: see the module's docstring."""
        if deliveries >= self.max_dequeue_count:
            return Delivery(self.receiver.give_up(raw, deliveries, cause))
        copy = with_deliveries(raw, deliveries)
        if dequeue_count < self.max_dequeue_count - 1 or copy is None:
            raise cause
        self._requeue(copy, deliveries, cause)
        return Delivery(Outcome.REQUEUED)

    def _requeue(self, copy: bytes, deliveries: int, cause: StorageError) -> None:
        body = base64.b64encode(copy).decode("ascii")
        self.bus.storage.queues.send(self.queue, body, delay=REQUEUE_DELAY_SECONDS)
        log.warning("storage errors on %d of %d deliveries of a signal at %s (last: %s); put "
                    "a copy carrying its count back on the queue, due in %.0f s",
                    deliveries, self.max_dequeue_count, self.endpoint, cause,
                    REQUEUE_DELAY_SECONDS)

    def _retrying(self) -> Retrying:
        return transient_retries(self._tries)
