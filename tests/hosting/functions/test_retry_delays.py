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
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bus import Bus, Command, Context, Endpoint, RetryAfter, RetryPolicy, Settings, connect
from bus.adapters.memory import InMemoryStorage
from bus.adapters.memory.faults import NoFaults
from bus.hosting.functions.trigger import QueueTrigger
from bus.protocol.delivery import HandlerFailed
from bus.storage import NotFound, QueueMessage, Storage

ROOT = Path(__file__).resolve().parents[3]


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


def test_a_lease_the_host_renewed_since_the_invocation_began_is_released_by_the_host() -> None:
    """The host renews a long invocation's lease (a new pop receipt): the function cannot
    postpone the message with the one it was given, so it raises and the host releases it."""
    clock = Clock()
    host = build(InMemoryStorage(hooks=clock), "rn", delays=(5.0,), max_count=3,
                 fails=gateway_down, now=lambda: clock.at)
    host.bus.send(Charge(n=1))
    queues, queue = host.bus.storage.queues, host.bus.names.queue("desk")
    [message] = queues.receive(queue, max_messages=1, lease=30)
    queues.extend(queue, message, lease=30)  # the host's renewal: the receipt below is stale
    with pytest.raises(HandlerFailed, match="the gateway is down"):
        host.trigger.deliver(base64.b64decode(message.body), 1, lease=message)


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


FAILING_APP = '''
import time

import azure.durable_functions as df

from bus import Context, Endpoint, RetryPolicy
from bus.hosting.functions import BusFunctions
from contracts import Greet

greeter = Endpoint("greeter", retry=RetryPolicy(delays=(2.0, 4.0)))


@greeter.handles(Greet, partition=lambda m: m.name)
def greet(message: Greet, ctx: Context) -> None:
    with open({attempts!r}, "a") as attempts:
        attempts.write(f"{{time.time()}}\\n")
    raise RuntimeError("the greeting service is down")


app = df.DFApp()
bus_functions = BusFunctions([greeter])
app.register_functions(bus_functions)
'''


@pytest.mark.worker
def test_under_the_local_host_the_delays_hold_with_microsofts_worker(
        tmp_path: Path, azurite_connection: str, prefix: str) -> None:
    """The whole path: the host hands the function its message's id and pop receipt (the
    trigger's metadata, through Microsoft's worker), the function postpones the message by
    the route's delay (host.json's visibilityTimeout is 0 here), and the host's delete finds
    the pop receipt changed and lets it be. Poisoned by the bus on the third delivery."""
    folder = tmp_path / "shop"
    env = {**os.environ, "AzureWebJobsStorage": azurite_connection, "BUS_PREFIX": prefix,
           "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "bus", "init", str(folder)], env=env, check=True,
                   capture_output=True, timeout=120)  # in a process: it imports the new app
    attempts = tmp_path / "attempts.txt"
    (folder / "function_app.py").write_text(FAILING_APP.format(attempts=str(attempts)))
    host_json = json.loads((folder / "host.json").read_text())
    host_json["extensions"]["queues"].update(maxDequeueCount=3, visibilityTimeout="00:00:00")
    (folder / "host.json").write_text(json.dumps(host_json))
    for command in (["-m", "bus", "provision"], ["send.py", "ada"]):
        subprocess.run([sys.executable, *command], cwd=folder, env=env, check=True,
                       capture_output=True, timeout=120)
    host = subprocess.Popen([sys.executable, "-m", "bus", "host", "--log-level", "WARNING"],
                            cwd=folder, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    bus = connect(azurite_connection, [Endpoint("greeter")], prefix=prefix)
    try:
        deadline = time.monotonic() + 90
        while not bus.poisoned("greeter").entries() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        host.send_signal(signal.SIGTERM)
        host.wait(timeout=60)
    [letter] = bus.poisoned("greeter").entries()
    assert letter.entry.reason == "handler failed 3 times (max delivery count)"
    assert letter.entry.dequeue_count == 3
    first, second, third = (float(line) for line in attempts.read_text().split())
    assert second - first >= 1.9 and third - second >= 3.9  # whole seconds on Azure
    assert bus.storage.queues.depth(bus.names.queue("greeter")) == 0
