"""The Spark integration's logic without Spark: ids, staging, draining, stream offsets.

On the in-memory backend with a clock the tests move, so leases can run out on demand.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bus import Bus, BusError, Settings
from bus.adapters.memory import InMemoryStorage, NoFaults
from bus.envelope import encode_bundle
from bus.integrations.spark.batch import BatchRead, ReadClosed
from bus.integrations.spark.options import Connection, OptionError, WriteOptions, write_options
from bus.integrations.spark.reader import Drainer, staged_rows, subscribe
from bus.integrations.spark.staging import Staging
from bus.integrations.spark.stream import StreamConsumer, split
from bus.integrations.spark.writer import (
    JobWriter,
    MessageMapper,
    RowError,
    check_columns,
    prune_results,
)
from bus.integrations.spark.writer import results as write_results
from bus.storage.counting import counting_storage
from tests.integrations.spark.contracts import RecordSale, SaleRecorded

SALE = "tests.integrations.spark.contracts:RecordSale"


class Clock(NoFaults):
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def storage(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryStorage]:
    store = InMemoryStorage(clock)
    monkeypatch.setattr(Connection, "storage", lambda self: store)
    yield store


@pytest.fixture
def bus(storage: InMemoryStorage) -> Bus:
    bus = Bus(storage, routes={RecordSale: "sink"})
    Staging(storage, "").ensure()
    subscribe(bus, "sink")
    return bus


def connection() -> Connection:
    return Connection(connection_string="UseDevelopmentStorage=true")


def drainer(bus: Bus, **kwargs: object) -> Drainer:
    d = Drainer(bus, Staging(bus.storage, ""), "sink", **kwargs)  # type: ignore[arg-type]
    d.prepare()
    return d


def send(bus: Bus, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        bus.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")


# -- ids and rows --------------------------------------------------------------------------------
def test_message_ids_come_from_the_key_scoped_by_type_target_and_run_key() -> None:
    by_key = MessageMapper(RecordSale, key_columns=["sale_id"], run_key=None, target="sink")
    one = by_key.message_id({"sale_id": "order-1", "amount": 1}, "row 0")
    assert one == by_key.message_id({"sale_id": "order-1", "amount": 9}, "row 7")
    assert len(one) == 32 and one != "order-1"
    others = [
        MessageMapper(RecordSale, key_columns=["sale_id"], run_key="day-1", target="sink"),
        MessageMapper(RecordSale, key_columns=["sale_id"], run_key=None, target="other"),
        MessageMapper(SaleRecorded, key_columns=["sale_id"], run_key=None,
                      target="SaleRecorded")]
    ids = {m.message_id({"sale_id": "order-1"}, "row 0") for m in others}
    assert len(ids) == 3 and one not in ids
    two = MessageMapper(RecordSale, key_columns=["sale_id", "amount"], run_key=None,
                        target="sink")
    assert two.message_id({"sale_id": "a", "amount": 1}, "r") != two.message_id(
        {"sale_id": "a", "amount": 2}, "r")
    with pytest.raises(RowError, match="'amount' null"):
        two.message_id({"sale_id": "a", "amount": None}, "row 3 of partition 0")


def test_rows_map_to_fields_by_name() -> None:
    mapper = MessageMapper(RecordSale, key_columns=["sale_id"], run_key=None, target="sink")
    message = mapper.message({"sale_id": "x", "amount": 5, "extra": 1, "note": None}, "r")
    assert message == RecordSale(sale_id="x", amount=5)
    with pytest.raises(RowError, match="column amount"):
        mapper.message({"sale_id": "x", "amount": None}, "row 3")
    with pytest.raises(OptionError, match="amount"):
        check_columns(RecordSale, ["sale_id", "note"], ())
    with pytest.raises(OptionError, match="'id'"):
        check_columns(RecordSale, ["sale_id", "amount"], ("id",))


def test_options_are_checked_on_the_driver() -> None:
    base = {"connection_string": "x", "message_type": SALE}
    with pytest.raises(OptionError, match="destination"):
        write_options({**base, "key_column": "sale_id"})
    with pytest.raises(OptionError, match="row positions are refused"):
        write_options({**base, "destination": "sink", "run_key": "r"})
    with pytest.raises(OptionError, match="not both"):
        write_options({**base, "destination": "sink", "key_column": "a", "key_columns": "b"})
    with pytest.raises(OptionError, match="cannot be imported"):
        write_options({**base, "message_type": "nowhere:Thing", "key_column": "sale_id"})
    with pytest.raises(OptionError, match="topic"):
        write_options({**base, "message_type": "tests.integrations.spark.contracts:SaleRecorded",
                       "key_column": "sale_id", "topic": "Other"})
    with pytest.raises(OptionError, match="invalid_rows"):
        write_options({**base, "destination": "sink", "key_column": "sale_id",
                       "invalid_rows": "skip"})
    opts = write_options({**base, "destination": "sink", "key_columns": "sale_id, amount"})
    assert opts.contract() is RecordSale and opts.key_columns == ("sale_id", "amount")


# -- writing -------------------------------------------------------------------------------------
def sales(n: int, start: int = 0) -> list[dict[str, object]]:
    return [{"sale_id": f"s{i}", "amount": i} for i in range(start, start + n)]


def test_retried_and_speculative_tasks_send_each_row_once(bus: Bus) -> None:
    options = WriteOptions(connection(), SALE, destination="sink", key_columns=("sale_id",))
    job = JobWriter(options)
    job.publish(0, sales(40))  # a first attempt that failed after 40 rows
    kept = job.publish(0, sales(150))  # the retry, which Spark keeps
    job.publish(0, sales(150))  # a speculative copy, whose report Spark drops
    result = job.commit([kept])
    # Every row was sent by this job (an attempt of it), each once.
    assert (result.rows, result.published, result.already_sent) == (150, 150, 0)
    assert bus.storage.queues.depth(bus.names.queue("sink")) >= 1
    assert len([t for t in bus.parts.inbox.all() if t.endpoint == "sink"]) == 150
    rerun = JobWriter(options)
    again = rerun.commit([rerun.publish(0, sales(155))])  # the same rows and 5 new ones
    assert (again.published, again.already_sent) == (5, 150)
    assert len([t for t in bus.parts.inbox.all() if t.endpoint == "sink"]) == 155
    assert [r.job for r in write_results(Staging(bus.storage, ""))] == [rerun.job, job.job]


def test_results_are_read_from_the_newest_and_pruned_by_age(bus: Bus,
                                                             storage: InMemoryStorage) -> None:
    """``write_results(limit=)`` reads the newest rows only (the results partition sorts
    newest first: one request of ``limit`` rows); ``prune_results`` deletes those older than
    its age with a range read, however many there are."""
    options = WriteOptions(connection(), SALE, destination="sink", key_columns=("sale_id",))
    day = 86_400.0
    for age_in_days in (40, 31, 29, 2, 1):
        job = JobWriter(options, clock=lambda age=age_in_days: 100 * day - age * day)
        job.commit([job.publish(0, sales(1))])
    staging = Staging(bus.storage, "")
    counted, counter = counting_storage(storage)
    read: list[int] = []
    query = counted.tables.query

    def reading(*args: Any, **kwargs: Any) -> list[Any]:
        read.append(len(rows := query(*args, **kwargs)))
        return rows

    counted.tables.query = reading  # type: ignore[method-assign]
    [newest] = write_results(Staging(counted, ""), limit=1)
    assert newest.finished_at == 99 * day
    assert counter.snapshot() == {("table", "query"): 1} and read == [1]
    assert prune_results(staging, keep_seconds=30 * day, now=100 * day) == 2
    assert [round((100 * day - r.finished_at) / day) for r in write_results(staging)] == [
        1, 2, 29]


def test_a_result_counts_the_storage_requests_its_tasks_made(bus: Bus,
                                                             storage: InMemoryStorage) -> None:
    """``requests`` adds up every storage call of the tasks whose reports Spark kept: 500 rows
    cost the marks' transactions (50 marks and tokens a request), the bundled signals and a
    few reads - a fraction of a request a row."""
    calls = 0
    tables_transact = storage.tables.transact

    def counted(table: str, ops: object) -> list[str]:
        nonlocal calls
        calls += 1
        return tables_transact(table, ops)  # type: ignore[arg-type]

    job = JobWriter(WriteOptions(connection(), SALE, destination="sink",
                                 key_columns=("sale_id",)))
    storage.tables.transact = counted  # type: ignore[method-assign]
    result = job.commit([job.publish(0, sales(250)), job.publish(1, sales(250, start=250))])
    assert result.rows == 500 and result.published == 500
    assert calls <= result.requests < 500 and result.requests_per_row == round(
        result.requests / 500, 3)
    assert write_results(Staging(bus.storage, ""))[0].requests == result.requests


def test_invalid_rows_fail_the_task_or_are_reported(bus: Bus) -> None:
    rows = [*sales(3), {"sale_id": "bad", "amount": "lots"}, {"sale_id": None, "amount": 1}]
    failing = JobWriter(WriteOptions(connection(), SALE, destination="sink",
                                     key_columns=("sale_id",)))
    with pytest.raises(RowError, match=r"the row sale_id='bad' \(row 3 of partition 2\) is "
                                       "not a valid"):
        failing.publish(2, rows)
    reporting = JobWriter(WriteOptions(connection(), SALE, destination="sink",
                                       key_columns=("sale_id",), invalid_rows="report"))
    result = reporting.commit([reporting.publish(2, rows)])
    assert (result.rows, result.published, result.refused) == (5, 3, 2)
    assert "column amount" in result.reasons[0] and "column sale_id" in result.reasons[1]


def test_an_oversize_row_is_named_by_its_key_and_reported_while_the_others_go(
        bus: Bus) -> None:
    """A payload over ``Settings.max_payload_bytes`` is refused before anything of its chunk
    is sent: the chunk then goes one message at a time, so the row is named by its key - and
    in ``report`` mode the job goes on (it failed, naming neither, after earlier chunks had
    gone out)."""
    small = Connection(connection_string="UseDevelopmentStorage=true",
                       settings=Settings(max_payload_bytes=2_000))
    rows = [*sales(300), {"sale_id": "huge", "amount": 1, "note": "x" * 70_000},
            *sales(300, start=300)]
    failing = JobWriter(WriteOptions(small, SALE, destination="sink", key_columns=("sale_id",)))
    with pytest.raises(RowError, match=r"the row sale_id='huge' \(row 300 of partition 1\): "
                                       r"payload of 70\d{3} bytes is over the limit of 2000"):
        failing.publish(1, rows)
    reporting = JobWriter(WriteOptions(small, SALE, destination="sink", key_columns=("sale_id",),
                                       invalid_rows="report"))
    result = reporting.commit([reporting.publish(1, rows)])
    # The failing job had sent some (the rows before the huge one in its chunk, one at a
    # time, and the chunk beside it): every other row is sent once, by one job or the other.
    assert (result.rows, result.published + result.already_sent, result.refused) == (
        601, 600, 1)
    assert "sale_id='huge'" in result.reasons[0]
    assert len([t for t in bus.parts.inbox.all() if t.endpoint == "sink"]) == 600


def test_a_missing_report_fails_the_commit(bus: Bus) -> None:
    job = JobWriter(WriteOptions(connection(), SALE, destination="sink",
                                 key_columns=("sale_id",)))
    with pytest.raises(BusError, match="no report"):
        job.commit([job.publish(0, sales(1)), None])


# -- reading -------------------------------------------------------------------------------------
def test_drain_takes_each_message_once_and_poisons_garbage(bus: Bus) -> None:
    d = drainer(bus)
    send(bus, 10)
    queue = bus.names.queue("sink")
    copy = bus.storage.queues.receive(queue, max_messages=1, lease=0.0)[0]
    bus.storage.queues.send(queue, copy.body)  # a duplicated signal
    bus.storage.queues.send(queue, base64.b64encode(b"{oops").decode())
    elsewhere = Bus(bus.storage, routes={RecordSale: "other"})
    subscribe(elsewhere, "other")
    elsewhere.send(RecordSale(sale_id="x", amount=1))
    misrouted = bus.storage.queues.receive(bus.names.queue("other"), max_messages=1, lease=0)
    bus.storage.queues.send(queue, misrouted[0].body)
    assert d.stage("r~sink~a", 100, close_empty=True) == 10
    rows = staged_rows(Staging(bus.storage, ""), "r~sink~a", None)
    assert sorted(r[0] for r in rows) == sorted(f"m{i}" for i in range(10))
    assert bus.storage.queues.depth(queue) == 0
    assert bus.storage.queues.depth(bus.names.poison_queue("sink")) == 2
    assert [t.endpoint for t in bus.parts.inbox.all()] == ["other"]  # not taken from "sink"
    send(bus, 3, start=10)  # a closed batch is only read again
    assert d.stage("r~sink~a", 100, close_empty=True) == 10


def test_parsed_columns_and_wrong_types(bus: Bus) -> None:
    d = drainer(bus, contract=SaleRecorded)
    bus.parts.topics.subscribe("SaleRecorded", "sink")
    bus.publish(SaleRecorded(sale_id="a", amount=3), message_id="e1")
    send(bus, 1)  # a RecordSale: not what this reader expects
    assert d.stage("r~sink~p", 100, close_empty=True) == 1
    [row] = staged_rows(Staging(bus.storage, ""), "r~sink~p", SaleRecorded)
    assert row[0] == "e1" and row[5] == "SaleRecorded" and row[-2:] == ("a", 3)
    assert bus.storage.queues.depth(bus.names.poison_queue("sink")) == 1


def consumer(bus: Bus, clock: Clock, d: Drainer | None = None, *, max_rows: int | None = 4,
             partitions: int = 1) -> StreamConsumer:
    return StreamConsumer(d or drainer(bus), Staging(bus.storage, ""), "c1", max_rows=max_rows,
                          partitions=partitions, poll_seconds=0, clock=time.monotonic)


def batch_ids(bus: Bus, c: StreamConsumer, batch: int) -> list[str]:
    return [r[0] for r in staged_rows(Staging(bus.storage, ""), c.batch_key(batch), None)]


def test_stream_batches_are_staged_once_and_replayed_the_same(bus: Bus, clock: Clock) -> None:
    c = consumer(bus, clock)
    assert c.initial_offset() == {"batch": 0}
    assert c.latest_offset({"batch": 0}) == {"batch": 0}  # nothing yet
    send(bus, 6)
    assert c.latest_offset({"batch": 0}) == {"batch": 1}
    first = batch_ids(bus, c, 1)
    assert len(first) == 4
    # The driver dies before Spark records batch 1: a new reader answers the same batch.
    send(bus, 3, start=6)
    again = consumer(bus, clock)
    assert again.latest_offset({"batch": 0}) == {"batch": 1}
    assert batch_ids(bus, again, 1) == first
    assert again.latest_offset({"batch": 1}) == {"batch": 2}
    assert again.latest_offset({"batch": 2}) == {"batch": 3}
    assert again.latest_offset({"batch": 3}) == {"batch": 3}
    seen = [m for b in (1, 2, 3) for m in batch_ids(bus, again, b)]
    assert sorted(seen) == sorted(f"m{i}" for i in range(9))
    again.commit({"batch": 2})
    assert batch_ids(bus, again, 1) == [] and batch_ids(bus, again, 3) != []
    assert consumer(bus, clock).initial_offset() == {"batch": 2}


def test_a_crash_between_staging_and_settling_loses_and_doubles_nothing(
        bus: Bus, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    send(bus, 4)
    d = drainer(bus)
    monkeypatch.setattr(d, "_settle", lambda *a: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):
        consumer(bus, clock, d).latest_offset({"batch": 0})
    recovered = consumer(bus, clock)
    assert recovered.latest_offset({"batch": 0}) == {"batch": 1}
    assert sorted(batch_ids(bus, recovered, 1)) == [f"m{i}" for i in range(4)]
    assert bus.parts.inbox.all() == []  # settled by the recovery
    clock.t += 3600  # the crashed take's leases run out: the copies come back
    assert recovered.latest_offset({"batch": 1}) == {"batch": 1}  # duplicates, dropped
    assert bus.storage.queues.depth(bus.names.queue("sink")) == 0


def test_spark_4_0_and_4_1_calls_without_a_start_offset(bus: Bus, clock: Clock) -> None:
    """As PySpark 4.1.4's worker drives a stream reader (``python_streaming_source_runner.py``:
    ``initialOffset()``, ``latestOffset()`` with no arguments, ``partitions(start, end)``,
    ``commit(end)``) under ``Trigger.AvailableNow``, which Spark 4.0/4.1 run as one batch: each
    run's one ``latestOffset()`` must take what is there, the first after a restart too."""
    send(bus, 6)
    c = consumer(bus, clock, max_rows=None)
    start = c.initial_offset()
    assert start == {"batch": 0}
    end = c.latest_offset()  # the run's one call: everything the queue holds
    assert end == {"batch": 1} and len(batch_ids(bus, c, 1)) == 6
    assert c.batch_keys(start, end) == [c.batch_key(1)]
    c.commit(end)
    send(bus, 2, start=6)
    restarted = consumer(bus, clock, max_rows=None)  # the next run: a new reader
    assert restarted.latest_offset() == {"batch": 2}
    assert sorted(batch_ids(bus, restarted, 2)) == ["m6", "m7"]
    # That run dies before Spark logs the offset: the next one reads batch 2 with its own.
    send(bus, 1, start=8)
    again = consumer(bus, clock, max_rows=None)
    assert again.latest_offset() == {"batch": 3}
    assert again.batch_keys({"batch": 1}, {"batch": 3}) == [again.batch_key(2),
                                                           again.batch_key(3)]
    assert again.latest_offset() == {"batch": 3}  # nothing new: Spark sees no new data


