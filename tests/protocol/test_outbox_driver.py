"""The outbox driver's steps (the Durable orchestration's activities) act only on the record
they were started for, even when the same message id comes back to the same partition - on
the in-memory backend and Azurite."""

from __future__ import annotations

import base64

from bus import Bus, Command, Context, Endpoint
from bus.hosting.functions.trigger import QueueTrigger
from bus.protocol.delivery import Handoff
from bus.storage import Storage
from bus.testing import drain


class Order(Command):
    order_id: str


class Bill(Command):
    order_id: str


def build(storage: Storage, prefix: str) -> tuple[Bus, list[str]]:
    orders, billing = Endpoint("orders"), Endpoint("billing")
    billed: list[str] = []

    @orders.handles(Order, partition=lambda m: m.order_id)
    def order(message: Order, ctx: Context) -> None:
        ctx.send(Bill(order_id=message.order_id))

    @billing.handles(Bill, partition=lambda m: m.order_id)
    def bill(message: Bill, ctx: Context) -> None:
        billed.append(message.order_id)

    bus = Bus(storage, [orders, billing], prefix=prefix)
    bus.provision()
    return bus, billed


def handed_off(bus: Bus) -> Handoff:
    """Deliver the one signal on the orders queue through the trigger, dispatch left to an
    orchestration (as with ``BUS_INLINE_DISPATCH_MAX=0``)."""
    trigger = QueueTrigger(bus, "orders", max_dequeue_count=5, inline_dispatch_max=0)
    [message] = bus.storage.queues.receive(bus.names.queue("orders"), max_messages=1, lease=30)
    delivery = trigger.deliver(base64.b64decode(message.body), 1)
    bus.storage.queues.delete(bus.names.queue("orders"), message)
    assert delivery.handoff is not None
    return delivery.handoff


def test_a_late_step_of_an_earlier_record_leaves_a_later_one_of_the_same_id_alone(
        storage: Storage, prefix: str) -> None:
    bus, billed = build(storage, prefix)
    driver = bus.parts.outbox_driver("orders")
    bus.send(Order(order_id="o1"), message_id="m1")
    first = handed_off(bus).key
    assert driver.prepare(first) == 1 and driver.signal(first, [0]) == 1
    assert driver.finish(first)
    # The client sends the same message id again (a new copy: a new attempt id); its record
    # is committed in the same slot and prepared, and its orchestration stops before sending.
    bus.send(Order(order_id="o1"), message_id="m1")
    second = handed_off(bus).key
    assert driver.prepare(second) == 1
    # A repeated finish of the first orchestration must not finish the second record.
    assert not driver.finish(first)
    assert driver.signal(second, [0]) == 1 and driver.finish(second)
    drain(bus, ["billing"])
    assert billed == ["o1", "o1"]  # two sends, two bills: each record dispatched once


def test_maintenance_goes_on_past_a_record_that_fails(storage: Storage, prefix: str) -> None:
    orders, billing = Endpoint("orders"), Endpoint("billing")

    @orders.handles(Order, partition=lambda m: m.order_id)
    def order(message: Order, ctx: Context) -> None:
        # o1's bill goes to an endpoint whose queue does not exist: its dispatch fails.
        ctx.send(Bill(order_id=message.order_id), to="gone" if message.order_id == "o1"
                 else "billing")

    @billing.handles(Bill, partition=lambda m: m.order_id)
    def bill(message: Bill, ctx: Context) -> None:
        pass

    bus = Bus(storage, [orders, billing], prefix=prefix,
              routes={"Refund": "gone"})  # a destination of its own, never provisioned
    bus.provision()
    for order_id in ("o1", "o2"):
        bus.send(Order(order_id=order_id))
        handed_off(bus)  # committed, left to an orchestration that never runs
    assert bus.parts.outbox_driver("orders").recover(0) == 1  # o2's; o1's fails and is logged
    assert bus.storage.queues.depth(bus.names.queue("billing")) == 1
