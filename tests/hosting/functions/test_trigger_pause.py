"""The queue trigger honours Bus.pause: paused messages go back to the queue with a delay
until the pause ends, and are processed once afterwards - in-memory and Azurite."""

from __future__ import annotations

import base64

import pytest

from bus import Command, Context, Endpoint
from bus.envelope import carried_deliveries
from bus.hosting.functions.trigger import QueueTrigger
from bus.protocol.delivery import Outcome
from bus.seams import Seams
from bus.storage import Storage
from bus.testing.seamed import seamed_bus


class Tick(Command):
    n: int


class Paused:
    """``ticks`` paused, one Tick taken off its queue as the host hands it to the trigger."""

    def __init__(self, storage: Storage, prefix: str) -> None:
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
        self.trigger = QueueTrigger(self.bus, "ticks", max_dequeue_count=5,
                                    inline_dispatch_max=None)
        self.bus.pause("ticks", 600, reason="maintenance")
        [message] = storage.queues.receive(self.queue, max_messages=1, lease=30)
        storage.queues.delete(self.queue, message)  # what the host does when the function returns
        self.raw = base64.b64decode(message.body)


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