def test_available_now_reads_what_the_queue_held_when_it_began(bus: Bus, clock: Clock) -> None:
    send(bus, 10)
    c = consumer(bus, clock)  # at most 4 per micro-batch
    c.prepare_available_now()
    assert c.latest_offset({"batch": 0}, 4) == {"batch": 1}
    send(bus, 5, start=10)  # arrives during the run: left to the next one
    assert c.latest_offset({"batch": 1}, 4) == {"batch": 2}
    assert c.latest_offset({"batch": 2}, 4) == {"batch": 3}
    assert c.latest_offset({"batch": 3}, 4) == {"batch": 3}  # the end of the run
    seen = [m for b in (1, 2, 3) for m in batch_ids(bus, c, b)]
    assert sorted(seen) == sorted(f"m{i}" for i in range(10))
    assert bus.storage.queues.depth(bus.names.queue("sink")) == 5


def bundled(bus: Bus, n: int, per: int = 32) -> None:
    """``n`` messages on the sink's queue in bundles of ``per`` signals, as a Spark job or an
    outbox leaves them (``bus.protocol.copies.bundles``)."""
    send(bus, n)
    queue = bus.names.queue("sink")
    texts = []
    while received := bus.storage.queues.receive(queue, max_messages=32, lease=300):
        for message in received:
            texts.append(base64.b64decode(message.body).decode())
            bus.storage.queues.delete(queue, message)
    for i in range(0, len(texts), per):
        bus.storage.queues.send(queue, encode_bundle(texts[i:i + per]))


