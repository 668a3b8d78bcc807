"""The circuit breaker: an explicit pause shared by every worker, and automatic trips when
storage throttles - on the in-memory backend and Azurite."""

from __future__ import annotations

import time

import pytest

from bus import Bus, Command, Context, Endpoint
from bus.hosting.breaker import CircuitBreaker
from bus.hosting.worker import Worker
from bus.storage import QueueMessage, Queues, Storage, Throttled
from bus.testing import InMemoryStorage


class Job(Command):
    ref: str


def build(storage: Storage, prefix: str, done: list[str]) -> Bus:
    mill = Endpoint("mill")

    @mill.handles(Job, partition=lambda m: m.ref)
    def job(message: Job, ctx: Context) -> None:
        done.append(message.ref)

    bus = Bus(storage, [mill], prefix=prefix)
    bus.provision()
    return bus


def test_a_pause_stops_every_worker_until_resumed(storage: Storage, prefix: str) -> None:
    done: list[str] = []
    bus = build(storage, prefix, done)
    bus.pause("mill", 60, reason="maintenance")
    assert bus.paused("mill") is not None and bus.paused("mill").reason == "maintenance"  # type: ignore[union-attr]
    bus.send(Job(ref="j1"))
    workers = [Worker(bus, "mill", breaker=CircuitBreaker(bus, "mill", check_every=0.2))
               for _ in range(2)]
    assert [w.poll_once() for w in workers] == [0, 0] and done == []
    assert workers[0].breaker.paused_for() > 50
    bus.resume("mill")
    assert bus.paused("mill") is None
    time.sleep(0.3)  # the workers look again after check_every
    assert sum(w.poll_once() for w in workers) == 1 and done == ["j1"]


class _Busy:
    """A Queues port whose first receive answers 503 with Retry-After, as Azure does."""

    def __init__(self, inner: Queues, retry_after: float) -> None:
        self._inner, self._retry_after, self.refused = inner, retry_after, 0

    def receive(self, queue: str, *, max_messages: int, lease: float) -> list[QueueMessage]:
        if not self.refused:
            self.refused += 1
            raise Throttled("503 server busy", retry_after=self._retry_after)
        return self._inner.receive(queue, max_messages=max_messages, lease=lease)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_throttling_trips_the_breaker_for_its_retry_after() -> None:
    done: list[str] = []
    inner = InMemoryStorage()
    busy = _Busy(inner.queues, retry_after=1.0)
    storage = Storage(queues=busy, blobs=inner.blobs, tables=inner.tables)  # type: ignore[arg-type]
    bus = build(storage, "p", done)
    bus.send(Job(ref="j2"))
    worker = Worker(bus, "mill")
    assert worker.poll_once() == 0 and busy.refused == 1  # throttled: the breaker opens
    assert 0.5 < worker.breaker.paused_for() <= 1.0
    assert worker.poll_once() == 0 and done == []  # still open: it does not even ask
    time.sleep(1.05)
    assert worker.poll_once() == 1 and done == ["j2"]


def test_pausing_needs_a_positive_duration() -> None:
    bus = build(InMemoryStorage(), "p", [])
    with pytest.raises(ValueError, match="positive"):
        bus.pause("mill", 0)
