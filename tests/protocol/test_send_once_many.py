"""``Bus.send_once_many``: many messages, each once per message id, in a few requests - on the
in-memory backend and Azurite (``bus.protocol.send.marked``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bus import Bus, Command, Context, Endpoint, Event
from bus.errors import TransientError
from bus.protocol.tokens.inbox import TokenState
from bus.storage import Entity, Queues, Storage, TableOp, Tables
from bus.testing import drain
from bus.testing.counting import counting_storage


class PlaceOrder(Command):
    order_id: str


class OrderPlaced(Event):
    order_id: str


def build(storage: Storage, prefix: str) -> tuple[Bus, list[str]]:
    orders, billing, shipping = Endpoint("orders"), Endpoint("billing"), Endpoint("shipping")
    seen: list[str] = []

    @orders.handles(PlaceOrder, partition=lambda m: m.order_id)
    def place(message: PlaceOrder, ctx: Context) -> None:
        seen.append(f"orders:{message.order_id}")

    for endpoint in (billing, shipping):
        @endpoint.handles(OrderPlaced, partition=lambda m: m.order_id)
        def placed(message: OrderPlaced, ctx: Context, name: str = endpoint.name) -> None:
            seen.append(f"{name}:{message.order_id}")

    bus = Bus(storage, [orders, billing, shipping], prefix=prefix)
    bus.provision()
    return bus, seen


def orders(n: int, start: int = 0) -> list[tuple[PlaceOrder | OrderPlaced, str]]:
    return [(PlaceOrder(order_id=f"o{i}"), f"place-o{i}") for i in range(start, start + n)]


def test_each_message_is_sent_once_however_often_the_call_is_made(storage: Storage,
                                                                   prefix: str) -> None:
    bus, seen = build(storage, prefix)
    assert bus.send_once_many(orders(120)) == [True] * 120
    assert bus.send_once_many(orders(120)) == [False] * 120  # before they are processed
    drain(bus)
    assert sorted(seen) == sorted(f"orders:o{i}" for i in range(120))
    # After they are processed; with 5 new ones among them.
    assert bus.send_once_many(orders(125)) == [False] * 120 + [True] * 5
    drain(bus)
    assert len(seen) == 125 and len(set(seen)) == 125


def test_an_event_goes_to_every_subscriber_once(storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    events = [(OrderPlaced(order_id=f"o{i}"), f"placed-o{i}") for i in range(3)]
    assert bus.send_once_many(events) == [True] * 3
    assert bus.send_once_many(events) == [False] * 3
    drain(bus)
    assert sorted(seen) == sorted(f"{e}:o{i}" for e in ("billing", "shipping") for i in range(3))


def test_the_same_id_twice_in_one_call_is_one_message(storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    twice = [(PlaceOrder(order_id="a"), "same"), (PlaceOrder(order_id="b"), "same")]
    assert bus.send_once_many(twice) == [True, True]  # one message: both rows are "it"
    drain(bus)
    assert seen == ["orders:a"]


class SignalsFail:
    """Queues whose sends fail (the process died after its tokens were created)."""

    def __init__(self, inner: Queues) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def send(self, queue: str, body: str, **options: object) -> None:
        raise TransientError("injected: the process died before its signals")


def test_a_call_that_stopped_before_its_signals_is_finished_by_the_next(
        storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    failing = Storage(queues=SignalsFail(storage.queues),  # type: ignore[arg-type]
                      blobs=storage.blobs, tables=storage.tables)
    broken, _ = build(failing, prefix)
    broken.parts.settings = broken.settings.model_copy(update={"send_attempts": 1})
    with pytest.raises(TransientError):
        broken.send_once_many(orders(3))
    tokens = [t for t in bus.parts.inbox.all() if t.endpoint == "orders"]
    assert len(tokens) == 3 and all(t.state is TokenState.LIVE for t in tokens)
    drain(bus)
    assert seen == []  # tokens, no signals
    assert bus.send_once_many(orders(3)) == [False] * 3  # sent before: only the signals go
    drain(bus)
    assert sorted(seen) == ["orders:o0", "orders:o1", "orders:o2"]


def test_a_call_made_again_before_consumption_sends_no_signal_again(storage: Storage,
                                                                   prefix: str) -> None:
    """Each mark notes that its signal went, once the send answered: a second call finds the
    copies waiting with their signals sent and leaves the queue as it was."""
    bus, _ = build(storage, prefix)
    queue = bus.names.queue("orders")
    bus.send_once_many(orders(120))
    waiting = storage.queues.depth(queue)
    assert 0 < waiting < 120  # bundled
    marks = bus.parts.inbox.marks("orders", [f"place-o{i}" for i in range(120)])
    assert len(marks) == 120 and all(mark.signalled for mark in marks.values())
    assert bus.send_once_many(orders(120)) == [False] * 120
    assert storage.queues.depth(queue) == waiting
    assert drain(bus).total() == {"processed": 120}


class NotesFail:
    """Tables whose conditional replaces fail (the process died after its signals went)."""

    def __init__(self, inner: Tables) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def transact(self, table: str, ops: Sequence[TableOp]) -> list[str]:
        if any(op.kind == "replace" for op in ops):
            raise TransientError("injected: the process died before noting its signals")
        return self._inner.transact(table, ops)


def test_a_signal_whose_note_failed_goes_again_with_the_next_call(storage: Storage,
                                                                  prefix: str) -> None:
    bus, seen = build(storage, prefix)
    failing = Storage(queues=storage.queues, blobs=storage.blobs,
                      tables=NotesFail(storage.tables))  # type: ignore[arg-type]
    broken, _ = build(failing, prefix)
    assert broken.send_once_many(orders(3)) == [True] * 3  # the signals went all the same
    marks = bus.parts.inbox.marks("orders", ["place-o0", "place-o1", "place-o2"])
    assert not any(mark.signalled for mark in marks.values())
    assert bus.send_once_many(orders(3)) == [False] * 3  # sends them again, and notes it
    assert drain(bus).total() == {"processed": 3, "duplicate": 3}
    assert sorted(seen) == ["orders:o0", "orders:o1", "orders:o2"]


def test_a_note_names_its_copy_so_a_mark_made_again_is_not_taken_for_noted(
        storage: Storage, prefix: str) -> None:
    """A note of a mark that changed since it was made (swept, and made again for a new copy
    of the message id) is not written; and a mark whose note names another attempt id does
    not count as signalled."""
    bus, _ = build(storage, prefix)
    inbox = bus.parts.inbox
    made = inbox.create_marked("orders", [("a" * 32, "m1", None)], 1.0)
    assert [mark.signalled for mark in made] == [False]
    table = bus.names.tokens_table
    row = storage.tables.get_many(table, "orders", ["~sent~m1"])["~sent~m1"]
    storage.tables.replace(table, Entity(row.partition_key, row.row_key, {
        **row.properties, "attempt_id": "b" * 32}))  # made again for another copy
    inbox.note_signalled(made)  # the old mark's etag: nothing written
    assert not inbox.marks("orders", ["m1"])["m1"].signalled
    storage.tables.replace(table, Entity(row.partition_key, row.row_key, {
        **row.properties, "attempt_id": "b" * 32, "signalled": "a" * 32}))
    assert not inbox.marks("orders", ["m1"])["m1"].signalled
    inbox.note_signalled([inbox.marks("orders", ["m1"])["m1"]])
    assert inbox.marks("orders", ["m1"])["m1"].signalled


def test_a_message_costs_a_small_fraction_of_a_request(storage: Storage, prefix: str) -> None:
    counted, counter = counting_storage(storage)
    bus, _ = build(counted, prefix)
    counter.reset()
    bus.send_once_many(orders(1000))
    requests = counter.total()
    assert requests / 1000 < 0.1, counter.snapshot()
    counter.reset()
    bus.send_once_many(orders(1000))  # all waiting, their signals sent: marks read, no sends
    assert counter.total() / 1000 < 0.15, counter.snapshot()


def test_marks_are_forgotten_after_the_retention_once_processed(storage: Storage,
                                                                prefix: str) -> None:
    bus, seen = build(storage, prefix)
    bus.send_once_many(orders(2))
    drain(bus, ["orders"])
    bus.send_once_many(orders(1, start=2))  # o2 waits, unprocessed
    later = bus.parts.clock() + bus.settings.ledger_retention_seconds + 1
    sweeper = bus.sweeper()
    sweeper._clock = lambda: later  # the retention has passed
    assert sweeper.sweep().send_marks_forgotten == 2  # o2's token still waits: its mark stays
    assert bus.send_once_many(orders(3)) == [True, True, False]  # o0, o1 are new messages now
    drain(bus)
    assert sorted(seen) == ["orders:o0", "orders:o0", "orders:o1", "orders:o1", "orders:o2"]


def test_the_sweeper_finds_old_marks_by_their_log_without_reading_every_mark(
        storage: Storage, prefix: str) -> None:
    """Each marked send logs its marks under the moment their retention ends: a sweep before
    then reads one log row and no mark; after it, it forgets the marks whose tokens are gone
    and logs again the one still waiting."""
    counted, counter = counting_storage(storage)
    bus, _ = build(counted, prefix)
    bus.send_once_many(orders(300))
    drain(bus, ["orders"])
    bus.send_once_many(orders(1, start=300))  # o300 waits, unprocessed
    read: list[str] = []
    query = counted.tables.query

    def reading(*args: object, **kwargs: object) -> list[Entity]:
        rows = query(*args, **kwargs)  # type: ignore[arg-type]
        read.extend(row.row_key for row in rows)
        return rows

    counted.tables.query = reading  # type: ignore[method-assign]
    sweeper = bus.sweeper()
    counter.reset()
    assert sweeper.sweep().send_marks_forgotten == 0
    assert not [key for key in read if key.startswith("~sent~")]
    assert counter.snapshot().get(("table", "get_many"), 0) == 0  # no mark read
    later = bus.parts.clock() + bus.settings.ledger_retention_seconds + 1
    sweeper._clock = lambda: later
    assert sweeper.sweep().send_marks_forgotten == 300
    assert not [key for key in read if key.startswith("~sent~")]
    [row] = bus.parts.mark_log.due(later + 86_400, limit=10)  # o300's, looked at tomorrow
    assert row.message_ids == ("place-o300",) and row.due == later + 86_400
    assert bus.send_once_many(orders(2)) == [True, True]  # o0, o1 are new messages now


def test_a_row_in_the_marks_log_the_bus_did_not_write_is_left_out(
        storage: Storage, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    bus, _ = build(storage, prefix)
    bus.send_once_many(orders(2))
    drain(bus, ["orders"])
    storage.tables.insert(bus.names.tokens_table, Entity("~marks", "0000000000000.000~x", {
        "endpoint": "orders", "pieces": 3}))  # its ids are missing
    sweeper = bus.sweeper()
    later = bus.parts.clock() + bus.settings.ledger_retention_seconds + 1
    sweeper._clock = lambda: later
    assert sweeper.sweep().send_marks_forgotten == 2
    assert "is not one this bus wrote" in caplog.text
    assert [t.endpoint for t in bus.parts.inbox.all()] == []  # the log is no token either


def test_a_long_list_of_marks_is_logged_in_rows_the_service_takes() -> None:
    """Long message ids, non-ASCII among them: the log splits them into rows under the
    entity's limits (the in-memory store refuses what Azure would) and reads them back."""
    from bus.adapters.memory import InMemoryStorage
    from bus.protocol.tokens.marklog import MarkLog

    storage = InMemoryStorage()
    storage.tables.create_table("tokens")
    log = MarkLog(storage.tables, "tokens", iter(f"{n:032x}" for n in range(99)).__next__)
    ids = [f"{'é𝄞' * 150}-{n}" for n in range(2_000)]
    log.record("sink", ids, at=10.0, due=20.0)
    rows = log.due(now=20.0, limit=100)
    assert len(rows) > 1 and [i for row in rows for i in row.message_ids] == ids
    assert log.due(now=19.0, limit=100) == []
    log.settle(rows[0], waiting=list(rows[0].message_ids[:3]), recheck_at=50.0)
    assert [row.message_ids for row in log.due(now=50.0, limit=100)][-1] == tuple(
        rows[0].message_ids[:3])