def available_now(bus: Bus, c: StreamConsumer, limit: int | None) -> list[int]:
    """One ``Trigger.AvailableNow`` run as Spark 4.2+ drives it: micro-batches until the
    latest offset is the start; the rows of each."""
    c.prepare_available_now()
    start, sizes = c.initial_offset(), []
    while (end := c.latest_offset(start, limit)) != start:
        sizes.append(sum(len(batch_ids(bus, c, b))
                         for b in range(start["batch"] + 1, end["batch"] + 1)))
        c.commit(end)
        start = end
    return sizes


@pytest.mark.parametrize("limit", [None, 100, 10])
def test_available_now_drains_a_bundled_backlog_counting_rows(
        bus: Bus, clock: Clock, limit: int | None) -> None:
    """2,300 rows in bundles of 32 (72 queue messages): one run reads every row, in
    micro-batches of at most ``limit`` rows - the queue's depth counts messages, not rows,
    and a bundle split by a micro-batch's end comes back for the next one."""
    bundled(bus, 2_300)
    c = consumer(bus, clock, max_rows=limit)
    sizes = available_now(bus, c, limit)
    assert sum(sizes) == 2_300, sizes
    assert limit is None or max(sizes) <= limit
    assert bus.storage.queues.depth(bus.names.queue("sink")) == 0


