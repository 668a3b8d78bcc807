"""The app the browser tests drive the dashboard against: orders, billing, shipping and parcel
tracking, with traffic that leaves something on every page.

* ``PlaceOrder`` -> orders -> ``OrderPlaced`` -> billing and shipping. Billing declines the
  cards of the customers in ``DECLINED`` (a RuntimeError on every delivery: poisoned after
  the second), so their orders end as one group on the Poisoned messages page until the test
  clears the set and replays the group.
* ``ShipOrder`` waits at orders (deferred) until its order is paid (``PaymentReceived``).
* ``Track`` is handled in sessions (one per parcel) at tracking, which blocks on a gap
  (``skip_gaps=False``, a one-second reorder window): an event ``lost`` is rejected, so the
  events behind it wait and the session is stuck.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bus import Bus, Command, Context, Endpoint, Event, RetryPolicy, Settings
from bus.retry import Reject
from bus.storage import NotFound, Storage
from bus.testing import drain

REORDER_WINDOW = 1.0


class PlaceOrder(Command):
    order_id: str
    customer: str
    amount_cents: int


class OrderPlaced(Event):
    order_id: str
    customer: str
    amount_cents: int


class ShipOrder(Command):
    order_id: str


class PaymentReceived(Event):
    order_id: str


class Track(Command):
    parcel: str
    event: str


@dataclass
class Shop:
    """A provisioned bus, what the traffic left, and the switch that makes billing fail."""

    bus: Bus
    declined: set[str] = field(default_factory=set)
    orders: dict[str, str] = field(default_factory=dict)
    """order id -> customer, every order sent."""
    declined_orders: list[str] = field(default_factory=list)
    conversation: str = ""
    """The correlation id of one whole order: placed, billed and shipped."""
    deferred: str = ""
    """The message id of the ShipOrder waiting for its payment."""
    scheduled: str = ""
    stuck_session: str = ""

    def charged(self, order_id: str) -> int:
        return _count(self.bus, "billing", order_id, "charge", "times")

    def packed(self, order_id: str) -> int:
        return _count(self.bus, "shipping", order_id, "shipment", "packed")

    def poisoned(self, endpoint: str) -> int:
        return len(self.bus.poisoned(endpoint).entries())


def build(storage: Storage, prefix: str) -> Shop:
    orders = Endpoint("orders")
    billing = Endpoint("billing", retry=RetryPolicy(delays=(0.0,)))  # redelivered at once
    shipping = Endpoint("shipping")
    tracking = Endpoint("tracking", reorder_window=REORDER_WINDOW, skip_gaps=False)
    declined: set[str] = set()

    @orders.handles(PlaceOrder, partition=lambda m: m.order_id)
    def place(message: PlaceOrder, ctx: Context) -> None:
        ctx.state.put("order", {"customer": message.customer,
                                "amount_cents": message.amount_cents})
        ctx.publish(OrderPlaced(**message.model_dump()))

    @orders.handles(ShipOrder, partition=lambda m: m.order_id)
    def ship(message: ShipOrder, ctx: Context) -> None:
        if not (ctx.state.get("paid") or {}).get("yes"):
            ctx.state.put("waiting", {"ship": ctx.message_id})
            ctx.defer()
            return
        ctx.state.put("shipped", {"yes": True})

    @orders.handles(PaymentReceived, partition=lambda m: m.order_id)
    def paid(message: PaymentReceived, ctx: Context) -> None:
        ctx.state.put("paid", {"yes": True})
        waiting = ctx.state.get("waiting")
        if waiting:
            ctx.release_deferred(str(waiting["ship"]))

    @billing.handles(OrderPlaced, partition=lambda m: m.order_id)
    def charge(message: OrderPlaced, ctx: Context) -> None:
        if message.customer in declined:
            raise RuntimeError(f"card declined for {message.customer}")
        row = ctx.state.get("charge") or {"times": 0}
        ctx.state.put("charge", {"times": int(row["times"] or 0) + 1,
                                 "amount_cents": message.amount_cents})

    @shipping.handles(OrderPlaced, partition=lambda m: m.order_id)
    def pack(message: OrderPlaced, ctx: Context) -> None:
        row = ctx.state.get("shipment") or {"packed": 0}
        ctx.state.put("shipment", {"packed": int(row["packed"] or 0) + 1})

    @tracking.handles(Track, partition=lambda m: m.parcel, session=lambda m: m.parcel)
    def track(message: Track, ctx: Context) -> None:
        if message.event == "lost":
            raise Reject(f"parcel {message.parcel} reported lost")
        ctx.session.state.setdefault("history", []).append(message.event)

    bus = Bus(storage, [orders, billing, shipping, tracking], prefix=prefix,
              settings=Settings(max_delivery_count=2))
    bus.provision()
    return Shop(bus, declined)


def with_traffic(shop: Shop) -> Shop:
    """Orders processed, three poisoned at billing (one group), a parcel's session stuck on a
    rejected event, an undecodable body poisoned at orders, a ShipOrder deferred, a PlaceOrder
    scheduled an hour out, and three orders still in the orders queue."""
    bus = shop.bus
    shop.declined.add("c-declined")
    for i in range(1, 9):
        customer = "c-declined" if i in (3, 5, 7) else f"c-{i % 3}"
        order_id = f"o-{i}"
        bus.send(PlaceOrder(order_id=order_id, customer=customer, amount_cents=1000 + i),
                 correlation_id=f"conv-{order_id}")
        shop.orders[order_id] = customer
        if customer == "c-declined":
            shop.declined_orders.append(order_id)
    shop.conversation = "conv-o-1"
    shop.deferred = bus.send(ShipOrder(order_id="o-2"), correlation_id="conv-o-2")
    for event in ("picked", "lost", "delivered"):
        bus.send(Track(parcel="p-7", event=event))
    shop.stuck_session = "p-7"
    bus.storage.queues.send(bus.names.queue("orders"), "%%% not base64 %%%")
    drain(bus, fail_fast=False)
    bus.flush_stats()  # the per-minute statistics now, not in stats_flush_seconds
    shop.scheduled = bus.send(PlaceOrder(order_id="o-later", customer="c-1", amount_cents=999),
                              delay=3600.0)
    for i in (20, 21, 22):  # waiting in the orders queue: a depth and an oldest age
        bus.send(PlaceOrder(order_id=f"o-{i}", customer="c-2", amount_cents=500))
    _wait_stuck(bus, "tracking", shop.stuck_session)
    return shop


def _wait_stuck(bus: Bus, endpoint: str, session: str) -> None:
    """Until the session has waited longer than its reorder window (one second)."""
    sessions = bus.sessions(endpoint)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = sessions.get(session)
        if info is not None and info.stuck(sessions.now(), REORDER_WINDOW):
            return
        time.sleep(0.2)
    raise AssertionError(f"session {session} of {endpoint} is not stuck: {sessions.get(session)}")


def _count(bus: Bus, endpoint: str, partition: str, key: str, field_name: str) -> int:
    try:
        row = bus.storage.tables.get(bus.names.state_table(endpoint), partition, key)
    except NotFound:
        return 0
    return int(row.properties[field_name])  # type: ignore[arg-type]
