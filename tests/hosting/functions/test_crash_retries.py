"""Crashes are not failures: a message whose deliveries never ended (the instance crashed, in a
loop) is moved to the poison queue by the Functions host once its dequeue count is over the
maximum, although its handler never failed. Maintenance's adoption retries it automatically
(``Settings.crash_retry_delays``: bounded, audited, with back-off), and what stays in the poison
queue is marked as a crash, with its true delivery count.

``Host`` (tests/hosting/functions/test_retry_delays.py) plays the host's queue rules on a
virtual clock; a crash is a delivery whose invocation never returns (the lease runs out)."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable

import pytest

from bus import Bus, Command, Context, Endpoint, Settings
from bus.adapters.memory import InMemoryStorage
from bus.envelope import with_deliveries
from bus.hosting.functions.trigger import QueueTrigger
from bus.hosting.maintenance import maintenance_pass
from bus.protocol.poison.poisoned import HOST_REASON
from bus.protocol.tokens.inbox import TokenState
from bus.storage import Storage
from tests.hosting.functions.test_retry_delays import Clock, Host

LEASE = 30.0


class Pay(Command):
    n: int


def build(storage: Storage, prefix: str, crashes: Callable[[], bool],
          delays: tuple[float, ...], now: Callable[[], float]) -> tuple[Host, list[int]]:
    desk = Endpoint("desk")
    paid: list[int] = []

    @desk.handles(Pay, partition=lambda m: str(m.n))
    def pay(message: Pay, ctx: Context) -> None:
        paid.append(message.n)
        ctx.state.put("paid", {"n": message.n})

    bus = Bus(storage, [desk], prefix=prefix,
              settings=Settings(max_delivery_count=4, crash_retry_delays=delays))
    bus.provision()
    trigger = QueueTrigger(bus, "desk", max_dequeue_count=4, inline_dispatch_max=None)
    return CrashingHost(bus, trigger, 4, now, crashes=crashes), paid


class CrashingHost(Host):
    """The host's rules, with an instance that dies mid-invocation while ``crashes()``."""

    def __init__(self, *args: object, crashes: Callable[[], bool]) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.crashes = crashes
        self.crashed = 0

    def step(self) -> bool:
        queues = self.bus.storage.queues
        queue = self.bus.names.queue("desk")
        if not self.crashes():
            return super().step()
        received = queues.receive(queue, max_messages=1, lease=LEASE)
        if not received:
            return False
        if received[0].dequeue_count > self.max_dequeue_count:
            self._poison(received[0].body)  # the host moves it without invoking
            queues.delete(queue, received[0])
        else:
            self.crashed += 1  # the invocation never returns: the lease runs out
        return True


def run(host: Host, clock: Clock, seconds: float, *, maintain_every: float = 1.0) -> None:
    """Deliver what comes due, moving the clock a tenth of a second at a time, with a
    maintenance pass every ``maintain_every`` seconds."""
    end, next_pass = clock.at + seconds, clock.at
    while clock.at < end:
        if clock.at >= next_pass:
            maintenance_pass(host.bus)
            next_pass = clock.at + maintain_every
        if not host.step():
            clock.at = round(clock.at + 0.1, 1)


def test_an_adopted_entry_carries_the_delivery_count_the_host_moved_it_at() -> None:
    """No automatic retries: the entry says 5 deliveries (over the maximum of 4), not the
    poison queue's own dequeue count of the adopting read (1); a copy that carried 2
    deliveries before says 7."""
    clock = Clock()
    host, paid = build(InMemoryStorage(hooks=clock), "", lambda: True, (), lambda: clock.at)
    host.bus.send(Pay(n=1))
    run(host, clock, 5 * LEASE + 5)
    assert (host.crashed, host.host_poisoned, paid) == (4, 1, [])
    [letter] = host.bus.poisoned("desk").entries()
    assert (letter.entry.reason, letter.entry.dequeue_count) == (HOST_REASON, 5)
    assert letter.crashed and letter.recoveries == 0 and letter.token is TokenState.POISONED
    host.bus.poisoned("desk").purge()
    host.bus.send(Pay(n=2))
    [signal] = host.bus.storage.queues.receive(host.bus.names.queue("desk"), max_messages=1,
                                               lease=LEASE)
    host.bus.storage.queues.delete(host.bus.names.queue("desk"), signal)
    again = with_deliveries(base64.b64decode(signal.body), 2, 64 * 1024)
    assert again is not None
    host.bus.storage.queues.send(host.bus.names.poison_queue("desk"),
                                 base64.b64encode(again).decode())
    [letter] = host.bus.poisoned("desk").entries()
    assert letter.entry.dequeue_count == 7


