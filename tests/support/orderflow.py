"""A small order flow used by the scenario tests: a command, an event with two subscribers."""

from __future__ import annotations

from bus import Bus, Command, Context, Endpoint, Event, RetryPolicy
from bus.seams import Seams
from bus.storage import Storage
from bus.testing.seamed import seamed_bus


class PlaceOrder(Command):
    order_id: str
    amount: int
    note: str = ""


class OrderPlaced(Event):
    order_id: str
    amount: int


class Flaky(Command):
    order_id: str


def build(storage: Storage, prefix: str, seams: Seams | None = None, **kwargs: object) -> Bus:
    orders, billing, shipping = Endpoint("orders"), Endpoint("billing"), Endpoint("shipping")

    @orders.handles(PlaceOrder, partition=lambda m: m.order_id)
    def place(message: PlaceOrder, ctx: Context) -> None:
        ctx.state.put("order", {"amount": message.amount, "note_size": len(message.note)})
        ctx.publish(OrderPlaced(order_id=message.order_id, amount=message.amount))

    @orders.handles(Flaky, partition=lambda m: m.order_id,
                    retry=RetryPolicy(delays=(0.0,)))  # redelivered at once: quick tests
    def flaky(message: Flaky, ctx: Context) -> None:
        raise RuntimeError(f"card declined for {message.order_id}")

    def count(message: OrderPlaced, ctx: Context) -> None:
        row = ctx.state.get("seen") or {"times": 0}
        times = row["times"]
        assert isinstance(times, int)
        ctx.state.put("seen", {"times": times + 1, "amount": message.amount})

    billing.handles(OrderPlaced, partition=lambda m: m.order_id)(count)
    shipping.handles(OrderPlaced, partition=lambda m: m.order_id)(count)
    bus = seamed_bus(seams or Seams(), storage, [orders, billing, shipping], prefix=prefix,
                     **kwargs)  # type: ignore[arg-type]
    bus.provision()
    return bus


def state(bus: Bus, endpoint: str, partition: str, key: str) -> dict[str, object] | None:
    from bus.storage import NotFound

    try:
        entity = bus.storage.tables.get(bus.names.state_table(endpoint), partition, key)
    except NotFound:
        return None
    return dict(entity.properties)
