"""Middleware around handling and sending (bus.middleware): order, short-circuits, rejects,
and the exactly-once steps staying outside users' reach - on the in-memory backend and Azurite.
"""

from __future__ import annotations

import pytest

from bus import (
    Bus,
    Command,
    ConfigurationError,
    Context,
    Endpoint,
    Message,
    Middleware,
    Outgoing,
    Reject,
    RetryPolicy,
    Settings,
)
from bus.envelope import decode_signal
from bus.middleware import HandleNext, SendNext
from bus.protocol.poison.queue import PoisonEntry
from bus.storage import NotFound, Storage
from bus.testing import drain


class Reserve(Command):
    sku: str
    quantity: int = 1


class Ship(Command):
    sku: str


class Journal(Middleware):
    """Records every stage it sees, under its own name."""

    def __init__(self, tag: str, log: list[str]) -> None:
        self.tag, self.log = tag, log

    def handle(self, message: Message, ctx: Context, call_next: HandleNext) -> None:
        self.log.append(f"{self.tag}>{message.message_type}")
        call_next(message, ctx)
        self.log.append(f"{self.tag}<{message.message_type}")

    def send(self, outgoing: Outgoing, call_next: SendNext) -> None:
        outgoing.headers[self.tag] = outgoing.source
        self.log.append(f"{self.tag}:send {outgoing.message.message_type}")
        call_next(outgoing)


class Validate(Middleware):
    """Drops zero-quantity reservations, rejects negative ones, refuses to ship 'void'."""

    def handle(self, message: Message, ctx: Context, call_next: HandleNext) -> None:
        if isinstance(message, Reserve) and message.quantity < 0:
            raise Reject(f"quantity {message.quantity} is negative")
        if isinstance(message, Reserve) and message.quantity == 0:
            return  # short-circuit: consumed without effect
        call_next(message, ctx)

    def send(self, outgoing: Outgoing, call_next: SendNext) -> None:
        if isinstance(outgoing.message, Ship) and outgoing.message.sku == "void":
            return  # the send is dropped
        call_next(outgoing)


