"""A deferral committed while its message's token is poisoned is still applied.

A handler defers its message and sends a note to a full queue: the commit holds, the record
waits in the outbox for room. If the host then gives up on the message (its function kept
failing on the full queue) and maintenance adopts the host's copy, the token is poisoned while
the committed record still has to set it aside. The next message of the partition must
complete that record, not commit over it as if it were finished: else the deferral is lost,
and replaying the poisoned message runs the handler a second time for the same deferral - what the
simulation found (seed 59). On the in-memory backend and Azurite."""

from __future__ import annotations

from bus import Bus, Command, Context, Endpoint, Settings
from bus.hosting.worker import Worker
from bus.protocol.tokens.inbox import TokenState
from bus.storage import Storage
from bus.testing import drain


class Ship(Command):
    order_id: str
    n: int


class Note(Command):
    order_id: str


def build(storage: Storage, prefix: str) -> tuple[Bus, list[tuple[int, int]]]:
    orders, notes = Endpoint("orders"), Endpoint("notes", max_queue_depth=1)
    runs: list[tuple[int, int]] = []  # (n, deferrals seen) per run of Ship's handler

    @orders.handles(Ship, partition=lambda m: m.order_id)
    def ship(message: Ship, ctx: Context) -> None:
        runs.append((message.n, ctx.deferrals))
        ctx.send(Note(order_id=message.order_id))
        if message.n == 1 and ctx.deferrals == 0:
            ctx.defer()

    @notes.handles(Note, partition=lambda m: m.order_id)
    def note(message: Note, ctx: Context) -> None:
        pass

    # Depths read afresh for every send: the queue is full from the first Note on.
    bus = Bus(storage, [orders, notes], prefix=prefix,
              settings=Settings(depth_check_seconds=0.0, crash_retry_delays=()))
    bus.provision()
    return bus, runs


def host_gives_up(bus: Bus, endpoint: str) -> None:
    """What the Functions host does after maxDequeueCount failed deliveries: the queue
    message copied unchanged to the poison queue, then deleted."""
    queue = bus.names.queue(endpoint)
    [message] = bus.storage.queues.receive(queue, max_messages=1, lease=30)
    bus.storage.queues.send(bus.names.poison_queue(endpoint), message.body)
    bus.storage.queues.delete(queue, message)


def test_a_deferral_whose_token_was_parked_meanwhile_is_applied(storage: Storage,
                                                                 prefix: str) -> None:
    bus, runs = build(storage, prefix)
    bus.send(Note(order_id="o1"))  # the notes queue is now full
    ship_id = bus.send(Ship(order_id="o1", n=1))
    orders = Worker(bus, "orders", retry_delay=0)
    assert orders.poll_once() == 1  # committed (deferred, a note to send); waits for room
    assert runs == [(1, 0)]
    host_gives_up(bus, "orders")
    bus.poisoned("orders").adopt()
    [token] = [t for t in bus.parts.inbox.all() if t.endpoint == "orders"]
    assert token.state is TokenState.POISONED
    drain(bus, ["notes"])  # room again
    bus.send(Ship(order_id="o1", n=2))  # the partition's next message
    drain(bus, ["orders", "notes"], fail_fast=False)
    # The first Ship's record was completed: its message is deferred, not lost.
    assert [d.message_id for d in bus.deferred("orders").list()] == [ship_id]
    bus.poisoned("orders").replay()  # the entry is stale now: nothing runs again
    drain(bus, ["orders", "notes"], fail_fast=False)
    assert runs == [(1, 0), (2, 0)]
    assert bus.deferred("orders").release(ship_id)
    drain(bus, ["orders", "notes"])
    assert runs == [(1, 0), (2, 0), (1, 1)]
