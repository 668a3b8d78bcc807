"""The Spark scenario: tasks publishing rows through the bus, against a raw send loop.

Per Spark setting (``cfg.spark_cores``: ``local[1]``, then ``local[2]``; a SparkSession each,
on one Azurite; the DataFrame has one partition per core) three kinds of write alternate,
``cfg.spark_runs`` times each (raw, bus, publish, raw, bus, publish, ...):

* **raw** - ``df.foreachPartition`` with a plain azure-storage-queue ``send_message`` of each
  row as JSON, one request per row: the loop a data engineer writes without the bus (no
  tokens, no marks; at-least-once: a retried task sends its rows again);
* **bus** - ``df.write.format("bus")`` with ``key_column``: each task sends its rows with
  ``Bus.send_once_many`` (tokens and send marks 50 copies to a transaction, signals
  bundled), exactly once per message id;
* **publish** - ``bus.spark.publish``'s work (its ``JobWriter``, in a ``mapInArrow`` task),
  over storage that counts every port call and HTTP request in the executor; each task returns
  its counts with its report, so the driver gets the storage requests per row.

Each run writes into a queue (or destination endpoint) of its own, created before the clock
starts, so no run sends into a queue another left deep. A run's time is the wall time of its
Spark action as the caller sees it (for the bus that includes the driver's preparation -
provisioning, idempotent - and storing the job's result). Before the timed runs each session
runs one small job of each kind (Python workers started, modules imported), then another
small job of each kind to show the fixed cost of a job. After the runs at the last setting, a
batch read (``spark.read.format("bus")``) of one bus run's destination measures consuming.

Checked: every raw queue holds exactly one message per row; every bus run reports every row
published, none refused; the batch read returns each of its run's rows once.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench import cpu
from bench.config import BenchConfig
from bench.harness import BenchError, ScenarioResult, progress
from bus import Command
from bus.integrations.spark.options import Connection, WriteOptions
from bus.storage import Storage
from bus.testing.counting import OpCounter, counting_storage

KEY = "spark"
TITLE = "Spark write: bus (send_once_many) vs raw queue sends, rows/s"
VARIANTS = ("raw", "bus", "publish")
SMALL = 20
"""Rows of the warm-up jobs and of the jobs that show the fixed cost of a job."""


class SparkRow(Command):
    """The contract each row becomes (the sample app's PlaceOrder, under a bench name)."""

    order_id: str
    customer: str
    amount_cents: int


CONTRACT = f"{SparkRow.__module__}:{SparkRow.__qualname__}"


# -- in the executors -------------------------------------------------------------------------
_COUNTER = OpCounter()
"""The port calls of this process's counted storage. A Python worker runs one task at a time
and may be reused for the next: a task reports the difference."""


@dataclass(frozen=True)
class CountedConnection(Connection):
    """A connection whose storage counts every port call in this process's ``_COUNTER``."""

    def storage(self) -> Storage:
        storage, _ = counting_storage(super().storage(), _COUNTER)
        return storage


class RawSend:
    """``foreachPartition``: one plain queue send per row, the row as JSON. Adds the task's
    CPU seconds to ``cpu`` (an accumulator)."""

    def __init__(self, connection: str, queue: str, cpu_seconds: Any) -> None:
        self.connection = connection
        self.queue = queue
        self.cpu_seconds = cpu_seconds

    def __call__(self, rows: Iterable[Any]) -> None:
        from azure.storage.queue import QueueClient

        began = time.process_time()
        client = QueueClient.from_connection_string(self.connection, self.queue)
        for row in rows:
            client.send_message(json.dumps(row.asDict(), separators=(",", ":")))
        self.cpu_seconds.add(time.process_time() - began)


_REPORT = ("partition_id int, rows long, published long, already_sent long, refused long, "
           "no_subscriber long, reasons array<string>, ops string, requests string, "
           "seconds double, cpu_seconds double")


class CountedPublish:
    """``mapInArrow``: what ``bus.spark.publish``'s task does (``JobWriter.publish`` of the
    partition's rows), over counted storage; its report row also carries the task's port calls,
    HTTP requests, wall and CPU seconds."""

    def __init__(self, job: Any, connection: str) -> None:
        self.job = job
        self.connection = connection

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
        from pyspark import TaskContext

        from bench.wire import counting_requests
        from bus.integrations.spark.compat import report_fields, report_values

        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        before = _COUNTER.snapshot()
        with counting_requests(self.connection) as wire:
            began, began_cpu = time.perf_counter(), time.process_time()
            rows = (row for batch in batches for row in batch.to_pylist())
            report = self.job.publish(partition_id, rows)
            seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - began_cpu
            requests = wire.totals()
        yield pa.RecordBatch.from_pylist([{
            **report_values(report),
            "ops": json.dumps(_named(_since(before, _COUNTER.snapshot()))),
            "requests": json.dumps(_named(requests)),
            "seconds": seconds, "cpu_seconds": cpu_seconds}], schema=pa.schema([
                *report_fields(), ("ops", pa.string()), ("requests", pa.string()),
                ("seconds", pa.float64()), ("cpu_seconds", pa.float64())]))


def _since(before: dict[tuple[str, str], int],
           after: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    return {key: n - before.get(key, 0) for key, n in after.items() if n - before.get(key, 0)}


def _named(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    return {f"{service}.{op}": n for (service, op), n in sorted(counts.items())}


def _add(total: dict[str, int], counts: dict[str, int]) -> None:
    for key, n in counts.items():
        total[key] = total.get(key, 0) + n


# -- on the driver ----------------------------------------------------------------------------
@dataclass
class Run:
    """One timed Spark write."""

    variant: str
    cores: int
    index: int
    rows: int
    seconds: float
    azurite_cpu_s: float = 0.0
    worker_cpu_s: float | None = None
    """CPU seconds of the tasks' Python workers (their own measurement)."""
    ops: dict[str, int] = field(default_factory=dict)
    """Port calls in the executors, by ``service.operation`` (counted runs only)."""
    requests: dict[str, int] = field(default_factory=dict)
    """HTTP requests in the executors (counted runs only)."""
    driver_ops: dict[str, int] = field(default_factory=dict)
    """Port calls on the driver: provisioning, the job's result (counted runs only)."""
    task_seconds: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def frame(spark: Any, rows: int, partitions: int) -> Any:
    """``rows`` orders in ``partitions`` partitions."""
    return spark.range(0, rows, numPartitions=partitions).selectExpr(
        "format_string('order-%07d', id) AS order_id",
        "format_string('customer-%04d', id % 50) AS customer",
        "CAST(500 + (id * 37) % 9500 AS INT) AS amount_cents")


def raw_run(spark: Any, connection: str, name: str, rows: int, cores: int,
            *, index: int = 0) -> Run:
    from azure.storage.queue import QueueClient

    queue = QueueClient.from_connection_string(connection, name)
    queue.create_queue()
    df = frame(spark, rows, cores)
    worker_cpu = spark.sparkContext.accumulator(0.0)
    began = cpu.sample()
    df.foreachPartition(RawSend(connection, name, worker_cpu))
    used = cpu.CpuUse.between(began, cpu.sample())
    count = queue.get_queue_properties().approximate_message_count
    if count != rows:
        raise BenchError(f"spark raw: {count} messages in {name} for {rows} rows")
    return Run("raw", cores, index, rows, used.wall_s, used.azurite_s, worker_cpu.value,
               requests={"queue.send": rows})


def bus_run(spark: Any, connection: str, destination: str, rows: int, cores: int,
            *, index: int = 0) -> Run:
    import bus.spark

    bus.spark.subscribe(destination, connection_string=connection)  # its app provisions it
    df = frame(spark, rows, cores)
    began = cpu.sample()
    (df.write.format("bus").option("connection_string", connection)
     .option("message_type", CONTRACT).option("destination", destination)
     .option("key_column", "order_id").mode("append").save())
    used = cpu.CpuUse.between(began, cpu.sample())
    [result] = bus.spark.write_results(limit=1, connection_string=connection)
    _check(result, rows, destination)
    return Run("bus", cores, index, rows, used.wall_s, used.azurite_s)


def publish_run(spark: Any, connection: str, destination: str, rows: int, cores: int,
                *, index: int = 0) -> Run:
    import bus.spark
    from bus.integrations.spark.compat import report_of
    from bus.integrations.spark.writer import JobWriter, check_columns

    bus.spark.subscribe(destination, connection_string=connection)  # its app provisions it
    options = WriteOptions(CountedConnection(connection_string=connection), CONTRACT,
                           destination=destination, key_columns=("order_id",))
    df = frame(spark, rows, cores)
    driver_before = _COUNTER.snapshot()
    began = cpu.sample()
    # bus.spark.publish, with the task above (which also returns the counts).
    job = JobWriter(options)
    check_columns(options.contract(), df.columns, options.key_columns)
    job.prepare()
    reports = df.mapInArrow(CountedPublish(job, connection), _REPORT).collect()
    result = job.commit([report_of(r) for r in reports])
    used = cpu.CpuUse.between(began, cpu.sample())
    _check(result, rows, destination)
    ops: dict[str, int] = {}
    requests: dict[str, int] = {}
    for r in reports:
        _add(ops, json.loads(r["ops"]))
        _add(requests, json.loads(r["requests"]))
    return Run("publish", cores, index, rows, used.wall_s, used.azurite_s,
               sum(float(r["cpu_seconds"]) for r in reports), ops=ops, requests=requests,
               driver_ops=_named(_since(driver_before, _COUNTER.snapshot())),
               task_seconds=[round(float(r["seconds"]), 3) for r in reports])


def _check(result: Any, rows: int, destination: str) -> None:
    if result.rows != rows or result.published != rows or result.refused:
        raise BenchError(f"spark bus: {destination}: {rows} rows, but {result}")


RUNNERS: dict[str, Callable[..., Run]] = {"raw": raw_run, "bus": bus_run,
                                           "publish": publish_run}


@dataclass
class ReadRun:
    rows: int
    seconds: float
    azurite_cpu_s: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def read_run(spark: Any, connection: str, destination: str, rows: int) -> ReadRun:
    """A batch read of ``destination``: drained and staged on the driver, then read."""
    began = cpu.sample()
    found = (spark.read.format("bus").option("connection_string", connection)
             .option("endpoint", destination).option("run_key", "bench")
             .option("message_type", CONTRACT).option("max_messages", str(rows + 100))
             .load().select("order_id").collect())
    used = cpu.CpuUse.between(began, cpu.sample())
    ids = [r["order_id"] for r in found]
    if len(ids) != rows or len(set(ids)) != rows:
        raise BenchError(f"spark read: {len(ids)} rows ({len(set(ids))} distinct) for the "
                         f"{rows} published")
    return ReadRun(len(ids), used.wall_s, used.azurite_s)


def summarize(runs: list[Run]) -> dict[int, dict[str, Any]]:
    """Per setting: the median rows/s of each variant, the median of the runs' ratios to the
    raw run of the same round, and the counted requests per row."""
    out: dict[int, dict[str, Any]] = {}
    for cores in sorted({r.cores for r in runs}):
        mine = [r for r in runs if r.cores == cores]
        by = {v: sorted((r for r in mine if r.variant == v), key=lambda r: r.index)
              for v in VARIANTS}
        raw = {r.index: r for r in by["raw"]}
        entry: dict[str, Any] = {}
        for variant in VARIANTS:
            if by[variant]:
                entry[f"{variant}_rows_per_s"] = statistics.median(r.rate for r in by[variant])
        for variant in ("bus", "publish"):
            ratios = [r.rate / raw[r.index].rate for r in by[variant]
                      if r.index in raw and raw[r.index].rate]
            entry[f"{variant}_ratios"] = ratios
            entry[f"{variant}_to_raw_ratio"] = statistics.median(ratios) if ratios else None
        counted = by["publish"]
        rows = sum(r.rows for r in counted)
        ops: dict[str, int] = {}
        requests: dict[str, int] = {}
        driver: dict[str, int] = {}
        for r in counted:
            _add(ops, r.ops)
            _add(requests, r.requests)
            _add(driver, r.driver_ops)
        entry.update(counted_rows=rows, ops=ops, requests=requests, driver_ops=driver,
                     counted_jobs=len(counted),
                     ops_per_row=sum(ops.values()) / rows if rows else None,
                     requests_per_row=sum(requests.values()) / rows if rows else None)
        out[cores] = entry
    return out


def run(cfg: BenchConfig) -> ScenarioResult:
    try:
        from spark.session import local_session  # the sample jobs' settings
    except ImportError as exc:  # pyspark missing
        raise BenchError(f"spark: {exc}") from exc
    from bench.emulator import azurite

    runs: list[Run] = []
    sessions: dict[int, dict[str, float]] = {}
    read: ReadRun | None = None
    try:
        with azurite(cfg.latency_ms) as connection:
            for cores in cfg.spark_cores:
                began = time.perf_counter()
                spark = local_session(f"bench-spark-local-{cores}", master=f"local[{cores}]")
                info = {"session_s": time.perf_counter() - began}
                try:
                    began = time.perf_counter()
                    for variant in VARIANTS:  # Python workers up, modules imported
                        RUNNERS[variant](spark, connection, f"warm-{variant}-{cores}", SMALL,
                                         cores)
                    info["warmup_s"] = time.perf_counter() - began
                    for variant in VARIANTS:  # the fixed cost of a job
                        info[f"small_{variant}_s"] = RUNNERS[variant](
                            spark, connection, f"small-{variant}-{cores}", SMALL,
                            cores).seconds
                    for index in range(cfg.spark_runs):
                        for variant in VARIANTS:
                            done = RUNNERS[variant](spark, connection,
                                                    f"{variant}-l{cores}-{index}",
                                                    cfg.spark_rows, cores, index=index)
                            runs.append(done)
                            progress(f"      local[{cores}] {variant} run {index + 1}: "
                                     f"{done.rate:.0f} rows/s ({done.rows} in "
                                     f"{done.seconds:.2f} s)")
                    if cores == cfg.spark_cores[-1]:
                        read = read_run(spark, connection, f"bus-l{cores}-{cfg.spark_runs - 1}",
                                        cfg.spark_rows)
                finally:
                    spark.stop()
                sessions[cores] = info
    except BenchError:
        raise
    except Exception as exc:  # a Spark job failed: report it, let the other scenarios stand
        raise BenchError(f"spark: {type(exc).__name__}: {str(exc)[:400]}") from exc
    summary = summarize(runs)
    headline = [r for r in runs if r.cores == cfg.spark_cores[-1] and r.variant == "bus"]
    return ScenarioResult(
        key=KEY, title=TITLE, units=sum(r.rows for r in headline),
        seconds=sum(r.seconds for r in headline),
        verified=(f"every raw queue holds one message per row; every bus job published all "
                  f"{cfg.spark_rows} rows, none refused; the batch read returned each of "
                  f"its {read.rows if read else 0} rows once"),
        extra={"spark_runs": runs, "spark_summary": summary, "spark_sessions": sessions,
               "spark_read": read, "spark_rows": cfg.spark_rows})
