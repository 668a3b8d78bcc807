"""Settling leased queue messages: one set of rules for every host.

Hosts lease queue messages their own way - the polling worker (``bus.hosting.worker``) asks
the queue service; under Azure Functions the host leases them, deletes a message when the
function returns and releases it when the function raises (``bus.hosting.functions``). Both
hand what they leased to a ``Settlement``, which (the host's part around the receiver's R1-R8,
``bus.protocol.steps``):

* **split**: takes bundles apart (``bus.protocol.copies.bundles``): each part is settled as the
  signal it carries, and the queue message is deleted once every part is;
* **count**: counts each signal's **deliveries** across copies of it: the ``deliveries`` its
  envelope carries (a copy put back by *settle* below; docs/envelope.md) plus the host's
  dequeue count;
* **receive**: has the receiver process the signals together (``Receiver.receive``), retrying
  transient storage errors in process (tenacity, exponential backoff with jitter);
* **settle**: turns each result into queue operations, with ``max`` the max delivery count:

   ============================================  =========================================
   result                                        queue operations
   ============================================  =========================================
   an outcome (processed, duplicate, poisoned,   acknowledged (the receiver calls the ack
   already poisoned, expired, deferred,          once the outcome is durable)
   scheduled)
   the handler failed, deliveries left           released: visible again after the route's
                                                 retry delay
   a storage error                               released after the host's retry delay
   ============================================  =========================================

   and, for a host that moves a message failing on its last delivery to a poison queue of its
   own (the Functions host, whose entry would have no reason and leave the token live):

   ============================================  =========================================
   storage error on the host's second-to-last    a copy carrying its delivery count put
   delivery                                      back on the queue, the message acknowledged
   storage error at ``max`` deliveries           poisoned with the reason and the last error
                                                 (``Receiver.give_up``), acknowledged
   ============================================  =========================================

A host that poisons nothing on its own (the polling worker) never gives a message up for
storage errors: the message is fine, storage was not, and it is tried again until storage
answers. A handler that fails on its last delivery is poisoned by the receiver itself, on
every host.

Why a copy is put back one delivery early is explained in ``bus.hosting.functions.trigger``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Generic, Protocol, TypeVar

from bus.backoff import Wait, transient_retries
from bus.bus import Bus
from bus.envelope import carried_deliveries, with_deliveries
from bus.errors import QueueFull
from bus.hosting.breaker import CircuitBreaker
from bus.protocol.copies.bundles import Leased, M, Part, parts
from bus.protocol.delivery import Delivery, HandlerFailed, Incoming, Outcome
from bus.storage import StorageError, Throttled, TransientError

log = logging.getLogger(__name__)

REQUEUE_DELAY_SECONDS = 30.0
"""Visibility delay of a copy put back after storage errors (before its last delivery)."""


L_contra = TypeVar("L_contra", bound=Leased, contravariant=True)


def _no_trace(message: Leased) -> Mapping[str, str] | None:
    return None


class Host(Protocol[L_contra]):
    """The queue operations of the host that leased the messages."""

    @property
    def poisons_at_max(self) -> bool:
        """Whether the host moves a message that fails on its last delivery to a poison
        queue of its own (without a reason, its token live): the Functions host does, the
        polling worker does not."""
        ...

    def delete(self, message: L_contra) -> None:
        """Every part of ``message`` is settled: it may go."""
        ...

    def release(self, message: L_contra, delay: float | None, cause: Exception) -> None:
        """Make ``message`` visible again after ``delay`` seconds (None: the host's own
        retry delay); ``cause`` says why. Called at most once per message."""
        ...


@dataclass(frozen=True)
class Settled(Generic[M]):
    """What became of one signal: its delivery, or the failure it was released for."""

    part: Part[M]
    delivery: Delivery | None
    failure: Exception | None = None


class Settlement(Generic[M]):
    """Settles the messages one host leased from one endpoint's queue."""

    def __init__(self, bus: Bus, endpoint: str, host: Host[M], *,
                 max_delivery_count: int | None = None,
                 inline_max: int | None = None, in_process_tries: int = 3,
                 wait: Wait | None = None, sleep: Callable[[float], None] = time.sleep,
                 breaker: CircuitBreaker | None = None,
                 trace_of: Callable[[M], Mapping[str, str] | None] = _no_trace) -> None:
        """``max_delivery_count``: the bus's setting unless the host has its own (host.json
        ``maxDequeueCount``); ``inline_max``: see ``Receiver.receive``; ``breaker`` is told
        about throttling; ``trace_of``: the trace context a message's signals are processed
        in (a Functions invocation's; by default the current one)."""
        self.bus = bus
        self.endpoint = endpoint
        self.receiver = bus.parts.receiver(endpoint)
        self.queue = bus.names.queue(endpoint)
        self._host = host
        self.max_delivery_count = (max_delivery_count if max_delivery_count is not None
                                   else bus.settings.max_delivery_count)
        self._inline_max = inline_max
        self._tries = in_process_tries
        self._wait = wait
        self._sleep = sleep
        self._breaker = breaker
        self._trace_of = trace_of

    def settle(self, messages: Sequence[M], *, together: bool = True) -> list[Settled[M]]:
        """Process and settle the signals of ``messages``; one result per signal, in order.
        ``together=False`` has the receiver take them one at a time (what a batch of one
        costs; the simulation drives both)."""
        signals = parts(messages)
        incoming = [self._incoming(part) for part in signals]
        if together:
            results = self.receiver.receive(incoming, inline_max=self._inline_max)
        else:
            results = [self._receive_one(signal) for signal in incoming]
        return [self._settle(part, signal, result)
                for part, signal, result in zip(signals, incoming, results, strict=True)]

    def _incoming(self, part: Part[M]) -> Incoming:
        """The signal as the receiver takes it: without the delivery count it carries, which
        is added to the host's (*count*)."""
        ack = partial(self._ack, part)
        trace = self._trace_of(part.message)
        raw = _decoded(part.body)
        if raw is None:  # the receiver poisons it
            return Incoming(part.body, part.dequeue_count, ack, trace)
        bare, carried = carried_deliveries(raw)
        body = part.body if carried == 0 else base64.b64encode(bare).decode("ascii")
        return Incoming(body, carried + part.dequeue_count, ack, trace)

    def _receive_one(self, signal: Incoming) -> Delivery | Exception:
        [result] = self.receiver.receive([signal], inline_max=self._inline_max)
        return result

    def _settle(self, part: Part[M], signal: Incoming,
                result: Delivery | Exception) -> Settled[M]:
        if isinstance(result, TransientError) and self._tries > 1:
            result = self._retried(signal)
        if isinstance(result, Delivery):
            return Settled(part, result)
        if isinstance(result, HandlerFailed):
            log.info("handler failed (delivery %d), will retry in %g s: %s",
                     signal.dequeue_count, result.delay, result)
            self._release(part, result.delay, result)
            return Settled(part, None, result)
        if isinstance(result, StorageError):
            return self._storage_trouble(part, signal, result)
        raise result  # not a failure the protocol knows: a bug

    def _retried(self, signal: Incoming) -> Delivery | Exception:
        """The signal again, up to ``in_process_tries`` tries in all, while storage errors
        are transient."""
        def once() -> Delivery:
            result = self._receive_one(signal)
            if isinstance(result, Exception):
                raise result
            return result
        try:
            return transient_retries(self._tries - 1, self._wait, self._sleep)(once)
        except Exception as exc:
            return exc

    def _storage_trouble(self, part: Part[M], signal: Incoming,
                         cause: StorageError) -> Settled[M]:
        """Release, put a copy back, or poison (*settle*)."""
        if isinstance(cause, Throttled) and self._breaker is not None:
            self._breaker.throttled(cause)
        if self._host.poisons_at_max and signal.dequeue_count >= self.max_delivery_count:
            return self._give_up(part, signal, cause)
        if self._host.poisons_at_max and part.dequeue_count >= self.max_delivery_count - 1:
            copy = body_with_deliveries(signal.body, signal.dequeue_count,
                                        self.bus.storage.queues.limits.signal_bytes)
            if copy is not None:
                return self._requeue(part, signal, copy, cause)
        if isinstance(cause, QueueFull):
            log.info("%s: waiting for room, releasing a signal: %s", self.queue, cause)
        else:
            log.warning("%s: storage trouble, releasing a signal: %s", self.queue, cause)
        self._release(part, None, cause)
        return Settled(part, None, cause)

    def _give_up(self, part: Part[M], signal: Incoming, cause: StorageError) -> Settled[M]:
        try:
            outcome = self.receiver.poisoning.give_up(signal.body, signal.dequeue_count, cause)
        except StorageError as exc:  # poisoning failed too: the next delivery tries again
            self._release(part, None, exc)
            return Settled(part, None, exc)
        signal.ack()
        return Settled(part, Delivery(outcome))

    def _requeue(self, part: Part[M], signal: Incoming, copy: str,
                 cause: StorageError) -> Settled[M]:
        try:
            self.bus.storage.queues.send(self.queue, copy, delay=REQUEUE_DELAY_SECONDS)
        except StorageError as exc:
            self._release(part, None, exc)
            return Settled(part, None, exc)
        log.warning("storage errors on %d of %d deliveries of a signal at %s (last: %s); put "
                    "a copy carrying its count back on the queue, due in %.0f s",
                    signal.dequeue_count, self.max_delivery_count, self.endpoint, cause,
                    REQUEUE_DELAY_SECONDS)
        signal.ack()
        return Settled(part, Delivery(Outcome.REQUEUED))

    def _ack(self, part: Part[M]) -> None:
        """The part's outcome is durable; the message goes once all its parts are."""
        last = part.settled()
        if last or not self.bus.parts.safeguards.whole_bundle_ack:  # off: "ack-bundle-early"
            self._host.delete(part.message)

    def _release(self, part: Part[M], delay: float | None, cause: Exception) -> None:
        """The message comes back with all its parts: those settled meanwhile are then
        duplicates. Only the first part to fail releases it."""
        if part.release():
            self._host.release(part.message, delay, cause)


def _decoded(body: str) -> bytes | None:
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None


def body_with_deliveries(body: str, deliveries: int, capacity: int) -> str | None:
    """A signal's body (base64) carrying ``deliveries`` (``with_deliveries``), or None when it
    cannot carry a count (a bundle, a body that is not JSON, no room)."""
    raw = _decoded(body)
    copy = None if raw is None else with_deliveries(raw, deliveries, capacity)
    return None if copy is None else base64.b64encode(copy).decode("ascii")
