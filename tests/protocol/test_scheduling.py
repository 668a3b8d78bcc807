"""Scheduled delivery: ``send(..., delay=...)`` from clients and handlers, on the in-memory
backend and Azurite; delays beyond the queue's 7-day limit with a fake clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from bus import Bus, Command, Context, Endpoint
from bus.adapters.memory import Fault
from bus.hosting.worker import Worker
from bus.seams import Seams
from bus.storage import NotFound, Storage
from bus.testing import InMemoryStorage
from bus.testing.seamed import seamed_bus


class Remind(Command):
    ref: str


class Ping(Command):
    ref: str


def build(storage: Storage, prefix: str, seams: Seams | None = None, **kwargs: object) -> Bus:
    desk = Endpoint("desk")

    @desk.handles(Ping, partition=lambda m: m.ref)
    def ping(message: Ping, ctx: Context) -> None:
        ctx.send(Remind(ref=message.ref), delay=timedelta(seconds=1.5))

    @desk.handles(Remind, partition=lambda m: m.ref)
    def remind(message: Remind, ctx: Context) -> None:
        row = ctx.state.get("reminded") or {"times": 0}
        times = row["times"]
        assert isinstance(times, int)
        ctx.state.put("reminded", {"times": times + 1})

    bus = seamed_bus(seams or Seams(), storage, [desk], prefix=prefix,
                     **kwargs)  # type: ignore[arg-type]
    bus.provision()
    return bus


def reminded(bus: Bus, ref: str) -> int:
    try:
        row = bus.storage.tables.get(bus.names.state_table("desk"), ref, "reminded")
    except NotFound:
        return 0
    return int(row.properties["times"])  # type: ignore[arg-type]


def test_scheduled_sends_arrive_when_due(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    worker = Worker(bus, "desk")
    bus.send(Remind(ref="client"), delay=2.0)
    bus.send(Ping(ref="handler"))
    assert worker.poll_once() == 1  # the Ping; its Remind is scheduled 1.5 s out
    time.sleep(0.5)
    assert worker.poll_once() == 0  # nothing due yet: the queue holds both
    assert reminded(bus, "client") == reminded(bus, "handler") == 0
    time.sleep(2.0)
    while worker.poll_once():
        pass
    assert reminded(bus, "client") == reminded(bus, "handler") == 1


class _Clock:
    """Fault hooks with a clock the test moves (no faults)."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def now(self) -> float:
        return self.t

    def before_call(self, service: str, operation: str) -> Fault | None:
        return None

    def defer(self, effect: Callable[[], None]) -> None:  # pragma: no cover - no ghosts
        effect()


def test_a_delay_beyond_the_queue_limit_is_put_back_until_due() -> None:
    clock = _Clock()
    bus = build(InMemoryStorage(hooks=clock), "p", seams=Seams(clock=clock.now))
    worker = Worker(bus, "desk")
    bus.send(Remind(ref="later"), delay=timedelta(days=9))
    clock.t += 7 * 24 * 3600  # the longest a queue can hide a message: it shows up early
    assert worker.poll_once() == 1 and worker.outcomes == {"scheduled": 1}
    assert reminded(bus, "later") == 0
    clock.t += 2 * 24 * 3600 - 5  # not yet
    assert worker.poll_once() == 0
    clock.t += 10
    assert worker.poll_once() == 1 and reminded(bus, "later") == 1


def test_negative_delays_are_refused() -> None:
    bus = build(InMemoryStorage(), "p")
    with pytest.raises(ValueError, match="delay"):
        bus.send(Remind(ref="x"), delay=-1)
