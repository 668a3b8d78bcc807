"""The shipped loop and test harness: ``Worker.run`` until stopped, ``bus.testing.drain``
until idle (failing fast on a poisoned message) - in-memory and Azurite."""

from __future__ import annotations

import threading
import time

import pytest

from bus import Bus, Command, Context, Endpoint, RetryPolicy
from bus.hosting.worker import Worker
from bus.storage import Storage
from bus.testing import MessagesPoisoned, drain


class Add(Command):
    key: str
    fail: bool = False


def build(storage: Storage, prefix: str) -> tuple[Bus, list[str]]:
    counter = Endpoint("counter")
    seen: list[str] = []

    @counter.handles(Add, partition=lambda m: m.key,
                     retry=RetryPolicy(delays=(0.0,)))
    def add(message: Add, ctx: Context) -> None:
        if message.fail:
            raise ValueError(f"cannot add {message.key}")
        seen.append(message.key)

    bus = Bus(storage, [counter], prefix=prefix)
    bus.provision()
    return bus, seen


def test_run_processes_until_stopped(storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    stop = threading.Event()
    worker = Worker(bus, "counter", retry_delay=0)
    thread = threading.Thread(target=worker.run, args=(stop,), kwargs={"idle_max": 0.2})
    thread.start()
    try:
        for key in "abc":
            bus.send(Add(key=key))
        deadline = time.monotonic() + 30
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert sorted(seen) == ["a", "b", "c"] and worker.outcomes == {"processed": 3}


def test_drain_runs_until_idle_and_reports_outcomes(storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    for key in "ab":
        bus.send(Add(key=key))
    drained = drain(bus)
    assert drained["counter"] == {"processed": 2} == drained.total()
    assert drained.signals == 2 and sorted(seen) == ["a", "b"]
    assert drain(bus).total() == {}


def test_drain_fails_fast_with_the_handlers_exception(storage: Storage, prefix: str) -> None:
    bus, _ = build(storage, prefix)
    bus.send(Add(key="x", fail=True))
    with pytest.raises(MessagesPoisoned, match=r"(?s)counter: Add .*ValueError.*cannot add x"):
        drain(bus)


def test_drain_without_fail_fast_counts_the_poisoned(storage: Storage, prefix: str) -> None:
    bus, _ = build(storage, prefix)
    bus.send(Add(key="x", fail=True))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
