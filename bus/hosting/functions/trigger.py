"""One queue-triggered delivery, adapted to the Functions host's queue rules.

The host deletes a message when the function returns, makes it visible again when it raises,
and copies it to ``<queue>-poison`` when it raises on delivery ``maxDequeueCount`` (unchanged,
without a reason, its token still live). That last rule is right for a handler that keeps
failing (the receiver poisons those itself, with the reason, before the host would) but not
for storage errors: the message is fine, the storage was not, and the bus, not the host,
should poison it with the reason. So storage errors are settled inside the function (by
``bus.hosting.settlement``, the rules every host shares), per signal (each part of a bundle
on its own), with the **delivery count** a signal has had across copies of it:
the ``deliveries`` its envelope carries (0 on a signal as sent; docs/envelope.md) plus the
host's dequeue count. With ``max`` the max delivery count (``maxDequeueCount``):

* below ``max`` and before the host's last delivery: raise, the host redelivers;
* on the host's **second-to-last** delivery: put a copy back on the queue after
  ``settlement.REQUEUE_DELAY_SECONDS``, carrying its delivery count, and return - one last delivery
  after a pause longer than the host's retry delay, for storage that is away for a while;
* at ``max`` (the copy's first delivery, or the host's last of the original): poison it the
  way the receiver poisons a failing handler (``Receiver.give_up``: the reason, the last
  error, its token poisoned), so ``python -m bus dlq`` lists and replays it, and return.

Nothing cycles: the count only grows, across copies too. Why the copy is put back one
delivery early: when the host's delete of the original fails after the function returned,
the original comes back with its dequeue count one higher. Put back on the host's last
delivery, it would come back over ``maxDequeueCount`` and the host would poison it without
invoking the function - a spurious entry while the copy is live. Put back on the
second-to-last, it comes back on the last and is invoked: a duplicate once the copy was
processed, processed if it comes first (the copy is then a duplicate), and poisoned with the
reason if storage still fails (the copy then finds its token poisoned). One entry at most;
only a second failed delete in a row brings the original back over the limit, and that
entry is then stale (token gone) or a second one of a poisoned message - harmless to replay.

Handler failures are counted the same way (the receiver gets the delivery count, not the
dequeue count), so a copy's handler is retried only for the deliveries left.

**Postponed.** The host releases a message whose function raised after host.json's
``visibilityTimeout``, one value for the whole app; a handler's retry delay (the route's
``RetryPolicy.delays``, or ``RetryAfter``) is the bus's. So the function keeps it itself: with
the message's id and pop receipt (the trigger's metadata) it makes the message visible again
after the delay (Update Message, as the host's own release does) and returns. The host's
delete then finds the pop receipt changed and lets it be - its QueueProcessor ignores a
``PopReceiptMismatch`` on delete and release, logging that "the function has modified the
message and may be expected". The message comes back after the delay with its dequeue count
one higher, so the deliveries count as with any release, and nothing is copied: a copy whose
send failed would leave two lineages of the message on a flaky network. When the function
cannot (no pop receipt, a storage error, a lease the host renewed since the invocation began,
a delay of 0) it raises, and the host releases the message as usual.

The circuit breaker (``Bus.pause``, or storage throttling) is honoured too. A pause that ends
within ``PAUSE_WAITED_OUT_SECONDS`` is waited out inside the invocation (the host renews the
message's lease while its function runs), then the message is processed: a throttling pause
of a few seconds costs no request, and puts no copy on the queue of a storage account that
is already busy. During a longer pause a delivered message is put back, carrying the
deliveries that failed before it (``deliveries``: the host counts the copy from 1 again),
with a visibility delay until the pause ends (the pause row is read at most every 5 s per
instance), so messages wait in the queue, not in the function. A copy is a send, and a send
whose answer is lost leaves two: copies put back on every delivery of a short pause would
multiply on a flaky network, each one delivered, paused and copied again.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bus.backoff import Wait
from bus.bus import Bus
from bus.envelope import carried_deliveries
from bus.groups import Gate
from bus.hosting.breaker import CircuitBreaker
from bus.hosting.functions.rounds import SharedRounds
from bus.hosting.settlement import Settlement, body_with_deliveries
from bus.protocol.delivery import Delivery, Outcome
from bus.storage import QueueMessage, Queues, StorageError

log = logging.getLogger(__name__)

PAUSE_WAITED_OUT_SECONDS = 30.0
"""The longest pause an invocation waits out before processing its message; during a longer
one the message is put back on the queue until the pause ends (module doc)."""
_SHORTEST_WAIT = 0.05
"""The least an invocation sleeps while it waits out a pause (a clock that does not move
between two reads cannot make it spin)."""


@dataclass
class _Invocation:
    """The message of one invocation, as the settlement sees it (``Leased``)."""

    body: str
    dequeue_count: int
    trace: Mapping[str, str] | None = None
    """The invocation's trace context: its signals' process spans continue it."""
    lease: QueueMessage | None = None
    """The host's lease on the message (its id and pop receipt), when the host said."""
    failure: Exception | None = None
    postponed: bool = False
    """The function made the message visible again after a handler's retry delay."""