def test_read_limits_and_partitions(bus: Bus, clock: Clock) -> None:
    send(bus, 10)
    c = consumer(bus, clock, max_rows=None, partitions=3)
    assert c.latest_offset({"batch": 0}, None) == {"batch": 3}  # all it holds, in 3 batches
    assert [len(batch_ids(bus, c, b)) for b in (1, 2, 3)] == [4, 4, 2]
    assert c.splits({"batch": 0}, {"batch": 3}) == [[c.batch_key(1)], [c.batch_key(2)],
                                                    [c.batch_key(3)]]
    send(bus, 3, start=10)
    assert c.latest_offset({"batch": 3}, 2) == {"batch": 5}  # Spark's ReadMaxRows(2)
    assert [len(batch_ids(bus, c, b)) for b in (4, 5)] == [1, 1]
    assert split([f"k{i}" for i in range(5)], 2) == [["k0", "k1", "k2"], ["k3", "k4"]]


def test_a_consumer_belongs_to_one_endpoint(bus: Bus, clock: Clock) -> None:
    send(bus, 1)
    consumer(bus, clock).latest_offset({"batch": 0})
    other = Drainer(bus, Staging(bus.storage, ""), "elsewhere")
    with pytest.raises(OptionError, match="reads endpoint 'sink'"):
        StreamConsumer(other, Staging(bus.storage, ""), "c1", max_rows=4)


