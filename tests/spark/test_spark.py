"""The Spark integration on a local SparkSession against Azurite (docs/spark.md).

Writes: a batch write sends each row once; a task that fails mid-partition and is retried
sends nothing twice; a re-run with the same run key sends nothing new. Reads: a batch read
stages once per run key; a streaming query that fails mid-batch and restarts from its checkpoint
sees every message exactly once. And the Spark 3.4 functions on the same session: on Spark 3.x
(PySpark 3.5 in requirements-py310.txt) only they run, the data source needs Spark 4.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark[sql] is pinned in requirements-dev.txt")

import pyspark

import bus.spark
from bus import Bus
from bus.adapters.azure import AzureStorage
from tests.spark.contracts import RecordSale, SaleRecorded
from tests.spark.jobs import FailOnce

pytestmark = pytest.mark.azurite

SALE = "tests.spark.contracts:RecordSale"

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


def sales(spark: Any, n: int, partitions: int = 2) -> Any:
    return spark.range(0, n, 1, partitions).selectExpr(
        "concat('sale-', cast(id as string)) as sale_id", "cast(id as int) as amount",
        "'ignored' as extra")


def write(df: Any, conn: dict[str, str], **options: str) -> None:
    (df.write.format("bus").options(**conn, message_type=SALE, destination="sink", **options)
     .mode("append").save())


@data_source
def test_batch_write_then_batch_read(spark: Any, conn: dict[str, str], client: Bus) -> None:
    write(sales(spark, 40, 3), conn, key_column="sale_id")
    assert depth(client) == 40
    read = spark.read.format("bus").options(**conn, endpoint="sink", run_key="read-1",
                                            message_type=SALE)
    rows = read.load().collect()
    assert sorted(r.message_id for r in rows) == sorted(f"sale-{i}" for i in range(40))
    assert {r.sale_id: r.amount for r in rows} == {f"sale-{i}": i for i in range(40)}
    assert {r.source for r in rows} == {"client"} and rows[0].sent_at is not None
    assert depth(client) == 0
    write(sales(spark, 1), conn, run_key="later")  # a new message; the run key's rows stay
    again = read.load().collect()
    assert sorted(r.message_id for r in again) == sorted(r.message_id for r in rows)
    assert bus.spark.forget_read("sink", "read-1", connection_string=conn["connection_string"],
                                 prefix=conn["prefix"]) == 41  # 40 rows and the closing marker


@pytest.mark.parametrize("via", [pytest.param("format", marks=data_source), "publish"])
def test_a_task_failing_mid_partition_is_retried_without_duplicates(
        spark: Any, conn: dict[str, str], client: Bus, tmp_path: Path, via: str) -> None:
    rows = 320 if via == "format" else 120  # publish: the same paths with fewer rows
    df = sales(spark, rows, 2)
    after = rows * 3 // 8  # partition 1 fails after its first chunk of 50 rows or more
    flaky = df.mapInPandas(FailOnce(tmp_path / "failed", partition=1, after=after), df.schema)
    if via == "format":
        write(flaky, conn, run_key="retry")
    else:
        result = bus.spark.publish(flaky, RecordSale, destination="sink", run_key="retry",
                                   connection_string=conn["connection_string"],
                                   prefix=conn["prefix"])
        assert (result.rows, result.published, result.already_sent) == (rows, rows, 0)
    assert (tmp_path / "failed").exists()  # the first attempt of partition 1 did fail
    got = bus.spark.receive(spark, "sink", run_key="check", message_type=SALE,
                            connection_string=conn["connection_string"], prefix=conn["prefix"])
    ids = Counter(r.message_id for r in got.select("message_id").collect())
    assert len(ids) == rows and max(ids.values()) == 1
    assert set(ids) == {f"retry-{p}-{i}" for p in (0, 1) for i in range(rows // 2)}
    staging = client.storage.tables.query(f"{conn['prefix']}busstaging")
    assert [e.partition_key for e in staging if e.partition_key.startswith("w~")] == []


@data_source
def test_a_rerun_with_the_same_run_key_sends_nothing_new(
        spark: Any, conn: dict[str, str], client: Bus) -> None:
    write(sales(spark, 30), conn, run_key="nightly")
    assert depth(client) == 30
    write(sales(spark, 30), conn, run_key="nightly")  # the whole job again
    assert depth(client) == 30
    result = bus.spark.publish(sales(spark, 30), RecordSale, destination="sink",
                               run_key="nightly", connection_string=conn["connection_string"],
                               prefix=conn["prefix"])
    assert (result.rows, result.published, result.already_sent) == (30, 0, 30)
    assert depth(client) == 30


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
    assert again.count() == 20 and depth(client, "watcher") == 0
