"""The Spark integration's side in the simulation: a write job and a streaming read, run by
the real ``JobWriter``, ``Drainer`` and ``StreamConsumer`` over the simulated store.

Spark itself does not run here; what it does around those classes does, in the order the
integration's own modules describe (``bus.integrations.spark.stream``, ``compat``, ``source``,
which call the same methods; ``tests/integrations/spark`` runs them under a real local Spark):

* a write job sends every partition from a task; a task may fail part-way and run again, or
  run twice at once (a speculative copy, interleaved with the first), and Spark keeps one
  attempt's report per partition, which the driver adds up. A job that fails is run again
  with the same key column, a fresh job id; the driver may die anywhere (the actor crashes
  and starts over: a re-run);
* a streaming query asks the source for the latest offset, writes the planned range to its
  offset log, reads the batches into its sink, writes its commit log, and only then tells the
  source to commit (Spark calls ``commit`` when it plans the next batch). After a crash it runs
  the batch of its offset log again, then goes on from its commit log. The sink keeps what
  each micro-batch read, by batch: a replayed batch must read the same rows. Spark's calls
  come in one of two shapes for a run: 4.2+ passes the start offset and a read limit
  (``ReadMaxRows`` of ``max_rows_per_trigger``, or all available) and prepares
  ``Trigger.AvailableNow``; 4.0/4.1 pass nothing, and run AvailableNow as one batch, as
  ``Trigger.Once`` (``bus.integrations.spark.source``). Each start of the query draws its
  trigger (processing time; AvailableNow or Once, after which the query ends and is started
  again later), its limit and its partitions;
* or (in half of the runs with Spark) batch reads instead of the stream: a job reads with a
  run key (``bus.integrations.spark.batch``), stores the rows under that run key (a write
  that replaces) and commits the read. It fails anywhere (the driver dies; a job failure
  after reading or after storing); then it runs again with the same run key, or with a new
  one, or goes back to an older failed one (a backfill), and a commit that failed is tried
  again or not. Only the reads the registry holds as committed count: each event must be in
  exactly one of their results.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bus.bus import Bus
from bus.integrations.spark.batch import (
    ABANDONED,
    COMMITTED,
    DONE,
    BatchRead,
    ReadClosed,
    registry_key,
    sweep_reads,
)
from bus.integrations.spark.options import Connection, WriteOptions, class_path
from bus.integrations.spark.reader import Drainer, staged_rows, subscribe
from bus.integrations.spark.staging import Staging
from bus.integrations.spark.stream import StreamConsumer
from bus.integrations.spark.writer import RESULTS, JobWriter, PartReport, sweep
from bus.messages import Message, topic_of
from bus.storage import Storage, StorageError
from bus.testing.simulate.world import Actor, World

READER = "r"
"""The endpoint a Spark streaming query reads: a subscriber of the event, without handlers."""
CONSUMER = "sim"
RUN_KEY = "sim"
RETRY_TASK = 0.3
"""The chance that a partition's task runs once more (a retry, or a speculative copy)."""


class SimConnection(Connection):
    """A connection to the simulated store: the job's buses get the run's seams."""

    def __init__(self, storage: Storage, bus_for: Callable[[Mapping[Any, str] | None], Bus],
                 prefix: str) -> None:
        super().__init__(connection_string="memory:simulation", prefix=prefix)
        object.__setattr__(self, "_store", storage)
        object.__setattr__(self, "_bus_for", bus_for)

    def storage(self) -> Storage:
        store: Storage = object.__getattribute__(self, "_store")
        return store

    def bus(self, routes: Mapping[Any, str] | None = None,
            storage: Storage | None = None) -> Bus:
        make: Callable[[Mapping[Any, str] | None], Bus] = object.__getattribute__(self,
                                                                                "_bus_for")
        return make(routes)


@dataclass
class Checkpoint:
    """Spark's checkpoint of the streaming query, or the batch job's results and its driver's
    notes: they survive the driver (the actor)."""

    committed: dict[str, int] | None = None
    planned: tuple[dict[str, int], dict[str, int]] | None = None
    sink: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    batch: bool = False
    """Batch reads instead of the stream (``sink`` by run key)."""
    run_key: int = 0
    """The batch job's current run (its run key ``k<n>``)."""
    phase: str = ""
    """Where the current run was: "" (new), "reading", "stored", "committing"."""
    failed: list[int] = field(default_factory=list)
    """Runs that failed and were left (a backfill may go back to one)."""
    next_run: int = 0


def writer(world: World, connection: SimConnection, contract: type[Message], *,
           destination: str, partitions: Sequence[Sequence[Mapping[str, Any]]],
           counts: Counter[str]) -> Callable[[], None]:
    """A write job of ``partitions`` (rows as column -> value), run until it succeeds."""
    options = WriteOptions(connection=connection, message_class=class_path(contract),
                           destination=destination, key_columns=("root",), run_key=RUN_KEY,
                           parallelism=1)

    def run() -> None:
        while True:
            counts["spark_jobs"] += 1
            job = JobWriter(options, sleep=world.sleep, clock=world.now, new_id=world.new_id,
                            random=world.rng.random)
            try:
                job.prepare()
                copies: list[Actor] = []
                reports = [_task(world, job, index, rows, counts=counts, copies=copies)
                           for index, rows in enumerate(partitions)]
                while not all(copy.finished for copy in copies):
                    world.sleep(0.1)  # the job ends with its speculative copies
                counts["spark_rows_published"] += job.commit(reports).published
                return
            except StorageError:
                world.sleep(1.0)  # the job failed: run again, same run key, fresh job id

    return run


