"""Deferral (bus.protocol.outbox.deferral): set a message aside, fetch it by id, release it from a
handler or from outside - each effect once - on the in-memory backend and Azurite."""

from __future__ import annotations

import pytest

from bus import Bus, Command, Context, Endpoint, Event, Settings
from bus.hosting.worker import Worker
from bus.protocol.tokens.inbox import TokenState
from bus.seams import Seams
from bus.storage import Entity, NotFound, Storage
from bus.testing import drain
from bus.testing.seamed import seamed_bus


class Ship(Command):
    order_id: str
    label: str = ""


class PaymentReceived(Event):
    order_id: str


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def build(storage: Storage, prefix: str, clock: Clock | None = None) -> Bus:
    orders = Endpoint("orders")

    @orders.handles(Ship, partition=lambda m: m.order_id)
    def ship(message: Ship, ctx: Context) -> None:
        if not (ctx.state.get("paid") or {}).get("yes"):
            ctx.state.put("waiting", {"ship": ctx.message_id, "deferrals": ctx.deferrals})
            ctx.defer()
            return
        row = ctx.state.get("shipped") or {"n": 0}
        ctx.state.put("shipped", {"n": int(row["n"] or 0) + 1, "deferrals": ctx.deferrals,
                                  "label": len(message.label)})

    @orders.handles(PaymentReceived, partition=lambda m: m.order_id)
    def paid(message: PaymentReceived, ctx: Context) -> None:
        ctx.state.put("paid", {"yes": True})
        waiting = ctx.state.get("waiting")
        if waiting:
            ctx.release_deferred(str(waiting["ship"]))

    bus = seamed_bus(Seams(clock=clock or Clock()), storage, [orders], prefix=prefix,
                     settings=Settings(release_resend_seconds=60))
    bus.provision()
    return bus


def row(bus: Bus, order_id: str, key: str) -> dict[str, object] | None:
    try:
        return dict(bus.storage.tables.get(bus.names.state_table("orders"), order_id,
                                           key).properties)
    except NotFound:
        return None


def test_a_deferred_message_waits_until_it_is_released_by_id(storage: Storage,
                                                             prefix: str) -> None:
    bus = build(storage, prefix)
    ship_id = bus.send(Ship(order_id="o1"))
    assert drain(bus).total() == {"deferred": 1}
    # Set aside with the handler's state, committed together; nothing processed it.
    assert row(bus, "o1", "waiting") == {"ship": ship_id, "deferrals": 0}
    assert row(bus, "o1", "shipped") is None
    deferred = bus.deferred("orders")
    [listed] = deferred.list()
    assert (listed.message_id, listed.message_type, listed.deferrals) == (ship_id, "Ship", 0)
    fetched = deferred.get(ship_id)
    assert fetched is not None and fetched.envelope.destination == "orders"
    assert deferred.get("no-such-message") is None
    assert deferred.release(ship_id) is True
    assert drain(bus).total() == {"deferred": 1}  # not paid yet: the handler defers it again
    again = deferred.get(ship_id)
    assert again is not None and again.deferrals == 1
    bus.storage.tables.replace(bus.names.state_table("orders"), _paid("o1"))
    assert deferred.release(ship_id) is True
    assert drain(bus).total() == {"processed": 1}
    assert row(bus, "o1", "shipped") == {"n": 1, "deferrals": 2, "label": 0}
    assert deferred.release(ship_id) is False and deferred.list() == []  # processed: gone
    bus.sweeper().sweep()
    assert bus.parts.inbox.stale_index() == [] and bus.parts.inbox.all() == []


def test_a_handler_releases_a_deferred_message_when_it_commits(storage: Storage,
                                                               prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(Ship(order_id="o2", label="x" * 60_000))  # a claim-checked payload
    assert drain(bus).total() == {"deferred": 1}
    assert len(bus.parts.payloads.refs()) == 1
    bus.sweeper().sweep()
    assert len(bus.parts.payloads.refs()) == 1  # kept while the message waits
    bus.publish(PaymentReceived(order_id="o2"))
    outcomes = drain(bus).total()
    assert outcomes == {"processed": 2}  # the payment, then the released Ship
    assert row(bus, "o2", "shipped") == {"n": 1, "deferrals": 1, "label": 60_000}
    assert bus.deferred("orders").list() == [] and bus.parts.payloads.refs() == []


def test_copies_of_a_deferred_message_are_duplicates(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(Ship(order_id="o3"))
    queue = bus.names.queue("orders")
    [leased] = storage.queues.receive(queue, max_messages=1, lease=0.5)
    storage.queues.send(queue, leased.body)  # a second copy of the same signal
    storage.queues.extend(queue, leased, lease=0)
    assert drain(bus).total() == {"deferred": 1, "duplicate": 1}
    [token] = bus.parts.inbox.all()
    assert token.state is TokenState.DEFERRED


def test_the_sweeper_finishes_a_release_that_stopped_half_way(storage: Storage,
                                                              prefix: str) -> None:
    clock = Clock()
    bus = build(storage, prefix, clock)
    ship_id = bus.send(Ship(order_id="o4"))
    drain(bus)
    bus.storage.tables.replace(bus.names.state_table("orders"), _paid("o4"))
    token = bus.parts.inbox.find("orders", ship_id)
    assert token is not None and bus.parts.inbox.release(token, clock()) is not None
    # ... and the releasing process died before it sent the signal.
    assert drain(bus).total() == {} and bus.deferred("orders").list() == []
    assert bus.sweeper().sweep().released_signals_resent == 0  # too early to tell
    clock.now += 61
    assert bus.sweeper().sweep().released_signals_resent == 1
    assert drain(bus).total() == {"processed": 1}
    assert row(bus, "o4", "shipped") == {"n": 1, "deferrals": 1, "label": 0}


@pytest.mark.parametrize("batched", [True, False])
def test_deferral_through_the_batch_path(storage: Storage, prefix: str,
                                         batched: bool) -> None:
    bus = build(storage, prefix)
    ids = [bus.send(Ship(order_id=f"b{i}")) for i in range(5)]
    worker = Worker(bus, "orders", retry_delay=0, batched=batched)
    while worker.poll_once():
        pass
    assert worker.outcomes == {"deferred": 5}
    assert sorted(m.message_id for m in bus.deferred("orders").list()) == sorted(ids)
    for i in range(5):
        bus.publish(PaymentReceived(order_id=f"b{i}"))
    while worker.poll_once():
        pass
    assert worker.outcomes == {"deferred": 5, "processed": 10}
    assert all(row(bus, f"b{i}", "shipped") == {"n": 1, "deferrals": 1, "label": 0}
               for i in range(5))


def _paid(order_id: str) -> Entity:
    """The payment recorded behind the handlers' backs (the test's shortcut)."""
    return Entity(order_id, "paid", {"yes": True})
