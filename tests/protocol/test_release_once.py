"""A release request names the deferral it saw: a completer that re-runs a finished record's
releases (one that read the slot before the record finished, then stalled; a repeated
orchestration step; maintenance) never releases a later deferral of the same message - on the
in-memory backend and Azurite."""

from __future__ import annotations

from bus import Bus, Command, Context, Endpoint
from bus.storage import Storage
from bus.testing import drain


class Ship(Command):
    order_id: str


class Pay(Command):
    order_id: str
    ship_id: str


def build(storage: Storage, prefix: str) -> tuple[Bus, list[int]]:
    orders, payments = Endpoint("orders"), Endpoint("payments")
    runs: list[int] = []  # the deferrals each run of Ship saw

    @orders.handles(Ship, partition=lambda m: m.order_id)
    def ship(message: Ship, ctx: Context) -> None:
        runs.append(ctx.deferrals)
        if ctx.deferrals < 2:
            ctx.defer()  # held twice: released once by Pay, once more by an operator

    @payments.handles(Pay, partition=lambda m: m.order_id)
    def pay(message: Pay, ctx: Context) -> None:
        ctx.release_deferred(message.ship_id, endpoint="orders")

    bus = Bus(storage, [orders, payments], prefix=prefix)
    bus.provision()
    return bus, runs


def test_a_repeated_release_does_not_release_the_next_deferral(storage: Storage,
                                                               prefix: str) -> None:
    bus, runs = build(storage, prefix)
    bus.send(Ship(order_id="o1"), message_id="ship-1")
    drain(bus)
    bus.send(Pay(order_id="o1", ship_id="ship-1"))
    drain(bus)
    assert runs == [0, 1]  # deferred, released by Pay, deferred again
    # A stale completer of Pay's (finished) record runs its release requests again.
    outbox = bus.parts.outbox("payments")
    dispatcher = bus.parts.dispatcher(outbox)
    record = outbox.load("o1").record
    assert record is not None and record.releases
    dispatcher.release_requested(record)
    drain(bus)
    assert runs == [0, 1]  # still deferred: that release was for the first deferral
    assert [d.message_id for d in bus.deferred("orders").list()] == ["ship-1"]
    assert bus.deferred("orders").release("ship-1")  # the operator's release
    drain(bus)
    assert runs == [0, 1, 2]


def test_an_operator_release_can_name_the_deferral_it_saw(storage: Storage,
                                                          prefix: str) -> None:
    bus, runs = build(storage, prefix)
    bus.send(Ship(order_id="o1"), message_id="ship-1")
    drain(bus)
    [seen] = bus.deferred("orders").list()
    assert seen.deferrals == 0
    bus.send(Pay(order_id="o1", ship_id="ship-1"))  # released and deferred again meanwhile
    drain(bus)
    assert runs == [0, 1]
    assert not bus.deferred("orders").release("ship-1", deferrals=seen.deferrals)
    drain(bus)
    assert runs == [0, 1]  # the deferral the operator looked at is gone; this one stays
    [now] = bus.deferred("orders").list()
    assert now.deferrals == 1
    assert bus.deferred("orders").release("ship-1", deferrals=now.deferrals)
    drain(bus)
    assert runs == [0, 1, 2]
