"""Critical time and trends from the per-minute statistics: percentiles of processing and
critical time from each row's buckets, per message type, the queue's length as maintenance
finds it, and the time to drain - on the in-memory store and Azurite, on a virtual clock."""

from __future__ import annotations

import pytest

from bus import Command, Context, Endpoint, Settings
from bus.adapters.memory import InMemoryStorage
from bus.hosting.maintenance import maintenance_pass
from bus.observability import stats
from bus.operations.overview import endpoint_stats
from bus.seams import Seams
from bus.storage import Entity, Storage
from bus.testing import drain
from bus.testing.seamed import seamed_bus

START = 1_900_000_020.0  # a minute's start


class Pay(Command):
    n: int


class Refund(Command):
    n: int


def test_percentiles_are_read_from_the_buckets() -> None:
    bounds = (10.0, 100.0, 1000.0)
    assert stats.percentile((0, 0, 0, 0), bounds, 0.5) is None
    assert stats.percentile((10, 0, 0, 0), bounds, 0.5) == 5.0  # half way into (0, 10]
    assert stats.percentile((0, 10, 0, 0), bounds, 0.95) == pytest.approx(95.5)
    assert stats.percentile((50, 0, 0, 50), bounds, 0.99) == 1000.0  # above every bound
    assert stats.percentile((90, 10, 0, 0), bounds, 0.5) == pytest.approx(10 * 50 / 90)


def test_a_tally_counts_buckets_and_sums_them() -> None:
    one = stats.Tally().add("processed", 7.0, critical=2.0).add("retry", 300.0)
    both = one + stats.Tally().add("processed", 3.0, critical=0.05)
    assert (both.processed, both.failed, both.signals) == (2, 1, 3)
    assert sum(both.time_hist) == 3 and sum(both.critical_hist) == 2
    assert both.processing_ms(0.5) is not None and both.critical_seconds(1.0) == 2.5


def build(storage: Storage, clock: list[float]) -> object:
    desk = Endpoint("desk")

    @desk.handles(Pay, partition=lambda m: str(m.n))
    def pay(message: Pay, ctx: Context) -> None:
        ctx.state.put("paid", {"n": message.n})

    @desk.handles(Refund, partition=lambda m: str(m.n))
    def refund(message: Refund, ctx: Context) -> None:
        ctx.state.put("refunded", {"n": message.n})

    bus = seamed_bus(Seams(clock=lambda: clock[0]), storage, [desk],
                     settings=Settings(stats_flush_seconds=3600))
    bus.provision()
    return bus


@pytest.mark.parametrize("storage", ["memory", pytest.param("azurite",
                                                            marks=pytest.mark.azurite)],
                         indirect=True)
def test_critical_time_per_type_depth_and_drain(storage: Storage) -> None:
    clock = [START]
    bus = build(storage, clock)
    for n in range(3):
        bus.send(Pay(n=n))  # type: ignore[attr-defined]
    bus.send(Refund(n=9))  # type: ignore[attr-defined]
    clock[0] += 40.0  # they waited 40 s before a worker came
    maintenance_pass(bus)  # type: ignore[arg-type]  # the queue: 4 messages
    drain(bus)  # type: ignore[arg-type]
    bus.flush_stats()  # type: ignore[attr-defined]
    clock[0] += 60.0
    maintenance_pass(bus)  # type: ignore[arg-type]  # the queue: empty
    found = endpoint_stats(bus, "desk", START - 60, clock[0] + 60)  # type: ignore[arg-type]
    assert found.processed == 4
    assert found.critical_seconds.p50 is not None and 30.0 < found.critical_seconds.p50 <= 60.0
    assert found.processing_ms.p95 is not None
    assert [(t.message_type, t.processed) for t in found.per_type] == [("Pay", 3),
                                                                       ("Refund", 1)]
    assert [d for _, d in found.depth] == [4, 0]
    assert found.drain_seconds == 0.0  # empty now
    assert [at for at, _ in found.critical_per_minute] == [START]  # processed in its first minute


def test_time_to_drain_from_how_fast_the_queue_fell() -> None:
    storage, clock = InMemoryStorage(), [START]
    bus = build(storage, clock)
    table = bus.names.state_table("desk")  # type: ignore[attr-defined]
    for minute, depth in ((0, 900), (5, 600), (10, 300)):  # 300 fewer every 5 minutes
        stats.record_depth(storage.tables, table, START + minute * 60, depth)
    found = endpoint_stats(bus, "desk", START, START + 900)  # type: ignore[arg-type]
    assert found.drain_seconds == pytest.approx(300.0)  # 300 left, falling one a second
    stats.record_depth(storage.tables, table, START + 15 * 60, 1000)  # more than 15 min ago
    assert endpoint_stats(bus, "desk", START, START + 1200).drain_seconds is None  # type: ignore[arg-type]


def test_rows_not_of_this_bus_s_writing_are_read_as_nothing() -> None:
    storage, clock = InMemoryStorage(), [START]
    bus = build(storage, clock)
    table = bus.names.state_table("desk")  # type: ignore[attr-defined]
    partition = stats.day_partition(START)
    for key, props in ((f"{int(START):010d}~p1", {"processed": 2, "time_hist": "a,b",
                                                   "types": "{not json"}),
                       (f"{int(START):010d}~p2", {"types": '{"X": [1, 2]}',
                                                   "critical_hist": "1,2"}),
                       ("junk~depth", {"depth": -4}),
                       (f"{int(START):010d}~depth", {"depth": "deep"})):
        storage.tables.replace(table, Entity(partition, key, props))  # type: ignore[arg-type]
    found = endpoint_stats(bus, "desk", START, START + 60)  # type: ignore[arg-type]
    assert found.processed == 2 and found.per_type == [] and found.depth == []
    assert found.processing_ms.p50 is None


def test_statistics_off_record_no_queue_length() -> None:
    storage, clock = InMemoryStorage(), [START]
    desk = Endpoint("desk")
    bus = seamed_bus(Seams(clock=lambda: clock[0]), storage, [desk],
                     settings=Settings(stats_flush_seconds=None))
    bus.provision()
    maintenance_pass(bus)
    rows = storage.tables.query(bus.names.state_table("desk"), stats.day_partition(START))
    assert rows == []
