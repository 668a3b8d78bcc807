"""The Spark integration on a local SparkSession against Azurite (docs/spark.md). On Spark 3.x
(PySpark 3.5 in requirements-py310.txt) only the Spark 3.4 functions run: the data source
needs Spark 4.

Writes: a batch write sends each row once from its task; a task that fails mid-partition and
is retried sends nothing twice; a re-run sends only new rows; a driver that dies after the
tasks sent loses and doubles nothing; a streaming sink; notebook contracts; a SAS or a
credential provider on the executors. Reads: a batch read stages once per run key and settles
on ``commit_read``, a failed one is read again by the next run whatever its run key; a read
admits copies as an endpoint does (an expired copy poisoned, one not yet due left queued);
a streaming query that fails mid-batch and restarts from its checkpoint sees every message
exactly once; ``Trigger.AvailableNow`` reads what is there, in several batches with
``max_rows_per_trigger`` (and on Spark 4.0/4.1's calls); batch reads and
micro-batches in several partitions. And the Spark 3.4 functions on the same session.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark[sql] is pinned in requirements-dev.txt")

import pyspark

import bus.spark
from bus import Bus
from bus.adapters.azure import AzureStorage
from bus.protocol.tokens.inbox import TokenState
from bus.seams import Seams
from bus.testing import seamed_bus
from tests.integrations.spark.contracts import LABEL, RecordSale, SaleRecorded
from tests.integrations.spark.jobs import FailOnce

pytestmark = pytest.mark.azurite

SALE = "tests.integrations.spark.contracts:RecordSale"

data_source = pytest.mark.skipif(
    int(pyspark.__version__.split(".")[0]) < 4,
    reason=f"format('bus') needs Spark 4's Python Data Source API (this is PySpark "
           f"{pyspark.__version__}); Spark 3.x is tested through bus.spark.publish/receive")


@pytest.fixture
def conn(azurite_connection: str, prefix: str) -> dict[str, str]:
    """The connection options of the data source."""
    bus.spark.subscribe("sink", connection_string=azurite_connection, prefix=prefix)
    return {"connection_string": azurite_connection, "prefix": prefix}


@pytest.fixture
def client(azurite_connection: str, prefix: str) -> Bus:
    return Bus(AzureStorage.from_connection_string(azurite_connection), prefix=prefix,
               routes={RecordSale: "sink"})


def depth(client: Bus, endpoint: str = "sink") -> int:
    return client.storage.queues.depth(client.names.queue(endpoint))


def tokens(client: Bus, endpoint: str = "sink") -> int:
    """Messages sent to ``endpoint`` and not processed yet (signals travel in bundles, so the
    queue's depth does not count them)."""
    return len([t for t in client.parts.inbox.all(endpoint)])


def sales(spark: Any, n: int, partitions: int = 2) -> Any:
    return spark.range(0, n, 1, partitions).selectExpr(
        "concat('sale-', cast(id as string)) as sale_id", "cast(id as int) as amount",
        "'ignored' as extra")


def write(df: Any, conn: dict[str, str], **options: str) -> None:
    (df.write.format("bus").options(**conn, message_type=SALE, destination="sink", **options)
     .mode("append").save())


def latest(conn: dict[str, str]) -> Any:
    [result] = bus.spark.write_results(limit=1, connection_string=conn["connection_string"],
                                       prefix=conn["prefix"])
    return result


@data_source
def test_batch_write_then_batch_read(spark: Any, conn: dict[str, str], client: Bus) -> None:
    write(sales(spark, 40, 3), conn, key_column="sale_id")
    assert tokens(client) == 40
    assert (latest(conn).rows, latest(conn).published) == (40, 40)
    read = spark.read.format("bus").options(**conn, endpoint="sink", run_key="read-1",
                                            message_type=SALE)
    rows = read.load().collect()
    assert sorted(r.sale_id for r in rows) == sorted(f"sale-{i}" for i in range(40))
    assert len({r.message_id for r in rows}) == 40
    assert {r.sale_id: r.amount for r in rows} == {f"sale-{i}": i for i in range(40)}
    assert {r.source for r in rows} == {"client"} and rows[0].sent_at is not None
    write(sales(spark, 1), conn, key_column="sale_id", run_key="later")  # another message
    again = read.load().collect()  # the run key's rows stay what they were
    assert sorted(r.message_id for r in again) == sorted(r.message_id for r in rows)
    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    assert tokens(client) == 41  # taken, not settled: the 40 wait for the commit
    assert bus.spark.commit_read("sink", "read-1", **options) == 40  # the results are stored
    assert tokens(client) == 1
    with pytest.raises(Exception, match="was committed"):
        read.load().collect()
    assert bus.spark.forget_read("sink", "read-1", **options) == 40
    [later] = read.load().collect()
    assert later.sale_id == "sale-0" and later.message_id not in {r.message_id for r in rows}


@pytest.mark.parametrize("via", [pytest.param("format", marks=data_source), "publish"])
def test_a_task_failing_mid_partition_is_retried_without_duplicates(
        spark: Any, conn: dict[str, str], client: Bus, tmp_path: Path, via: str) -> None:
    df = sales(spark, 2400, 2)
    # Partition 1's first attempt fails after 700 rows: it has sent its first chunk (500).
    flaky = df.mapInPandas(FailOnce(tmp_path / "failed", partition=1, after=700), df.schema)
    if via == "format":
        write(flaky, conn, key_column="sale_id")
    else:
        bus.spark.publish(flaky, RecordSale, destination="sink", key_column="sale_id",
                          connection_string=conn["connection_string"], prefix=conn["prefix"])
    assert (tmp_path / "failed").exists()  # the first attempt of partition 1 did fail
    result = latest(conn)
    assert (result.rows, result.published, result.already_sent) == (2400, 2400, 0)
    got = bus.spark.receive(spark, "sink", run_key="check", message_type=SALE,
                            max_messages=5000, connection_string=conn["connection_string"],
                            prefix=conn["prefix"])
    ids = Counter(r.sale_id for r in got.select("sale_id").collect())
    assert len(ids) == 2400 and max(ids.values()) == 1


@data_source
def test_a_rerun_sends_only_new_rows(spark: Any, conn: dict[str, str], client: Bus) -> None:
    write(sales(spark, 30), conn, key_column="sale_id", run_key="nightly")
    assert tokens(client) == 30
    write(sales(spark, 30), conn, key_column="sale_id", run_key="nightly")  # the job again
    assert tokens(client) == 30
    assert (latest(conn).published, latest(conn).already_sent) == (0, 30)
    result = bus.spark.publish(sales(spark, 35), RecordSale, destination="sink",
                               key_column="sale_id", run_key="nightly",
                               connection_string=conn["connection_string"],
                               prefix=conn["prefix"])  # with 5 new rows
    assert (result.rows, result.published, result.already_sent) == (35, 5, 30)
    assert tokens(client) == 35


def test_a_rerun_before_consumption_leaves_the_queue_depth_unchanged(
        spark: Any, conn: dict[str, str], client: Bus) -> None:
    """2,000 rows (bundled by the tasks), the job run again before anything was read: the
    signals already sent are noted on their send marks, so the re-run sends none again.
    (Before, each re-run sent every waiting signal once more: depth 64 -> 128 -> 194.)"""
    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    first = bus.spark.publish(sales(spark, 2_000), RecordSale, destination="sink",
                              key_column="sale_id", **options)
    waiting = depth(client)
    assert first.published == 2_000 and 0 < waiting < 2_000 / 16
    for _ in range(2):
        again = bus.spark.publish(sales(spark, 2_000), RecordSale, destination="sink",
                                  key_column="sale_id", **options)
        assert (again.published, again.already_sent) == (0, 2_000)
        assert depth(client) == waiting
    assert tokens(client) == 2_000


@data_source
def test_a_driver_failing_after_the_tasks_sent_loses_and_doubles_nothing(
        spark: Any, conn: dict[str, str], client: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """``publish`` adds the reports up in this process (the data source's commit runs in a
    Python worker of Spark's, out of the test's reach): its driver dies there."""
    from bus.integrations.spark.writer import JobWriter

    def dies(self: JobWriter, *args: object) -> None:
        raise RuntimeError("injected: the driver died before the job's commit")

    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    with monkeypatch.context() as patched:
        patched.setattr(JobWriter, "commit", dies)
        with pytest.raises(RuntimeError, match="injected: the driver died"):
            bus.spark.publish(sales(spark, 50), RecordSale, destination="sink",
                              key_column="sale_id", **options)
    assert tokens(client) == 50  # the tasks had sent everything
    write(sales(spark, 50), conn, key_column="sale_id")  # the job run again
    assert (latest(conn).published, latest(conn).already_sent) == (0, 50)
    assert tokens(client) == 50


@data_source
def test_a_stream_failing_mid_batch_restarts_from_its_checkpoint(
        spark: Any, conn: dict[str, str], client: Bus, tmp_path: Path) -> None:
    for i in range(25):
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    out = tmp_path / "out"
    failed: list[list[str]] = []
    written: dict[int, list[str]] = {}  # the sink runs on the driver: in this process

    def sink(batch: Any, batch_id: int) -> None:
        # Idempotent per batch id (overwrite): the usual foreachBatch contract.
        ids = sorted(r.message_id for r in batch.select("message_id").collect())
        batch.select("message_id").write.mode("overwrite").parquet(str(out / f"b={batch_id}"))
        if batch_id == 1 and not failed:
            failed.append(ids)
            raise RuntimeError("injected failure after writing part of batch 1")
        written[batch_id] = ids

    def start() -> Any:
        stream = spark.readStream.format("bus").options(
            **conn, endpoint="sink", consumer="feed", batch_size="10", poll_seconds="0.2").load()
        return (stream.writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(processingTime="500 milliseconds").start())

    query = start()
    with pytest.raises(Exception, match="injected failure"):
        query.awaitTermination(120)
    client.send(RecordSale(sale_id="s25", amount=25), message_id="m25")  # while it is down
    query = start()
    try:
        for _ in range(240):
            if len({i for ids in written.values() for i in ids}) >= 26 and depth(client) == 0:
                break
            query.awaitTermination(0.5)
    finally:
        query.stop()
    result = spark.read.parquet(str(out)).collect()
    ids = Counter(r.message_id for r in result)
    assert set(ids) == {f"m{i}" for i in range(26)} and max(ids.values()) == 1
    assert failed and written[1] == failed[0]  # the replay read the very same messages
    assert sorted(r.message_id for r in result if r.b == 1) == failed[0]


def test_spark_3_4_functions_publish_and_receive_events(
        spark: Any, conn: dict[str, str], client: Bus) -> None:
    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    bus.spark.subscribe("watcher", ["SaleRecorded"], **options)
    df = sales(spark, 20)
    first = bus.spark.publish(df, SaleRecorded, key_column="sale_id", **options)
    assert (first.published, first.already_sent) == (20, 0)
    assert bus.spark.publish(df, SaleRecorded, key_column="sale_id", **options).published == 0
    got = bus.spark.receive(spark, "watcher", run_key="w1", message_type=SaleRecorded, **options)
    assert sorted(r.sale_id for r in got.collect()) == sorted(f"sale-{i}" for i in range(20))
    assert {r.topic for r in got.collect()} == {"SaleRecorded"}
    again = bus.spark.receive(spark, "watcher", run_key="w1", **options)
    assert again.count() == 20
    assert bus.spark.commit_read("watcher", "w1", **options) == 20
    # Processed: no token left, no signal either (the second publish sent none again).
    assert tokens(client, "watcher") == 0 and depth(client, "watcher") == 0


# -- Trigger.AvailableNow, admission control, partitions, failed batch reads ----------------------
def _available_now(spark: Any, tmp_path: Path, source: str, conn: dict[str, str],
                   **options: str) -> list[list[str]]:
    """One ``Trigger.AvailableNow`` run of a query on ``source``; the message ids of each
    non-empty micro-batch, in order."""
    batches: dict[int, list[str]] = {}

    def sink(batch: Any, batch_id: int) -> None:
        ids = sorted(r.message_id for r in batch.select("message_id").collect())
        if ids:
            batches[batch_id] = ids

    stream = spark.readStream.format(source).options(**conn, endpoint="sink", **options).load()
    query = (stream.writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the AvailableNow query did not end"
    return [batches[b] for b in sorted(batches)]


@data_source
def test_available_now_reads_everything_available_in_batches_of_max_rows_per_trigger(
        spark: Any, conn: dict[str, str], client: Bus, tmp_path: Path) -> None:
    for i in range(25):
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    options = {"consumer": "now", "max_rows_per_trigger": "10"}
    first = _available_now(spark, tmp_path, "bus", conn, **options)
    ids = Counter(i for batch in first for i in batch)
    assert max(ids.values()) == 1
    if tuple(int(p) for p in spark.version.split(".")[:2]) < (4, 2):
        # Spark 4.0/4.1 run AvailableNow as one batch (their Trigger.Once fallback).
        assert [len(b) for b in first] == [10]
        return
    assert [len(b) for b in first] == [10, 10, 5]  # several batches, each at most 10
    assert set(ids) == {f"m{i}" for i in range(25)}
    for i in range(25, 32):  # more while no query runs: the next run reads them
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    second = _available_now(spark, tmp_path, "bus", conn, **options)
    assert sorted(i for batch in second for i in batch) == sorted(
        {f"m{i}" for i in range(32)} - {i for batch in first for i in batch})
    assert depth(client) == 0


@data_source
@pytest.mark.parametrize("source", ["bus", "bus_spark40"])
def test_available_now_reads_a_bundled_backlog_a_spark_job_published(
        spark: Any, conn: dict[str, str], client: Bus, tmp_path: Path, source: str) -> None:
    """2,300 rows published by a job (its tasks bundle up to 32 signals a queue message), then
    one AvailableNow run reads every row: in micro-batches on Spark 4.2+, in the one batch of
    the 4.0/4.1 call shape (``bus_spark40``). A run counted queue messages once, and read
    about 100 rows of such a backlog."""
    from tests.integrations.spark.shapes import Spark40Source

    spark.dataSource.register(Spark40Source)
    result = bus.spark.publish(sales(spark, 2_300), RecordSale, destination="sink",
                               key_column="sale_id", **conn)
    assert result.published == 2_300 and depth(client) < 2_300 / 16  # bundled
    read = _available_now(spark, tmp_path, source, conn, consumer=f"bulk-{source}")
    ids = Counter(i for batch in read for i in batch)
    assert len(ids) == 2_300 and max(ids.values()) == 1
    if source == "bus_spark40":
        assert len(read) == 1
    assert depth(client) == 0 and tokens(client) == 0


@data_source
def test_available_now_on_spark_4_0_and_4_1_calls(spark: Any, conn: dict[str, str],
                                                  client: Bus, tmp_path: Path) -> None:
    """``bus_spark40`` is the reader as Spark 4.0/4.1 call it (tests/integrations/spark/shapes.py):
    each AvailableNow run is one batch of everything available then."""
    from tests.integrations.spark.shapes import Spark40Source

    spark.dataSource.register(Spark40Source)
    for i in range(12):
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    first = _available_now(spark, tmp_path, "bus_spark40", conn, consumer="old")
    assert [sorted(b) for b in first] == [sorted(f"m{i}" for i in range(12))]
    for i in range(12, 15):
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    second = _available_now(spark, tmp_path, "bus_spark40", conn, consumer="old")
    assert [sorted(b) for b in second] == [["m12", "m13", "m14"]]
    assert depth(client) == 0


@data_source
def test_a_failed_batch_read_is_read_again_by_the_next_run_whatever_its_run_key(
        spark: Any, conn: dict[str, str], client: Bus, tmp_path: Path) -> None:
    for i in range(20):
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    failing = spark.read.format("bus").options(**conn, endpoint="sink", run_key="day-1",
                                               message_type=SALE).load()
    with pytest.raises(Exception, match="the job failed"):
        failing.mapInPandas(_fail, failing.schema).write.parquet(str(tmp_path / "day-1"))
    # The next run uses a new run key (the scheduler's next day): it gets the messages.
    rows = spark.read.format("bus").options(**conn, endpoint="sink", run_key="day-2").load()
    rows.write.parquet(str(tmp_path / "day-2"))
    stored = spark.read.parquet(str(tmp_path / "day-2")).collect()
    assert sorted(r.message_id for r in stored) == sorted(f"m{i}" for i in range(20))
    assert bus.spark.commit_read("sink", "day-2", connection_string=conn["connection_string"],
                                 prefix=conn["prefix"]) == 20
    assert depth(client) == 0
    # The same with the Spark 3.4 function: a receive whose results were never stored.
    for i in range(20, 26):
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    assert bus.spark.receive(spark, "sink", run_key="r-1", **options).count() == 6
    again = bus.spark.receive(spark, "sink", run_key="r-2", **options)  # r-1 failed
    assert sorted(r.message_id for r in again.collect()) == [f"m{i}" for i in range(20, 26)]


def test_a_batch_read_admits_copies_as_an_endpoint_does(
        spark: Any, conn: dict[str, str], client: Bus) -> None:
    """An expired copy is poisoned as expired and a copy not yet due stays queued (its
    sender's clock an hour ahead: it is visible before it is due, and goes back until due) -
    through the same admission as an endpoint's receiver. On both Spark lines."""
    ahead = seamed_bus(Seams(clock=lambda: time.time() + 3600), client.storage,
                       prefix=conn["prefix"], routes={RecordSale: "sink"})
    ahead.send(RecordSale(sale_id="early", amount=1), message_id="early", delay=1)
    client.send(RecordSale(sale_id="old", amount=2), message_id="old", ttl=1)
    client.send(RecordSale(sale_id="fresh", amount=3), message_id="fresh")
    time.sleep(2.5)  # the scheduled copy is visible now, the short-lived one has expired
    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    rows = bus.spark.receive(spark, "sink", run_key="admit", message_type=SALE, **options)
    assert [r.message_id for r in rows.collect()] == ["fresh"]
    assert bus.spark.commit_read("sink", "admit", **options) == 1
    [poisoned] = client.storage.queues.receive(client.names.poison_queue("sink"),
                                               max_messages=32, lease=1)
    entry = client.parts.poison_queue("sink").read(poisoned.body)
    assert entry.envelope is not None and entry.envelope.message_id == "old"
    assert entry.reason.startswith("expired: its time-to-live ended")
    # The early copy went back on the queue with its remaining delay: queued, token live.
    live = {t.message_id: t.state for t in client.parts.inbox.all("sink")}
    assert live == {"early": TokenState.LIVE, "old": TokenState.POISONED}
    assert depth(client) == 1
    assert bus.spark.receive(spark, "sink", run_key="again", **options).count() == 0


def _fail(frames: Any) -> Any:
    for _ in frames:
        raise RuntimeError("the job failed after reading")
    yield from ()


@data_source
def test_batch_reads_and_micro_batches_in_several_partitions(
        spark: Any, conn: dict[str, str], client: Bus, tmp_path: Path) -> None:
    from pyspark.sql.functions import spark_partition_id

    for i in range(40):
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    read = spark.read.format("bus").options(**conn, endpoint="sink", run_key="wide",
                                            partitions="4").load()
    rows = read.select("message_id", spark_partition_id().alias("p")).collect()
    assert sorted(r.message_id for r in rows) == sorted(f"m{i}" for i in range(40))
    assert Counter(r.p for r in rows) == {0: 10, 1: 10, 2: 10, 3: 10}
    assert bus.spark.commit_read("sink", "wide", connection_string=conn["connection_string"],
                                 prefix=conn["prefix"]) == 40
    for i in range(40, 70):
        client.send(RecordSale(sale_id=f"s{i}", amount=i), message_id=f"m{i}")
    shares: list[Counter[int]] = []

    def sink(batch: Any, batch_id: int) -> None:
        found = batch.select(spark_partition_id().alias("p")).collect()
        if found:
            shares.append(Counter(r.p for r in found))

    stream = spark.readStream.format("bus").options(
        **conn, endpoint="sink", consumer="wide", partitions="3").load()
    query = (stream.writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert shares == [Counter({0: 10, 1: 10, 2: 10})]


@data_source
def test_a_contract_defined_in_a_notebook_works_on_the_executors(
        spark: Any, conn: dict[str, str], client: Bus) -> None:
    """A class defined in a notebook cell lives in the driver's ``__main__``, which is another
    module on an executor: importing ``__main__:NotebookSale`` fails there. Passed as a class,
    or registered, it travels with the job (pickled by value)."""
    cell = {"__name__": "__main__"}  # a notebook cell's globals
    exec("from bus import Command\n"  # a notebook cell, run as one
         "class NotebookSale(Command):\n"
         "    sale_id: str\n"
         "    amount: int\n", cell)
    NotebookSale = cell["NotebookSale"]  # noqa: N806

    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    result = bus.spark.publish(sales(spark, 20), NotebookSale, destination="sink",
                               key_column="sale_id", **options)
    assert (result.rows, result.published) == (20, 20)
    bus.spark.register(spark, contracts=[NotebookSale])
    (sales(spark, 25).write.format("bus").options(**conn, message_type="NotebookSale",
                                                  destination="sink", key_column="sale_id")
     .mode("append").save())
    assert (latest(conn).published, latest(conn).already_sent) == (5, 20)
    assert tokens(client) == 25


@data_source
def test_a_streaming_sink_sends_each_row_once_across_restarts(
        spark: Any, conn: dict[str, str], client: Bus, tmp_path: Path) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()

    def arrive(name: str, start: int, n: int) -> None:
        rows = "\n".join(f'{{"sale_id": "s{i}", "amount": {i}}}' for i in range(start, start + n))
        (source / f"{name}.json").write_text(rows + "\n")

    def run() -> None:
        query = (spark.readStream.schema("sale_id string, amount int").json(str(source))
                 .writeStream.format("bus")
                 .options(**conn, message_type=SALE, destination="sink", key_column="sale_id")
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)

    arrive("a", 0, 30)
    run()
    assert tokens(client) == 30
    arrive("b", 25, 10)  # five rows again (a file written twice upstream), five new ones
    run()
    assert tokens(client) == 35
    assert (latest(conn).rows, latest(conn).published, latest(conn).already_sent) == (10, 5, 5)


@data_source
def test_a_sas_or_a_credential_provider_signs_on_the_executors(
        spark: Any, conn: dict[str, str], client: Bus) -> None:
    """No account key on the executors: a SAS, or a function that makes the credential in
    each process (anything azure-identity builds; the platforms' own: test_platforms.py)."""
    from tests.integrations.spark.jobs import azurite_sas

    settings = dict(part.split("=", 1) for part in conn["connection_string"].split(";")
                    if "=" in part)
    endpoints = ";".join(f"{service}={settings[f'{service.title()}Endpoint']}"
                         for service in ("blob", "queue", "table"))
    sas = azurite_sas().signature
    result = bus.spark.publish(sales(spark, 20), RecordSale, destination="sink",
                               key_column="sale_id", prefix=conn["prefix"],
                               endpoints=endpoints, sas_token=sas)
    assert (result.rows, result.published) == (20, 20)
    (sales(spark, 25).write.format("bus")
     .options(prefix=conn["prefix"], endpoints=endpoints,
              credential_provider="tests.integrations.spark.jobs:azurite_sas", message_type=SALE,
              destination="sink", key_column="sale_id")
     .mode("append").save())
    assert (latest(conn).published, latest(conn).already_sent) == (5, 20)
    assert tokens(client) == 25


SHIPMENT = "tests.integrations.spark.contracts:Shipment"


def shipments(spark: Any) -> Any:
    return spark.createDataFrame(
        [("s1", [("a", 2), ("b", 1)], {"city": "Oslo"}, bytearray(LABEL), ("a", 2)),
         ("s2", [], {}, bytearray(b""), None)],
        "shipment_id string, lines array<struct<sku:string,quantity:int>>, "
        "address map<string,string>, label binary, first struct<sku:string,quantity:int>")


@pytest.mark.parametrize("via", [pytest.param("format", marks=data_source), "publish"])
def test_structs_arrays_maps_and_binary_go_out_and_come_back_typed(
        spark: Any, conn: dict[str, str], via: str) -> None:
    from tests.integrations.spark.contracts import Shipment

    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    if via == "format":
        (shipments(spark).write.format("bus")
         .options(**conn, message_type=SHIPMENT, destination="sink", key_column="shipment_id")
         .mode("append").save())
        read = (spark.read.format("bus")
                .options(**conn, endpoint="sink", run_key="typed", message_type=SHIPMENT)
                .load())
    else:
        bus.spark.publish(shipments(spark), Shipment, destination="sink",
                          key_column="shipment_id", **options)
        read = bus.spark.receive(spark, "sink", run_key="typed", message_type=Shipment,
                                 **options)
    assert read.schema["lines"].dataType.simpleString() == \
        "array<struct<sku:string,quantity:bigint>>"
    rows = {r.shipment_id: r for r in read.collect()}
    s1, s2 = rows["s1"], rows["s2"]
    assert [(line.sku, line.quantity) for line in s1.lines] == [("a", 2), ("b", 1)]
    assert (s1.address, bytes(s1.label), s1.first.sku) == ({"city": "Oslo"}, LABEL, "a")
    assert (s2.lines, s2.address, bytes(s2.label), s2.first) == ([], {}, b"", None)


@pytest.mark.parametrize("via", [pytest.param("format", marks=data_source), "receive"])
def test_a_schema_given_picks_columns_and_can_ask_for_text_or_bytes(
        spark: Any, conn: dict[str, str], via: str) -> None:
    from tests.integrations.spark.contracts import Shipment

    options = {"connection_string": conn["connection_string"], "prefix": conn["prefix"]}
    bus.spark.publish(shipments(spark), Shipment, destination="sink", key_column="shipment_id",
                      **options)
    schema = "shipment_id string, lines string, label binary, payload binary"
    if via == "format":
        def read(schema: str) -> Any:
            return (spark.read.format("bus").schema(schema)
                    .options(**conn, endpoint="sink", run_key="picked", message_type=SHIPMENT)
                    .load().collect())
    else:
        def read(schema: str) -> Any:
            return bus.spark.receive(spark, "sink", run_key="picked", message_type=Shipment,
                                     schema=schema, **options).collect()
    with pytest.raises(Exception, match=r"'label' is binary \(or string\), not bigint"):
        read("shipment_id string, label bigint")
    rows = {r.shipment_id: r for r in read(schema)}
    assert list(rows["s1"].asDict()) == ["shipment_id", "lines", "label", "payload"]
    assert rows["s1"].lines == '[{"sku": "a", "quantity": 2}, {"sku": "b", "quantity": 1}]'
    assert bytes(rows["s1"].label) == LABEL
    assert Shipment.model_validate_json(bytes(rows["s2"].payload)).shipment_id == "s2"
