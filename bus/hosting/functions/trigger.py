"""One queue-triggered delivery, adapted to the Functions host's queue rules.

The host deletes a message when the function returns, makes it visible again when it raises,
and copies it to ``<queue>-poison`` when it raises on delivery ``maxDequeueCount``. That last
rule is right for a handler that keeps failing (the receiver poisons those itself, with the
reason, before the host would) but wrong for storage trouble: the message is fine, the storage
was not. So on the last delivery a storage failure puts a fresh copy of the signal back on the
queue (its inbox token is still live, so the copy is processed exactly once) and returns.

The circuit breaker (``Bus.pause``) is honoured the same way: while the endpoint is paused a
delivered message is put back with a visibility delay until the pause ends (the pause row is
read at most every 5 s per instance), so messages wait in the queue, not in the function.
"""

from __future__ import annotations

import base64
import logging

from tenacity import Retrying

from bus.bus import Bus
from bus.hosting.breaker import CircuitBreaker
from bus.hosting.retry import transient_retries
from bus.protocol.courier import MAX_VISIBILITY_DELAY
from bus.protocol.receive import Delivery, Outcome
from bus.storage import StorageError

log = logging.getLogger(__name__)

REQUEUE_DELAY_SECONDS = 30.0
"""Visibility delay of a copy put back after storage trouble on the last delivery."""


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
        try:
            return self._retrying()(self.receiver.deliver, raw, dequeue_count,
                                    inline_max=self.inline_dispatch_max)
        except StorageError as exc:
            if dequeue_count < self.max_dequeue_count:
                raise
            self._requeue(raw, exc)
            return Delivery(Outcome.REQUEUED)

    def _requeue(self, raw: bytes, cause: StorageError) -> None:
        body = base64.b64encode(raw).decode("ascii")
        self.bus.storage.queues.send(self.queue, body, delay=REQUEUE_DELAY_SECONDS)
        log.warning("storage trouble on the last delivery of a message at %s (%s); put a "
                    "fresh copy back on the queue instead of letting the host poison it",
                    self.endpoint, cause)

    def _retrying(self) -> Retrying:
        return transient_retries(self._tries)
