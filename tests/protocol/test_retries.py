"""Retry policies (bus.retry): immediate retries, delayed retries through the queue's own
visibility delay, RetryAfter, per-type policies - on the in-memory backend and Azurite."""

from __future__ import annotations

import time

import pytest

from bus import Bus, Command, Context, Endpoint, RetryAfter, RetryPolicy, Settings
from bus.hosting.worker import Worker
from bus.storage import NotFound, Storage


class Book(Command):
    ref: str
    failures: int = 0  # attempts that fail before one succeeds
    later: float = 0.0  # ask for a delayed retry on the first delivery


class Cancel(Command):
    ref: str


def build(storage: Storage, prefix: str) -> tuple[Bus, dict[str, int]]:
    attempts: dict[str, int] = {}
    hotel = Endpoint("hotel", retry=RetryPolicy(immediate=3, backoff_initial=0.01,
                                                delays=(1.0,)))

    @hotel.handles(Book, partition=lambda m: m.ref)
    def book(message: Book, ctx: Context) -> None:
        attempts[message.ref] = attempts.get(message.ref, 0) + 1
        ctx.state.put("booking", {"attempt": attempts[message.ref]})  # must not leak
        ctx.send(Cancel(ref=message.ref))  # nor this, from a failed attempt
        if message.later and ctx.dequeue_count == 1:
            raise RetryAfter(message.later, "the room is being cleaned")
        if attempts[message.ref] <= message.failures:
            raise RuntimeError(f"attempt {attempts[message.ref]} failed")

    @hotel.handles(Cancel, partition=lambda m: m.ref,
                   retry=RetryPolicy(immediate=1, delays=(0.0,)))
    def cancel(message: Cancel, ctx: Context) -> None:
        row = ctx.state.get("booking") or {}
        ctx.state.put("booking", {**row, "cancelled": True})

    bus = Bus(storage, [hotel], prefix=prefix, settings=Settings(max_delivery_count=3))
    bus.provision()
    return bus, attempts


def run(bus: Bus, seconds: float = 0.0) -> dict[str, int]:
    worker = Worker(bus, "hotel", retry_delay=0)
    deadline = time.monotonic() + seconds
    while True:
        busy = worker.poll_once()
        if not busy and time.monotonic() >= deadline:
            return worker.outcomes
        if not busy:
            time.sleep(0.1)


def booking(bus: Bus, ref: str) -> dict[str, object]:
    try:
        row = bus.storage.tables.get(bus.names.state_table("hotel"), ref, "booking")
    except NotFound:
        return {}
    return dict(row.properties)


def test_immediate_retries_succeed_within_one_delivery(storage: Storage, prefix: str) -> None:
    bus, attempts = build(storage, prefix)
    bus.send(Book(ref="r1", failures=2))
    outcomes = run(bus)
    assert attempts["r1"] == 3 and outcomes == {"processed": 2}  # Book, then one Cancel
    # Only the successful attempt's write and send happened.
    assert booking(bus, "r1") == {"attempt": 3, "cancelled": True}


def test_delayed_retries_use_the_queue_delay_then_poison(storage: Storage,
                                                         prefix: str) -> None:
    bus, attempts = build(storage, prefix)
    bus.send(Book(ref="r2", failures=99))
    started = time.monotonic()
    outcomes = run(bus, seconds=3.5)
    # 3 deliveries (max_delivery_count) x 3 immediate attempts; 1 s apart; then poisoned.
    assert attempts["r2"] == 9
    assert outcomes == {"poisoned": 1}
    assert time.monotonic() - started >= 2.0
    assert booking(bus, "r2") == {}


def test_retry_after_delays_the_next_delivery(storage: Storage, prefix: str) -> None:
    bus, attempts = build(storage, prefix)
    bus.send(Book(ref="r3", later=2.0))
    worker = Worker(bus, "hotel", retry_delay=0)
    assert worker.poll_once() == 1 and attempts["r3"] == 1  # asked to come back in 2 s
    time.sleep(0.5)
    assert worker.poll_once() == 0  # not visible yet: the queue holds it, not our memory
    time.sleep(2.0)
    run(bus, seconds=0.5)
    assert attempts["r3"] == 2 and booking(bus, "r3") == {"attempt": 2, "cancelled": True}


def test_policies_are_checked() -> None:
    with pytest.raises(ValueError, match="7 days"):
        RetryPolicy(delays=(8 * 24 * 3600.0,))
    with pytest.raises(ValueError, match="7 days"):
        RetryAfter(-1)
    assert RetryPolicy(delays=(1, 5, 30)).delay_after(2) == 5
    assert RetryPolicy(delays=(1, 5, 30)).delay_after(9) == 30


def test_a_keyboard_interrupt_in_a_handler_stops_the_worker_without_a_retry() -> None:
    """Immediate retries are for the handler's failures (Exception): a KeyboardInterrupt or
    SystemExit must reach the worker's caller at once, and the message stays unprocessed."""
    from bus.testing import InMemoryStorage

    calls: list[int] = []
    desk = Endpoint("desk", retry=RetryPolicy(immediate=3, backoff_initial=0.0))

    @desk.handles(Cancel, partition=lambda m: m.ref)
    def cancel(message: Cancel, ctx: Context) -> None:
        calls.append(1)
        raise KeyboardInterrupt

    bus = Bus(InMemoryStorage(), [desk], prefix="t")
    bus.provision()
    bus.send(Cancel(ref="r"))
    with pytest.raises(KeyboardInterrupt):
        Worker(bus, "desk", retry_delay=0).poll_once()
    assert calls == [1]
    assert bus.storage.queues.depth(bus.names.queue("desk")) == 1
