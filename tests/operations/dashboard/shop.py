"""A small app for the dashboard's tests: a handler that fails while ``FAILING`` is on (its
messages end in the poison queue), one that defers while ``HOLD`` is on, and one with sessions.

``python -m bus dashboard --app tests.operations.dashboard.shop`` serves it when ``SHOP_STORAGE`` (a
connection string) and ``SHOP_PREFIX`` are set, as the browser tests may.
"""

from __future__ import annotations

import os

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.retry import Reject
from bus.storage import Storage

FAILING = {"on": True}
HOLD = {"on": True}


class Charge(Command):
    order_id: str
    amount: int


class Ship(Command):
    order_id: str


class Track(Command):
    parcel: str
    event: str
    last: bool = False


def build(storage: Storage, prefix: str) -> Bus:
    payments = Endpoint("payments", retry=RetryPolicy(delays=(0.0,)))  # redeliver at once
    orders = Endpoint("orders")
    tracking = Endpoint("tracking", reorder_window=300)

    @payments.handles(Charge, partition=lambda m: m.order_id)
    def charge(message: Charge, ctx: Context) -> None:
        if FAILING["on"]:
            raise RuntimeError(f"gateway down for {message.order_id}")
        row = ctx.state.get("charge") or {"times": 0}
        ctx.state.put("charge", {"times": int(row["times"] or 0) + 1})

    @orders.handles(Ship, partition=lambda m: m.order_id)
    def ship(message: Ship, ctx: Context) -> None:
        if HOLD["on"]:
            ctx.defer()
            return
        row = ctx.state.get("shipped") or {"times": 0}
        ctx.state.put("shipped", {"times": int(row["times"] or 0) + 1})

    @tracking.handles(Track, partition=lambda m: m.parcel, session=lambda m: m.parcel)
    def track(message: Track, ctx: Context) -> None:
        if message.event == "lost":
            raise Reject("the parcel was lost")  # poisoned at once: the session waits on it
        ctx.session.state.setdefault("events", []).append(message.event)
        if message.last:
            ctx.session.close()

    bus = Bus(storage, [payments, orders, tracking], prefix=prefix,
              settings=Settings(max_delivery_count=2))
    bus.provision()
    return bus


def times(bus: Bus, endpoint: str, partition: str, key: str) -> int:
    row = bus.read_state(endpoint, partition, key)
    return int(row["times"]) if row else 0  # type: ignore[arg-type]


def _from_environment() -> Bus | None:
    connection = os.environ.get("SHOP_STORAGE")
    if not connection:
        return None
    from bus.adapters.select import open_storage

    return build(open_storage(connection), os.environ.get("SHOP_PREFIX", ""))


bus = _from_environment()