def test_drain_takes_bundles_apart_and_leaves_the_rest_for_the_next_batch(bus: Bus) -> None:
    """A bundle (``bus.protocol.copies.bundles``) is several signals: each is taken (or poisoned)
    alone; a batch's limit may split a bundle, whose rest comes back for the next batch."""
    d = drainer(bus)
    send(bus, 9)
    queue = bus.names.queue("sink")
    texts = []
    for message in bus.storage.queues.receive(queue, max_messages=32, lease=30):
        texts.append(base64.b64decode(message.body).decode())
        bus.storage.queues.delete(queue, message)
    bus.storage.queues.send(queue, encode_bundle([*texts[:4], '{"bus": 1}']))
    bus.storage.queues.send(queue, encode_bundle(texts[4:]))
    assert d.stage("r~sink~b1", 6, close_empty=True) == 6
    assert d.stage("r~sink~b2", 100, close_empty=True) == 3
    taken = [r[0] for key in ("r~sink~b1", "r~sink~b2")
             for r in staged_rows(Staging(bus.storage, ""), key, None)]
    assert sorted(taken) == sorted(f"m{i}" for i in range(9))
    assert bus.storage.queues.depth(queue) == 0
    assert bus.storage.queues.depth(bus.names.poison_queue("sink")) == 1
    assert bus.parts.inbox.all() == []