def test_a_crashed_message_is_retried_after_the_wait_and_handled_once() -> None:
    clock = Clock()
    crashing = {"on": True}
    host, paid = build(InMemoryStorage(hooks=clock), "", lambda: crashing["on"], (5.0, 30.0),
                       lambda: clock.at)
    host.bus.send(Pay(n=1))
    run(host, clock, 5 * LEASE, maintain_every=1000)  # the crash loop; no maintenance yet
    assert (host.crashed, host.host_poisoned) == (4, 1)
    crashing["on"] = False  # the instance is fixed (a deploy, a memory limit raised)
    adopted_at = clock.at
    report = maintenance_pass(host.bus)
    assert report.adopted == {"desk": 1}
    assert host.bus.poisoned("desk").entries() == []  # retried, not an entry
    [record] = host.bus.audit_trail()
    assert (record.action, record.endpoint, record.target["retry"], record.target["delay"]) == (
        "retry", "desk", 1, 5.0)
    run(host, clock, 60)
    assert paid == [1] and host.invoked_at[0] >= adopted_at + 5.0
    assert host.bus.read_state("desk", "1", "paid") == {"n": 1}
    assert host.bus.poisoned("desk").entries() == []


def test_automatic_retries_are_bounded_then_the_entry_is_marked_a_crash() -> None:
    clock = Clock()
    host, paid = build(InMemoryStorage(hooks=clock), "", lambda: True, (5.0, 30.0),
                       lambda: clock.at)
    host.bus.send(Pay(n=1))
    run(host, clock, 600)
    assert paid == [] and host.host_poisoned == 3  # the first move and one per retry
    [letter] = host.bus.poisoned("desk").entries()
    assert letter.crashed and letter.recoveries == 2 and letter.entry.dequeue_count == 5
    retries = [r.target["retry"] for r in host.bus.audit_trail() if r.action == "retry"]
    assert sorted(retries) == [1, 2]
    host.bus.poisoned("desk").replay()  # an operator's replay, the instance still crashing
    assert host.bus.poisoned("desk").entries() == []


def test_a_handler_s_failure_is_no_crash_and_is_not_retried() -> None:
    clock = Clock()
    desk = Endpoint("desk")

    @desk.handles(Pay, partition=lambda m: str(m.n))
    def pay(message: Pay, ctx: Context) -> None:
        raise RuntimeError("declined")

    bus = Bus(InMemoryStorage(hooks=clock), [desk],
              settings=Settings(max_delivery_count=2, crash_retry_delays=(5.0,)))
    bus.provision()
    host = Host(bus, QueueTrigger(bus, "desk", max_dequeue_count=2, inline_dispatch_max=None,
                                  in_process_tries=1), 2, lambda: clock.at)
    bus.send(Pay(n=1))
    run(host, clock, 60)
    [letter] = bus.poisoned("desk").entries()
    assert not letter.crashed and letter.entry.exception == "RuntimeError: declined"
    assert host.host_poisoned == 0 and [r.action for r in bus.audit_trail()] == []


@pytest.mark.azurite
def test_a_crashed_message_is_retried_on_azurite(azurite_connection: str, prefix: str) -> None:
    """What the host moved (a bundle of two, unchanged) is retried after its wait, and each
    message handled once."""
    from bus.adapters.azure import AzureStorage
    from bus.envelope import encode_bundle
    from bus.testing import drain

    storage = AzureStorage.from_connection_string(azurite_connection)
    host, paid = build(storage, prefix, lambda: False, (1.0,), time.time)
    bus = host.bus
    for n in (1, 2):
        bus.send(Pay(n=n))
    queue = bus.names.queue("desk")
    leased = bus.storage.queues.receive(queue, max_messages=32, lease=LEASE)
    texts = [base64.b64decode(m.body).decode() for m in leased]
    bus.storage.queues.send(bus.names.poison_queue("desk"), encode_bundle(texts))
    for message in leased:
        bus.storage.queues.delete(queue, message)
    assert maintenance_pass(bus).adopted == {"desk": 2}
    assert drain(bus).total() == {}  # not visible before the wait
    time.sleep(1.5)
    assert drain(bus).total() == {"processed": 2}
    assert sorted(paid) == [1, 2] and bus.poisoned("desk").entries() == []
