"""The queue trigger honours Bus.pause: paused messages go back to the queue with a delay
until the pause ends, and are processed once afterwards - in-memory and Azurite."""

from __future__ import annotations

import base64

import pytest

from bus import Command, Context, Endpoint
from bus.envelope import carried_deliveries
from bus.hosting.functions.trigger import PAUSE_WAITED_OUT_SECONDS, QueueTrigger
from bus.protocol.delivery import Outcome
from bus.seams import Seams
from bus.storage import Storage
from bus.testing.seamed import seamed_bus


class Tick(Command):
    n: int


class Paused:
    """``ticks`` paused for ``seconds``, one Tick taken off its queue as the host hands it to
    the trigger (whose sleeps move the clock on)."""

    def __init__(self, storage: Storage, prefix: str, seconds: float = 600) -> None:
        self.clock = [1_900_000_000.0]
        self.seen: list[int] = []
        ticks = Endpoint("ticks")

        @ticks.handles(Tick, partition=lambda m: str(m.n))
        def tick(message: Tick, ctx: Context) -> None:
            self.seen.append(message.n)

        self.bus = seamed_bus(Seams(clock=lambda: self.clock[0]), storage, [ticks],
                              prefix=prefix)
        self.bus.provision()
        self.queue = self.bus.names.queue("ticks")
        self.bus.send(Tick(n=1))
        self.slept: list[float] = []
        self.trigger = QueueTrigger(self.bus, "ticks", max_dequeue_count=5,
                                    inline_dispatch_max=None, sleep=self.sleep)
        self.bus.pause("ticks", seconds, reason="maintenance")
        [message] = storage.queues.receive(self.queue, max_messages=1, lease=30)
        storage.queues.delete(self.queue, message)  # what the host does when the function returns
        self.raw = base64.b64decode(message.body)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock[0] += seconds


def test_a_paused_endpoint_puts_deliveries_back_until_the_pause_ends(storage: Storage,
                                                                     prefix: str) -> None:
    paused = Paused(storage, prefix)
    queue, trigger = paused.queue, paused.trigger
    assert trigger.deliver(paused.raw, 1).outcome is Outcome.REQUEUED
    assert paused.seen == [] and storage.queues.depth(queue) == 1
    assert storage.queues.receive(queue, max_messages=1, lease=30) == []  # invisible for now
    paused.bus.resume("ticks")
    paused.clock[0] += 6  # past the breaker's 5 s check interval
    assert trigger.deliver(paused.raw, 1).outcome is Outcome.PROCESSED and paused.seen == [1]


def test_a_paused_put_back_keeps_the_deliveries_that_already_failed(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message delivered for the 3rd time (two deliveries failed) meets a pause: the copy put
    back carries those 2, so the host's fresh count does not give it more tries than
    ``maxDequeueCount`` allows in all."""
    paused = Paused(storage, prefix)
    put_back: list[str] = []
    monkeypatch.setattr(storage.queues, "send",
                        lambda name, body, delay=0.0: put_back.append(body))
    assert paused.trigger.deliver(paused.raw, 3).outcome is Outcome.REQUEUED
    [body] = put_back
    assert carried_deliveries(base64.b64decode(body))[1] == 2
    assert paused.trigger.deliver(base64.b64decode(body), 1).outcome is Outcome.REQUEUED
    assert carried_deliveries(base64.b64decode(put_back[1]))[1] == 2  # not counted twice


@pytest.mark.parametrize("seconds", [4, PAUSE_WAITED_OUT_SECONDS])
def test_a_short_pause_is_waited_out_without_a_copy(storage: Storage, prefix: str,
                                                     seconds: float) -> None:
    """A pause ending within ``PAUSE_WAITED_OUT_SECONDS`` (a throttling pause of a few
    seconds) is slept through in the invocation, which then processes its message: nothing is
    put back on the queue."""
    paused = Paused(storage, prefix, seconds)
    assert paused.trigger.deliver(paused.raw, 1).outcome is Outcome.PROCESSED
    assert paused.seen == [1] and storage.queues.depth(paused.queue) == 0
    assert seconds <= sum(paused.slept) <= seconds + 5  # (the pause row is read every 5 s)


def test_a_pause_made_longer_while_an_invocation_waits_puts_its_message_back(
        storage: Storage, prefix: str) -> None:
    paused = Paused(storage, prefix, 10)
    sleep = paused.sleep

    def longer(seconds: float) -> None:  # the operator extends the pause meanwhile
        paused.bus.pause("ticks", 600, reason="longer")
        sleep(seconds)

    paused.trigger._sleep = longer
    assert paused.trigger.deliver(paused.raw, 1).outcome is Outcome.REQUEUED
    assert paused.seen == [] and storage.queues.depth(paused.queue) == 1
