"""Back-pressure (bus.protocol.copies.backpressure): bounded endpoint queues refuse sends and the
message waits in the sender's outbox; bounded in-flight sends - in-memory and Azurite."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from bus import (
    Bus,
    Command,
    ConfigurationError,
    Context,
    Endpoint,
    QueueFull,
    SendFailed,
    Settings,
)
from bus.hosting.worker import Worker
from bus.protocol.copies.bundles import parts
from bus.storage import NotFound, Queues, Storage
from bus.testing.transport import ForwardingQueues


class Order(Command):
    order_id: str


class Pick(Command):
    order_id: str


class Unrouted(Command):
    pass


def build(storage: Storage, prefix: str, *, in_flight: int = 32, group: bool = True) -> Bus:
    orders = Endpoint("orders")
    warehouse = Endpoint("warehouse", max_queue_depth=2)

    @orders.handles(Order, partition=lambda m: m.order_id)
    def order(message: Order, ctx: Context) -> None:
        count(ctx, "ordered")
        ctx.send(Pick(order_id=message.order_id))

    @warehouse.handles(Pick, partition=lambda m: m.order_id)
    def pick(message: Pick, ctx: Context) -> None:
        count(ctx, "picked")

    # depth_check_seconds=0: every signal looks at the queue (the default trusts a depth 1 s).
    bus = Bus(storage, [orders, warehouse], prefix=prefix, settings=Settings(
        depth_check_seconds=0, max_in_flight_sends=in_flight, group_sends=group))
    bus.provision()
    return bus


def count(ctx: Context, key: str) -> None:
    row = ctx.state.get(key) or {"n": 0}
    ctx.state.put(key, {"n": int(row["n"] or 0) + 1})


def counted(bus: Bus, endpoint: str, partition: str, key: str) -> int:
    try:
        row = bus.storage.tables.get(bus.names.state_table(endpoint), partition, key)
    except NotFound:
        return 0
    return int(row.properties["n"])  # type: ignore[arg-type]


def depth(bus: Bus, endpoint: str) -> int:
    return bus.storage.queues.depth(bus.names.queue(endpoint))


def drain(worker: Worker) -> None:
    while worker.poll_once():
        pass


def test_a_client_send_to_a_full_queue_is_refused_before_anything_is_written(
        storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(Pick(order_id="a"))
    bus.send(Pick(order_id="b"))
    tokens = len(bus.parts.inbox.all())
    with pytest.raises(QueueFull, match=r"'warehouse' is full \(2 messages, limit 2\)"):
        bus.send(Pick(order_id="c"))
    assert depth(bus, "warehouse") == 2 and len(bus.parts.inbox.all()) == tokens
    drain(Worker(bus, "warehouse", retry_delay=0))
    bus.send(Pick(order_id="c"))  # room again
    drain(Worker(bus, "warehouse", retry_delay=0))
    assert [counted(bus, "warehouse", o, "picked") for o in "abc"] == [1, 1, 1]


def test_a_handler_send_to_a_full_queue_waits_in_the_outbox(storage: Storage,
                                                            prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(Pick(order_id="x"))
    bus.send(Pick(order_id="y"))  # the warehouse queue is now full
    bus.send(Order(order_id="o1"))
    orders = Worker(bus, "orders", retry_delay=0)
    assert orders.poll_once() == 1
    # The order's effect is committed once; its Pick has a token but no signal yet.
    assert counted(bus, "orders", "o1", "ordered") == 1 and depth(bus, "warehouse") == 2
    waiting = [t for t in bus.parts.inbox.all() if t.endpoint == "warehouse"]
    assert len(waiting) == 3 and all(t.processable for t in waiting)  # live or pending
    assert depth(bus, "orders") == 1  # the Order signal was released, not acknowledged
    assert orders.poll_once() == 1 and depth(bus, "warehouse") == 2  # still full: waits
    drain(Worker(bus, "warehouse", retry_delay=0))  # room
    drain(orders)  # the redelivered Order finishes its record: the Pick goes out
    drain(Worker(bus, "warehouse", retry_delay=0))
    assert counted(bus, "orders", "o1", "ordered") == 1
    assert counted(bus, "warehouse", "o1", "picked") == 1
    assert bus.parts.inbox.all() == [] and depth(bus, "orders") == 0


def test_send_once_keeps_a_refused_message_in_its_ledger(storage: Storage,
                                                         prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(Pick(order_id="a"))
    bus.send(Pick(order_id="b"))
    with pytest.raises(QueueFull):
        bus.send_once(Pick(order_id="c"), message_id="pick-c")
    drain(Worker(bus, "warehouse", retry_delay=0))
    assert bus.send_once(Pick(order_id="c"), message_id="pick-c") is False  # recorded before
    drain(Worker(bus, "warehouse", retry_delay=0))
    assert counted(bus, "warehouse", "c", "picked") == 1


class Overlap(ForwardingQueues):
    """Each send takes 20 ms and the most concurrent sends are noted."""

    def __init__(self, inner: Queues) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.sends = 0

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        with self._lock:
            self.sends += 1
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(0.02)
            self._inner.send(queue, body, delay=delay)
        finally:
            with self._lock:
                self.now -= 1


@pytest.mark.parametrize(("max_in_flight", "bus_limit", "bound"), [(4, 32, 4), (8, 2, 2)])
def test_send_many_keeps_a_bounded_number_of_sends_in_flight(
        storage: Storage, prefix: str, max_in_flight: int, bus_limit: int, bound: int) -> None:
    # Without grouping each send makes its own requests, as many at once as allowed.
    overlap = Overlap(storage.queues)
    bus = build(Storage(overlap, storage.blobs, storage.tables), prefix, in_flight=bus_limit,
                group=False)
    ids = bus.send_many([Order(order_id=f"o{i}") for i in range(24)],
                        max_in_flight=max_in_flight)
    assert len(set(ids)) == 24 and depth(bus, "orders") == 24
    assert 2 <= overlap.most <= bound


@pytest.mark.parametrize("max_in_flight", [4, 8])
def test_send_many_groups_its_sends(storage: Storage, prefix: str, max_in_flight: int) -> None:
    # With grouping (the default) the sends that wait while one flush is on the wire share
    # the next: one flush at a time, fewer queue messages than sends, every signal there.
    overlap = Overlap(storage.queues)
    bus = build(Storage(overlap, storage.blobs, storage.tables), prefix)
    ids = bus.send_many([Order(order_id=f"o{i}") for i in range(24)],
                        max_in_flight=max_in_flight)
    assert len(set(ids)) == 24 and overlap.most == 1
    assert overlap.sends == depth(bus, "orders") < 24
    leased = storage.queues.receive(bus.names.queue("orders"), max_messages=32, lease=60)
    assert sorted(json.loads(base64.b64decode(p.body))["message_id"]
                  for p in parts(leased)) == sorted(ids)


def test_send_many_reports_which_sends_failed(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    with pytest.raises(SendFailed, match="1 of 3 sends failed") as failed:
        bus.send_many([Order(order_id="a"), Unrouted(), Order(order_id="b")])
    assert sorted(failed.value.sent) == [0, 2] and list(failed.value.errors) == [1]
    assert "no destination for command Unrouted" in str(failed.value.errors[1])
    assert depth(bus, "orders") == 2


def test_limits_are_checked_at_start_up() -> None:
    with pytest.raises(ConfigurationError, match="max_queue_depth must be a positive"):
        Endpoint("warehouse", max_queue_depth=0)
    with pytest.raises(ConfigurationError, match="max_queue_depth must be a positive"):
        Bus(storage=None, max_queue_depths={"billing": -5})  # type: ignore[arg-type]