class _FunctionsHost:
    """The Functions host's queue operations, seen from inside the function: it deletes the
    message when the function returns, releases it when the function raises (visible again
    after host.json's ``visibilityTimeout``), and poisons it on its own when the function
    raises on delivery ``maxDequeueCount``. A retry delay the host cannot give, the function
    gives itself (module doc: *postponed*)."""

    poisons_at_max = True

    def __init__(self, queues: Queues, queue: str) -> None:
        self._queues = queues
        self._queue = queue

    @staticmethod
    def delete(message: _Invocation) -> None:
        return None  # the host deletes it once the function returns

    def release(self, message: _Invocation, delay: float | None, cause: Exception) -> None:
        if not (delay and self._postponed(message, delay)):
            message.failure = cause  # raised once every part is settled: the host releases it

    def _postponed(self, message: _Invocation, delay: float) -> bool:
        """Make the message visible again ``delay`` seconds from now, on the host's lease;
        False when it cannot (no lease known, a storage error, the lease renewed by the host
        since the invocation began): the host then releases it."""
        if message.lease is None:
            return False
        try:
            self._queues.extend(self._queue, message.lease,
                                lease=min(delay, self._queues.limits.longest_delay))
        except StorageError as exc:
            log.info("%s: could not postpone a message by %g s for its handler's retry (%s); "
                     "the host releases it", self._queue, delay, exc)
            return False
        message.postponed = True
        return True


class QueueTrigger:
    """The body of an endpoint's queue-triggered function, minus the Functions types."""

    def __init__(self, bus: Bus, endpoint: str, *, max_dequeue_count: int,
                 inline_dispatch_max: int | None, in_process_tries: int = 3,
                 sleep: Callable[[float], None] = time.sleep,
                 wait: Wait | None = None,
                 gate: Callable[[], Gate] = threading.Event) -> None:
        """``sleep`` and ``wait``: the in-process retries' pause and its length, ``sleep``
        also how a short pause of the endpoint is waited out; ``gate``: what a concurrent
        invocation waits on for its shared round (``rounds``; the simulation's virtual time
        for all three)."""
        self.bus = bus
        self.endpoint = endpoint
        self._sleep = sleep
        self.receiver = bus.parts.receiver(endpoint)
        self.queue = bus.names.queue(endpoint)
        self.max_dequeue_count = max_dequeue_count
        self.breaker = CircuitBreaker(bus, endpoint, clock=bus.parts.clock)
        self.settlement: Settlement[_Invocation] = Settlement(
            bus, endpoint, _FunctionsHost(bus.storage.queues, self.queue),
            max_delivery_count=max_dequeue_count,
            inline_max=inline_dispatch_max, in_process_tries=in_process_tries, sleep=sleep,
            wait=wait, trace_of=lambda invocation: invocation.trace)
        self.rounds = SharedRounds(self.settlement, gate)

    def deliver(self, raw: bytes, dequeue_count: int,
                trace_context: Mapping[str, str] | None = None, *,
                lease: QueueMessage | None = None) -> Delivery:
        """Process one message body (already base64-decoded by the host), in a claim round
        shared with the invocations of this endpoint running at the same time (``rounds``).

        ``trace_context``: the invocation's W3C ``traceparent`` (and ``tracestate``), the
        parent of the process spans (``Settings.process_span_parent``). The worker runs a
        function in a thread that does not carry it, so it is passed explicitly. ``lease``:
        the message's id and pop receipt from the trigger's metadata (its body unused), with
        which a handler's retry delay is kept (*postponed*); without it the host's
        ``visibilityTimeout`` applies.

        Returns normally when the message may be deleted - or was postponed, and the host's
        delete finds it gone; raises to have it redelivered.
        """
        with self.bus.parts.telemetry.continued(trace_context):
            return self._deliver(raw, dequeue_count, trace_context, lease)

    def _paused_copy(self, raw: bytes, body: str, dequeue_count: int) -> str:
        """The signal to put back while the endpoint is paused, carrying the deliveries that
        already failed (this one did not run): the host counts the copy from 1 again. A
        signal that cannot carry a count (a bundle, a body that is not JSON) goes back as
        it came."""
        _, carried = carried_deliveries(raw)
        copy = body_with_deliveries(body, carried + dequeue_count - 1,
                                    self.bus.storage.queues.limits.signal_bytes)
        return body if copy is None else copy

    def _paused_for(self) -> float:
        """Seconds the endpoint stays paused once a pause ending within
        ``PAUSE_WAITED_OUT_SECONDS`` has been waited out (0: go ahead)."""
        paused = self.breaker.paused_for()
        waited = 0.0
        while paused > 0 and waited + paused <= PAUSE_WAITED_OUT_SECONDS:
            step = max(paused, _SHORTEST_WAIT)
            self._sleep(step)
            waited += step
            paused = self.breaker.paused_for()  # an operator may have paused it for longer
        return paused

    def _deliver(self, raw: bytes, dequeue_count: int,
                 trace_context: Mapping[str, str] | None,
                 lease: QueueMessage | None) -> Delivery:
        body = base64.b64encode(raw).decode("ascii")
        paused = self._paused_for()
        if paused > 0:
            queues = self.bus.storage.queues
            queues.send(self.queue, self._paused_copy(raw, body, dequeue_count),
                        delay=min(paused, queues.limits.longest_delay))
            return Delivery(Outcome.REQUEUED)
        invocation = _Invocation(body, dequeue_count, trace_context, lease)
        settled = self.rounds.settle(invocation)
        if invocation.failure is not None:
            raise invocation.failure
        # Every part has a delivery, but those that come back with a postponed message.
        assert invocation.postponed or all(s.delivery is not None for s in settled)
        deliveries = tuple(s.delivery or Delivery(Outcome.POSTPONED) for s in settled)
        if len(settled) == 1:
            return deliveries[0]
        return Delivery(Outcome.PROCESSED, parts=deliveries)