def _task(world: World, job: JobWriter, partition: int, rows: Sequence[Mapping[str, Any]],
          *, counts: Counter[str], copies: list[Actor]) -> PartReport:
    """One partition's task: it may fail and run again, or have a speculative copy running
    alongside (an actor of its own, in ``copies``); Spark keeps one report."""
    reports: list[PartReport] = []
    while not reports or world.rng.random() < RETRY_TASK:
        counts["spark_task_attempts"] += 1
        if reports and world.rng.random() < 0.5:
            copy = Actor(f"spark-task-{partition}-copy{len(copies)}",
                         _speculative(job, partition, rows))
            copies.append(copy)
            world.spawn(copy)
            continue
        with contextlib.suppress(StorageError):  # the task failed; Spark runs it again
            reports.append(job.publish(partition, rows))
    return reports[world.rng.randrange(len(reports))]


def _speculative(job: JobWriter, partition: int,
                 rows: Sequence[Mapping[str, Any]]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.suppress(StorageError):  # a failed copy: Spark ignores it
            job.publish(partition, rows)

    return run


def reader(world: World, bus: Bus, checkpoint: Checkpoint,
           counts: Counter[str]) -> Callable[[], None]:
    """A streaming query over ``READER``'s queue, restarted from its checkpoint after a
    crash or a failed batch, or the batch job (``checkpoint.batch``)."""
    old_calls = world.rng.random() < 0.5  # Spark 4.0/4.1 for the whole run

    def run() -> None:
        staging = Staging(bus.storage, bus.names.prefix, sleep=world.sleep,
                          random=world.rng.random)
        drainer = Drainer(bus, staging, READER, lease_seconds=10.0, parallelism=1)
        ready = False
        while True:
            try:
                if not ready:  # (the write job may not have created it yet)
                    staging.ensure()
                    ready = True
                if checkpoint.batch:
                    _batch_job(world, BatchRead(drainer, staging), staging, checkpoint, counts)
                    continue
                max_rows = world.rng.choice((None, 1, 2, 4))
                consumer = StreamConsumer(drainer, staging, CONSUMER, max_rows=max_rows,
                                          partitions=world.rng.randint(1, 3), poll_seconds=0.5,
                                          clock=world.now, sleep=world.sleep)
                trigger = world.rng.choice(("processing", "available-now", "once"))
                _query(world, consumer, staging, checkpoint, counts, trigger=trigger,
                       old_calls=old_calls)
                world.sleep(world.rng.uniform(0.5, 3.0))  # ended: scheduled again later
            except StorageError:
                world.sleep(1.0)  # the query failed; started again from its checkpoint

    return run


def _query(world: World, consumer: StreamConsumer, staging: Staging, checkpoint: Checkpoint,
           counts: Counter[str], *, trigger: str, old_calls: bool) -> None:
    """One start of the query, until it ends (AvailableNow, Once) or fails."""
    once = trigger == "once" or (trigger == "available-now" and old_calls)
    if checkpoint.planned is not None:  # the offset log holds a batch not committed: again
        counts["spark_batches_replayed"] += 1
        _batch(consumer, staging, checkpoint, *checkpoint.planned)
        if once:
            return  # Spark's single batch was that one
    start = checkpoint.committed or consumer.initial_offset()
    if trigger == "available-now" and not old_calls:
        consumer.prepare_available_now()
    while True:
        if old_calls:
            end = consumer.latest_offset()
        else:  # Once passes ReadAllAvailable; otherwise the source's default limit
            limit = None if trigger == "once" else consumer.max_rows
            end = consumer.latest_offset(start, limit)
        if end == start:
            if trigger != "processing":
                return  # no new data: the run is over
            world.sleep(0.5)
            continue
        checkpoint.planned = (start, end)
        counts["spark_batches"] += 1
        _batch(consumer, staging, checkpoint, start, end)
        start = end
        if once:
            return


def _batch(consumer: StreamConsumer, staging: Staging, checkpoint: Checkpoint,
           start: dict[str, int], end: dict[str, int]) -> None:
    for keys in consumer.splits(start, end):  # one task per input partition
        for key in keys:
            rows = staged_rows(staging, key, None)
            if key in checkpoint.sink and checkpoint.sink[key] != rows:
                checkpoint.violations.append(f"spark: micro-batch {key} read other rows when "
                                             "replayed")
            checkpoint.sink[key] = rows
    checkpoint.committed, checkpoint.planned = end, None  # the commit log
    consumer.commit(end)  # Spark tells the source when it plans the next batch


class _JobFailed(Exception):
    """The batch job failed (a task, the sink): the driver lives on, the run is over."""


def _batch_job(world: World, reads: BatchRead, staging: Staging, checkpoint: Checkpoint,
               counts: Counter[str]) -> None:
    """One run of the batch job, as its driver (or the scheduler after a failure) starts it."""
    rng = world.rng
    phase, run = checkpoint.phase, checkpoint.run_key
    if phase == "committing" and rng.random() < 0.5:  # its commit failed: tried again
        with contextlib.suppress(ReadClosed):
            reads.commit(f"k{run}")
        checkpoint.phase = ""
        return
    if phase:  # the run failed (the driver died, or the job)
        checkpoint.failed.append(run)
        if rng.random() < 0.2:  # a backfill: one of the failed runs again
            run = checkpoint.failed.pop(rng.randrange(len(checkpoint.failed)))
        elif rng.random() < 0.5:  # the same run again
            run = checkpoint.failed.pop()
        else:
            run = checkpoint.next_run = checkpoint.next_run + 1
    else:
        run = checkpoint.next_run = checkpoint.next_run + 1
    checkpoint.run_key, checkpoint.phase, key = run, "reading", f"k{run}"
    counts["spark_batch_reads"] += 1
    try:
        keys = reads.read(key, rng.randint(1, 6), partitions=rng.randint(1, 3))
        rows = [row for chunk in keys for row in staged_rows(staging, chunk, None)]
        if rng.random() < 0.15:
            raise _JobFailed  # after reading
        checkpoint.sink[key] = rows  # stored: replaces what an earlier attempt stored
        checkpoint.phase = "stored"
        if rng.random() < 0.15:
            raise _JobFailed  # after storing its results, before the commit
        checkpoint.phase = "committing"
        reads.commit(key)
    except ReadClosed:
        counts["spark_batch_reads_refused"] += 1  # committed, or given up by a later read
    except _JobFailed:
        counts["spark_batch_reads_failed"] += 1
        world.sleep(1.0)
        return
    checkpoint.phase = ""
    world.sleep(rng.uniform(0.2, 1.5))


def subscribe_reader(bus: Bus, event: type[Message]) -> None:
    """Make ``READER`` a subscriber of ``event``'s topic (before the run starts)."""
    subscribe(bus, READER, [topic_of(event)])  # type: ignore[arg-type]


def read_roots(bus: Bus, checkpoint: Checkpoint) -> Counter[int]:
    """How often each root's event reached the sink (of the committed batch reads)."""
    sinks = checkpoint.sink
    if checkpoint.batch:
        staging = Staging(bus.storage, bus.names.prefix)
        counted = {f"{row_key}" for row_key, values in staging.rows(registry_key(READER))
                   if values["state"] in (COMMITTED, DONE)}
        sinks = {key: rows for key, rows in sinks.items() if key in counted}
    return Counter(int(json.loads(row[-1])["root"]) for rows in sinks.values() for row in rows)


def unread(bus: Bus, checkpoint: Checkpoint) -> bool:
    """Whether the query has a batch planned, or the source a staged micro-batch the query
    has not committed yet (its messages are taken from the queue: the run is not over until
    the sink has them). Batch reads keep their tokens live until committed: the run's check
    of in-flight tokens covers them."""
    if checkpoint.batch:
        return False
    if checkpoint.planned is not None:
        return True
    committed = (checkpoint.committed or {"batch": 0})["batch"]
    staging = Staging(bus.storage, bus.names.prefix)
    prefix = f"s~{CONSUMER}~"
    return any(int(entity.partition_key[len(prefix):]) > committed
               for entity in staging.tables.query(staging.table)
               if entity.partition_key.startswith(prefix))


def left_in_staging(bus: Bus, checkpoint: Checkpoint, now: float) -> list[str]:
    """What is left in staging once the query plans one more batch (Spark tells the source
    then what it committed), or the batch job reads once more (and commits: the queue is
    empty), and a sweep has removed what failed write jobs left: anything but the consumer's
    cursor, the batch reads' registry (of reads done or given up) and the write jobs' results
    is left behind."""
    staging = Staging(bus.storage, bus.names.prefix)
    drainer = Drainer(bus, staging, READER, lease_seconds=10.0, parallelism=1)
    if checkpoint.committed is not None:
        StreamConsumer(drainer, staging, CONSUMER, max_rows=1).commit(checkpoint.committed)
    left: list[str] = []
    if checkpoint.batch:
        reads = BatchRead(drainer, staging)
        if any(read.state not in (DONE, ABANDONED) for read in reads.states()):
            keys = reads.read("last", 1)
            left.extend(f"the last batch read took {row[0]}"
                        for key in keys for row in staged_rows(staging, key, None))
            reads.commit("last")
        left.extend(f"batch read {read.run_key} is {read.state}" for read in reads.states()
                    if read.state not in (DONE, ABANDONED))
    sweep(staging, older_than=0.0, now=now + 1.0)
    sweep_reads(staging)
    left.extend(f"left behind: spark staging {entity.partition_key}/{entity.row_key}"
                for entity in staging.tables.query(staging.table)
                if entity.partition_key not in (f"s~{CONSUMER}", registry_key(READER),
                                                RESULTS))
    return left