# -- credentials ---------------------------------------------------------------------------------
def test_connections_take_one_way_to_sign() -> None:
    from bus.integrations.spark.credentials import StaticToken

    with pytest.raises(OptionError, match="at most one of sas_token, token"):
        Connection(account_name="acct", sas_token="sv=1", token="t")
    with pytest.raises(OptionError, match="not with 'connection_string'"):
        Connection(connection_string="UseDevelopmentStorage=true", sas_token="sv=1")
    with pytest.raises(OptionError, match="not blob=, queue= or table="):
        Connection(endpoints="blob=http://x;file=http://y")
    with pytest.raises(OptionError, match="cannot be imported"):
        Connection(account_name="acct", credential_provider="nowhere:make").credential()
    # A platform's token: used until the expiry its claims name (not verified, only read).
    claims = base64.urlsafe_b64encode(b'{"exp": 1900000000}').decode().rstrip("=")
    token = Connection(account_name="acct", token=f"h.{claims}.s").credential()
    assert isinstance(token, StaticToken) and token.get_token("scope").expires_on == 1900000000
    opaque = StaticToken("not-a-jwt")
    assert 3500 < opaque.expires_on - time.time() <= 3600


# -- batch reads ---------------------------------------------------------------------------------
def reads(bus: Bus) -> BatchRead:
    return BatchRead(drainer(bus), Staging(bus.storage, ""))


def read_ids(bus: Bus, keys: list[str]) -> list[str]:
    return [r[0] for key in keys for r in staged_rows(Staging(bus.storage, ""), key, None)]


def test_a_batch_read_settles_its_messages_only_when_committed(bus: Bus) -> None:
    send(bus, 5)
    keys = reads(bus).read("k1", 100)
    assert sorted(read_ids(bus, keys)) == [f"m{i}" for i in range(5)]
    assert len(bus.parts.inbox.all()) == 5  # taken, not settled: the tokens are live
    assert reads(bus).read("k1", 100) == keys  # a re-run reads the same rows
    assert reads(bus).commit("k1") == 5
    assert bus.parts.inbox.all() == [] and bus.storage.queues.depth(bus.names.queue("sink")) == 0
    assert bus.storage.tables.query(Staging(bus.storage, "").table, "r~sink~k1~0") == []
    assert reads(bus).commit("k1") == 5  # again: harmless
    with pytest.raises(ReadClosed, match="was committed"):
        reads(bus).read("k1", 100)
    assert reads(bus).forget("k1") == 5
    assert read_ids(bus, reads(bus).read("k1", 100)) == []  # forgotten: a new read


