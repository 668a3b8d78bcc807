"""Delayed retries under the Functions trigger: the host makes a released message visible after
host.json's ``visibilityTimeout`` whatever the route asked, so the function postpones a message
whose handler failed with a retry delay itself - visible again after that delay, on the host's
lease - and returns. The delays are then the ones the polling worker keeps
(tests/protocol/test_retries), and nothing is copied.

``Host`` plays the Functions host's queue rules (``bus.hosting.local.queues``, from the host's
QueueProcessor): a return deletes the message (a delete whose pop receipt no longer matches -
the function changed the message - is let be); an exception releases it with visibility
timeout 0 (host.json's default), or on delivery ``maxDequeueCount`` copies it to the poison
queue; a message dequeued more often than that is poisoned without invoking the function.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bus import Bus, Command, Context, Endpoint, RetryAfter, RetryPolicy, Settings
from bus.adapters.memory import InMemoryStorage
from bus.adapters.memory.faults import NoFaults
from bus.hosting.functions.trigger import QueueTrigger
from bus.storage import NotFound, QueueMessage, Storage


class Charge(Command):
    n: int


class Clock(NoFaults):
    """The in-memory queues' clock, moved by the test."""

    def __init__(self) -> None:
        self.at = 1_000.0

    def now(self) -> float:
        return self.at


@dataclass
class Host:
    """The Functions host's rules for one queue trigger, one message at a time."""

    bus: Bus
    trigger: QueueTrigger
    max_dequeue_count: int
    now: Callable[[], float]
    invoked_at: list[float] = field(default_factory=list)
    host_poisoned: int = 0

    def step(self) -> bool:
        queues = self.bus.storage.queues
        queue = self.bus.names.queue(self.trigger.endpoint)
        received = queues.receive(queue, max_messages=1, lease=30)
        if not received:
            return False
        [message] = received
        if message.dequeue_count > self.max_dequeue_count:
            self._poison(message.body)
        else:
            self.invoked_at.append(self.now())
            try:
                self.trigger.deliver(base64.b64decode(message.body), message.dequeue_count,
                                     lease=message)
            except Exception:
                if message.dequeue_count < self.max_dequeue_count:
                    with contextlib.suppress(NotFound):  # the function postponed it
                        queues.extend(queue, message, lease=0)
                    return True
                self._poison(message.body)
        with contextlib.suppress(NotFound):  # PopReceiptMismatch: the function postponed it
            queues.delete(queue, message)
        return True

    def _poison(self, body: str) -> None:
        self.host_poisoned += 1
        self.bus.storage.queues.send(self.bus.names.poison_queue(self.trigger.endpoint), body)


def build(storage: Storage, prefix: str, *, delays: tuple[float, ...], max_count: int,
          fails: Callable[[int], Exception], now: Callable[[], float]) -> Host:
    desk = Endpoint("desk", retry=RetryPolicy(delays=delays))

    @desk.handles(Charge, partition=lambda m: str(m.n))
    def charge(message: Charge, ctx: Context) -> None:
        raise fails(ctx.dequeue_count)

    bus = Bus(storage, [desk], prefix=prefix, settings=Settings(max_delivery_count=max_count))
    bus.provision()
    trigger = QueueTrigger(bus, "desk", max_dequeue_count=max_count, inline_dispatch_max=None,
                           in_process_tries=1)
    return Host(bus, trigger, max_count, now)


def run_virtual(host: Host, clock: Clock, *, horizon: float = 600.0) -> None:
    """Deliver everything that comes due, moving the clock a tenth of a second at a time."""
    end = clock.at + horizon
    while clock.at < end:
        if not host.step():
            clock.at = round(clock.at + 0.1, 1)


def gateway_down(delivery: int) -> Exception:
    return RuntimeError(f"the gateway is down (delivery {delivery})")


def test_a_failing_handler_is_retried_at_the_routes_delays_then_poisoned() -> None:
    clock = Clock()
    host = build(InMemoryStorage(hooks=clock), "rd", delays=(5.0, 30.0), max_count=4,
                 fails=gateway_down, now=lambda: clock.at)
    start = clock.at
    host.bus.send(Charge(n=1))
    run_virtual(host, clock)
    # delivery 1 at once, then 5 s, then 30 s (the last delay repeats), then poisoned
    assert [round(t - start, 1) for t in host.invoked_at] == [0.0, 5.0, 35.0, 65.0]
    [letter] = host.bus.poisoned("desk").entries()
    assert letter.entry.reason == "handler failed 4 times (max delivery count)"
    assert letter.entry.exception == "RuntimeError: the gateway is down (delivery 4)"
    assert host.host_poisoned == 0
    assert host.bus.storage.queues.depth(host.bus.names.queue("desk")) == 0


def test_retry_after_sets_the_next_delivery_under_the_trigger_too() -> None:
    clock = Clock()

    def busy(delivery: int) -> Exception:
        return RetryAfter(12) if delivery == 1 else RuntimeError("still down")

    host = build(InMemoryStorage(hooks=clock), "ra", delays=(5.0,), max_count=3,
                 fails=busy, now=lambda: clock.at)
    start = clock.at
    host.bus.send(Charge(n=1))
    run_virtual(host, clock)
    assert [round(t - start, 1) for t in host.invoked_at] == [0.0, 12.0, 17.0]
    assert len(host.bus.poisoned("desk").entries()) == 1


def test_the_delays_hold_on_the_real_queues(storage: Storage, prefix: str) -> None:
    """On the in-memory backend in real time and on Azurite: each copy stays invisible for
    its delay (Azure's visibility timeouts are whole seconds), counts the deliveries before
    it, and the message is poisoned by the bus with its reason, not by the host."""
    host = build(storage, prefix, delays=(1.0, 2.0), max_count=3, fails=gateway_down,
                 now=time.monotonic)
    host.bus.send(Charge(n=1))
    deadline = time.monotonic() + 30
    while len(host.invoked_at) < 3 and time.monotonic() < deadline:
        if not host.step():
            time.sleep(0.1)
    first, second, third = host.invoked_at
    assert second - first >= 0.9 and third - second >= 1.9
    [letter] = host.bus.poisoned("desk").entries()
    assert letter.entry.reason == "handler failed 3 times (max delivery count)"
    assert letter.entry.dequeue_count == 3 and host.host_poisoned == 0
    assert host.bus.storage.queues.depth(host.bus.names.queue("desk")) == 0


def test_without_a_delay_the_host_releases_the_message() -> None:
    """A delay of 0 is not postponed: the function raises, and the host's release (visibility
    timeout 0) is the retry."""
    clock = Clock()
    host = build(InMemoryStorage(hooks=clock), "nd", delays=(0.0,), max_count=3,
                 fails=gateway_down, now=lambda: clock.at)
    host.bus.send(Charge(n=1))
    extend = host.bus.storage.queues.extend
    leases: list[float] = []

    def counted(queue: str, message: QueueMessage, *, lease: float) -> QueueMessage:
        leases.append(lease)
        return extend(queue, message, lease=lease)

    host.bus.storage.queues.extend = counted  # type: ignore[method-assign]
    run_virtual(host, clock, horizon=5)
    assert host.invoked_at == [host.invoked_at[0]] * 3  # three deliveries, no time between
    assert leases == [0, 0]  # the host's two releases; the third failure poisoned it
