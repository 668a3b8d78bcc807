"""The operators' views of storage: tokens keep their message's lineage, scheduled messages,
per-minute statistics and a conversation's messages with where each one is - on the in-memory
store and on Azurite."""

from __future__ import annotations

import time

from bus import Bus, Command, Context, Endpoint, Event, Reject, Settings
from bus.operations.conversation import conversation
from bus.operations.overview import endpoint_stats, scheduled
from bus.protocol.tokens.inbox import Lineage, TokenState
from bus.storage import Storage
from bus.testing import drain


class Order(Command):
    order_id: str
    amount: int = 1


class Placed(Event):
    order_id: str
    amount: int


class Remind(Command):
    order_id: str


def flow(storage: Storage, prefix: str, **settings: object) -> Bus:
    orders, billing, shipping = Endpoint("orders"), Endpoint("billing"), Endpoint("shipping")

    @orders.handles(Order, partition=lambda m: m.order_id)
    def place(message: Order, ctx: Context) -> None:
        ctx.publish(Placed(order_id=message.order_id, amount=message.amount))
        ctx.send(Remind(order_id=message.order_id), to="orders", delay=3600)

    @orders.handles(Remind, partition=lambda m: m.order_id)
    def remind(message: Remind, ctx: Context) -> None:
        return None

    @billing.handles(Placed, partition=lambda m: m.order_id)
    def bill(message: Placed, ctx: Context) -> None:
        if message.amount < 0:
            raise Reject("a negative amount")

    @shipping.handles(Placed, partition=lambda m: m.order_id)
    def ship(message: Placed, ctx: Context) -> None:
        return None

    bus = Bus(storage, [orders, billing, shipping], prefix=prefix,
              settings=Settings(**settings))  # type: ignore[arg-type]
    bus.provision()
    return bus


def test_tokens_keep_their_message_s_lineage_through_confirmation(storage: Storage,
                                                                 prefix: str) -> None:
    bus = flow(storage, prefix)
    root = bus.send(Order(order_id="o1"), correlation_id="c1")
    [token] = bus.parts.inbox.all("orders")
    assert token.lineage == Lineage("c1", None, "Order", "client")
    drain(bus, ["orders"])
    # The handler's copies: created pending before its commit, confirmed live after it.
    copies = {t.endpoint: t for t in bus.parts.inbox.all() if t.state is TokenState.LIVE}
    assert set(copies) == {"billing", "shipping", "orders"}
    for endpoint in ("billing", "shipping"):
        assert copies[endpoint].lineage == Lineage("c1", root, "Placed", "orders")
    remind = copies["orders"]
    assert remind.lineage == Lineage("c1", root, "Remind", "orders")
    assert remind.due is not None and remind.due > time.time() + 3000  # kept on confirmation


def test_scheduled_lists_what_waits_for_its_time(storage: Storage, prefix: str) -> None:
    bus = flow(storage, prefix)
    bus.send(Order(order_id="o1"))
    drain(bus, ["orders"])
    [waiting] = scheduled(bus, "orders")
    assert waiting.message_type == "Remind" and waiting.due_at > time.time() + 3000
    assert scheduled(bus, "billing") == []
    assert scheduled(bus, "orders", now=waiting.due_at) == []  # due: no longer waiting


def test_a_conversation_shows_where_each_message_is(storage: Storage, prefix: str) -> None:
    bus = flow(storage, prefix)
    root = bus.send(Order(order_id="o1", amount=-5))
    assert [(m.message_type, m.destination, m.state)
            for m in conversation(bus, root).messages] == [("Order", "orders", "queued")]
    drain(bus, ["orders"])
    found = conversation(bus, root)
    assert found.correlation_id == root
    states = {(m.message_type or "?", m.destination): m.state for m in found.messages}
    assert states == {("Order", "orders"): "processed", ("Placed", "billing"): "queued",
                      ("Placed", "shipping"): "queued", ("Remind", "orders"): "scheduled"}
    assert found.messages[0].message_type == "Order"  # causes first
    drain(bus, ["billing", "shipping"], fail_fast=False)
    states = {(m.message_type or "?", m.destination): m.state
              for m in conversation(bus, root).messages}
    assert states[("Placed", "billing")] == "poisoned"
    assert states[("Placed", "shipping")] == "processed"
    # Asked by a message of it, the same conversation.
    placed = next(m for m in found.messages if m.message_type == "Placed")
    assert conversation(bus, placed.message_id).correlation_id == root
    assert conversation(bus, "no-such-thing").messages == []


def test_endpoint_stats_count_each_minute_of_a_period(storage: Storage, prefix: str) -> None:
    bus = flow(storage, prefix, stats_flush_seconds=3600)  # written when flushed, here
    start = time.time()
    for order in range(3):
        bus.send(Order(order_id=f"o{order}"))
    bus.send(Order(order_id="bad", amount=-1))
    drain(bus, fail_fast=False)
    bus.flush_stats()
    until = time.time() + 60
    orders = endpoint_stats(bus, "orders", start - 60, until)
    assert orders.processed == 4 and orders.failed == 0 and orders.poisoned == 0
    assert orders.mean_ms is not None and orders.max_ms is not None
    assert orders.mean_ms <= orders.max_ms
    assert sum(n for _, n in orders.per_minute) == 4
    billing = endpoint_stats(bus, "billing", start - 60, until)
    assert (billing.processed, billing.poisoned) == (3, 1)
    assert endpoint_stats(bus, "orders", until, until + 60).processed == 0


def test_statistics_can_be_turned_off(storage: Storage, prefix: str) -> None:
    bus = flow(storage, prefix, stats_flush_seconds=None)
    start = time.time()
    bus.send(Order(order_id="o1"))
    drain(bus)
    bus.flush_stats()
    assert endpoint_stats(bus, "orders", start - 60, time.time() + 60).processed == 0