class Flaky(Middleware):
    """Fails the first attempt of every message (an outage of whatever it calls)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def handle(self, message: Message, ctx: Context, call_next: HandleNext) -> None:
        if ctx.message_id not in self.seen:
            self.seen.add(ctx.message_id)
            raise RuntimeError("tracing backend unavailable")
        call_next(message, ctx)


def build(storage: Storage, prefix: str, log: list[str],
          extra: tuple[Middleware, ...] = ()) -> Bus:
    stock = Endpoint("stock", middleware=[Journal("endpoint", log), Validate(), *extra],
                     retry=RetryPolicy(immediate=2, backoff_initial=0.0))
    shipping = Endpoint("shipping")

    @stock.handles(Reserve, partition=lambda m: m.sku)
    def reserve(message: Reserve, ctx: Context) -> None:
        log.append(f"handler {message.sku}")
        row = ctx.state.get("stock") or {"reserved": 0}
        ctx.state.put("stock", {"reserved": int(row["reserved"] or 0) + message.quantity})
        ctx.send(Ship(sku=message.sku))

    @shipping.handles(Ship, partition=lambda m: m.sku)
    def ship(message: Ship, ctx: Context) -> None:
        ctx.state.put("shipment", {"headers": ",".join(f"{k}={v}" for k, v in
                                                       sorted(ctx.headers.items()))})

    bus = Bus(storage, [stock, shipping], prefix=prefix, middleware=[Journal("bus", log)],
              settings=Settings(max_delivery_count=3))
    bus.provision()
    return bus


def row(bus: Bus, endpoint: str, partition: str, key: str) -> dict[str, object] | None:
    try:
        return dict(bus.storage.tables.get(bus.names.state_table(endpoint), partition,
                                           key).properties)
    except NotFound:
        return None


def test_bus_middleware_wraps_endpoint_middleware_around_handler_and_sends(
        storage: Storage, prefix: str) -> None:
    log: list[str] = []
    bus = build(storage, prefix, log)
    bus.send(Reserve(sku="apple", quantity=2))
    assert log == ["bus:send Reserve"]  # the client's send goes through the bus's middleware
    assert drain(bus).total() == {"processed": 2}
    assert log[1:6] == ["bus>Reserve", "endpoint>Reserve", "handler apple",
                        "bus:send Ship", "endpoint:send Ship"]
    assert log[6:8] == ["endpoint<Reserve", "bus<Reserve"]
    # Headers added by sending middleware travel with the message.
    assert row(bus, "shipping", "apple", "shipment") == {
        "headers": "bus=stock,endpoint=stock"}
    assert row(bus, "stock", "apple", "stock") == {"reserved": 2}
    assert bus.pipeline("stock") == [
        "R1 admit", "R2 payload", "R3 claim", "R4 deduplicate", "R5 retries", "[Journal]",
        "[Journal]", "[Validate]", "R5 handler", "R6 commit", "R7 complete", "R7 acknowledge"]


def test_short_circuits_consume_without_effect_and_drop_sends(storage: Storage,
                                                              prefix: str) -> None:
    log: list[str] = []
    bus = build(storage, prefix, log)
    bus.send(Reserve(sku="pear", quantity=0))
    bus.send(Reserve(sku="void"))
    assert drain(bus).total() == {"processed": 2}  # nothing redelivered, nothing poisoned
    assert "handler pear" not in log and row(bus, "stock", "pear", "stock") is None
    assert row(bus, "stock", "void", "stock") == {"reserved": 1}  # handled, send dropped
    assert row(bus, "shipping", "void", "shipment") is None
    assert [t for t in bus.parts.inbox.all()] == []  # both messages' tokens consumed


def test_reject_poisons_at_once_with_the_reason(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix, [])
    bus.send(Reserve(sku="plum", quantity=-3))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    [body] = [m.body for m in storage.queues.receive(bus.names.poison_queue("stock"),
                                                      max_messages=5, lease=30)]
    entry = PoisonEntry.decode(body)
    assert entry.reason == "rejected: quantity -3 is negative"
    assert entry.dequeue_count == 1  # no retries


def test_middleware_failures_are_retried_and_the_effect_happens_once(
        storage: Storage, prefix: str) -> None:
    log: list[str] = []
    flaky = Flaky()
    bus = build(storage, prefix, log, extra=(flaky,))
    bus.send(Reserve(sku="fig", quantity=5))
    assert drain(bus).total() == {"processed": 2}
    assert log.count("handler fig") == 1 and row(bus, "stock", "fig", "stock") == {
        "reserved": 5}


def test_duplicates_never_reach_middleware(storage: Storage, prefix: str) -> None:
    """Deduplication is a protocol stage outside the middleware: a second copy of a signal is
    dropped before any user code sees it."""
    log: list[str] = []
    bus = build(storage, prefix, log)
    bus.send(Reserve(sku="kiwi"))
    queue = bus.names.queue("stock")
    [leased] = storage.queues.receive(queue, max_messages=1, lease=0.5)
    assert decode_signal(leased.body).message_type == "Reserve"
    storage.queues.send(queue, leased.body)  # a duplicate copy of the same signal
    storage.queues.extend(queue, leased, lease=0)
    assert drain(bus).total() == {"processed": 2, "duplicate": 1}
    assert log.count("bus>Reserve") == 1 and log.count("handler kiwi") == 1


def test_anything_but_middleware_fails_at_start_up() -> None:
    with pytest.raises(ConfigurationError, match=r"bus\.Middleware"):
        Endpoint("stock", middleware=[print])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match=r"bus\.Middleware"):
        Bus(storage=None, middleware=[object()])  # type: ignore[arg-type, list-item]