def test_a_read_never_committed_is_given_up_by_the_next_whatever_its_run_key(bus: Bus) -> None:
    send(bus, 5)
    reads(bus).read("day-1", 100)  # its job fails before storing anything
    keys = reads(bus).read("day-2", 100)  # at once: day-1's messages are made visible again
    assert sorted(read_ids(bus, keys)) == [f"m{i}" for i in range(5)]
    with pytest.raises(ReadClosed, match="given up"):
        reads(bus).read("day-1", 100)
    with pytest.raises(ReadClosed, match="given up"):
        reads(bus).commit("day-1")
    assert reads(bus).commit("day-2") == 5
    assert bus.parts.inbox.all() == [] and bus.storage.queues.depth(bus.names.queue("sink")) == 0


def test_a_commit_that_stopped_half_way_is_finished_by_the_next_read(
        bus: Bus, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    send(bus, 4)
    reads(bus).read("k1", 100)
    monkeypatch.setattr(Drainer, "settle_rows", lambda *a: (_ for _ in ()).throw(OSError("x")))
    with pytest.raises(OSError):
        reads(bus).commit("k1")  # the read counts from here on
    monkeypatch.undo()
    clock.t += 3600  # its leases ran out: the copies are back, their tokens still live
    assert read_ids(bus, reads(bus).read("k2", 100)) == []  # k1 finished first: duplicates
    assert reads(bus).commit("k1") == 4
    assert bus.parts.inbox.all() == [] and bus.storage.queues.depth(bus.names.queue("sink")) == 0


def test_a_batch_read_in_partitions(bus: Bus) -> None:
    send(bus, 10)
    keys = reads(bus).read("wide", 100, partitions=3)
    assert [len(read_ids(bus, [key])) for key in keys] == [4, 4, 2]
    assert sorted(read_ids(bus, keys)) == sorted(f"m{i}" for i in range(10))
    assert reads(bus).commit("wide") == 10


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_batch_read_takes_every_part_of_the_bundles_it_receives(bus: Bus,
                                                                  partitions: int) -> None:
    """Spark writes bundle their signals: 40 messages in a few queue messages. A part left
    behind stays leased with the ones taken (a read is settled only on commit): a read must
    take them all (before, it took 2 of 40)."""
    bus.send_once_many([(RecordSale(sale_id=f"s{i}", amount=i), f"m{i}") for i in range(40)])
    assert bus.storage.queues.depth(bus.names.queue("sink")) < 40  # bundles
    d = drainer(bus)
    keys = BatchRead(d, Staging(bus.storage, "")).read("bundled", 10_000, partitions)
    assert sorted(read_ids(bus, keys)) == sorted(f"m{i}" for i in range(40))


def test_a_reader_that_may_not_write_topic_files_is_told_how_to_get_subscribed() -> None:
    """The deployment's Spark identity reads topic files and writes none (Azure answers a write
    with 403): a subscription the app declares is found; a missing one says what to do."""
    from azure.core.exceptions import HttpResponseError

    from bus import ConfigurationError, Event
    from bus.storage import Storage

    class Audit(Event):
        what: str

    memory = InMemoryStorage()
    Bus(memory, readers={"analytics": [Audit]}).provision()  # the deployment

    class ReadOnlyTopics:
        def __init__(self, blobs: object) -> None:
            self._blobs = blobs

        def __getattr__(self, name: str) -> object:
            return getattr(self._blobs, name)

        def write(self, *args: object, **kwargs: object) -> str:
            error = HttpResponseError("This request is not authorized to perform this "
                                      "operation using this permission.")
            error.status_code = 403
            raise error

    spark_bus = Bus(Storage(memory.queues, ReadOnlyTopics(memory.blobs),  # type: ignore[arg-type]
                            memory.tables))
    subscribe(spark_bus, "analytics", ["Audit"])  # declared: only read
    with pytest.raises(ConfigurationError, match=r"'analytics' is not subscribed to 'Other'.*"
                                                 r"readers=\{'analytics': \['Other'\]\}"):
        subscribe(spark_bus, "analytics", ["Other"])
