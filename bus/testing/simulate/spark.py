"""The Spark integration's side in the simulation: a write job and a streaming read, run by
the real ``JobWriter``, ``Drainer`` and ``StreamConsumer`` over the simulated store.

Spark itself does not run here; what it does around those classes does, in the order the
integration's own modules describe (``bus.integrations.spark.stream``, ``compat``, ``source``,
which call the same methods; ``tests/spark`` runs them under a real local Spark):

* a write job sends every partition from a task; a task may fail part-way and run again, or
  run twice at once (a speculative copy, interleaved with the first), and Spark keeps one
  attempt's report per partition, which the driver adds up. A job that fails is run again
  with the same key column, a fresh job id; the driver may die anywhere (the actor crashes
  and starts over: a re-run);
* a streaming query asks the source for the latest offset, writes the planned range to its
  offset log, reads the batches into its sink, writes its commit log, and only then tells the
  source to commit (Spark calls ``commit`` when it plans the next batch). After a crash it runs
  the batch of its offset log again, then goes on from its commit log. The sink keeps what
  each micro-batch read, by batch: a replayed batch must read the same rows.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bus.bus import Bus
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
    """Spark's checkpoint of the streaming query: it survives the driver (the actor)."""

    committed: dict[str, int] | None = None
    planned: tuple[dict[str, int], dict[str, int]] | None = None
    sink: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


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
    crash or a failed batch."""
    def run() -> None:
        staging = Staging(bus.storage, bus.names.prefix, sleep=world.sleep,
                          random=world.rng.random)
        drainer = Drainer(bus, staging, READER, lease_seconds=10.0, parallelism=1)
        while True:
            try:
                consumer = StreamConsumer(drainer, staging, CONSUMER,
                                          batch_size=world.rng.randint(1, 4), poll_seconds=0.5,
                                          clock=world.now, sleep=world.sleep)
                _query(world, consumer, staging, checkpoint, counts)
            except StorageError:
                world.sleep(1.0)  # the query failed; started again from its checkpoint

    return run


def _query(world: World, consumer: StreamConsumer, staging: Staging, checkpoint: Checkpoint,
           counts: Counter[str]) -> None:
    if checkpoint.planned is not None:  # the offset log holds a batch not committed: again
        counts["spark_batches_replayed"] += 1
        _batch(consumer, staging, checkpoint, *checkpoint.planned)
    start = checkpoint.committed or consumer.initial_offset()
    while True:
        end = consumer.latest_offset(start)
        if end == start:
            world.sleep(0.5)
            continue
        checkpoint.planned = (start, end)
        counts["spark_batches"] += 1
        _batch(consumer, staging, checkpoint, start, end)
        start = end


def _batch(consumer: StreamConsumer, staging: Staging, checkpoint: Checkpoint,
           start: dict[str, int], end: dict[str, int]) -> None:
    for key in consumer.batch_keys(start, end):
        rows = staged_rows(staging, key, None)
        if key in checkpoint.sink and checkpoint.sink[key] != rows:
            checkpoint.violations.append(f"spark: micro-batch {key} read other rows when "
                                         "replayed")
        checkpoint.sink[key] = rows
    checkpoint.committed, checkpoint.planned = end, None  # the commit log
    consumer.commit(end)  # Spark tells the source when it plans the next batch


def subscribe_reader(bus: Bus, event: type[Message]) -> None:
    """Make ``READER`` a subscriber of ``event``'s topic (before the run starts)."""
    subscribe(bus, READER, [topic_of(event)])  # type: ignore[arg-type]


def read_roots(checkpoint: Checkpoint) -> Counter[int]:
    """How often each root's event reached the sink."""
    return Counter(int(json.loads(row[-1])["root"])
                   for rows in checkpoint.sink.values() for row in rows)


def unread(bus: Bus, checkpoint: Checkpoint) -> bool:
    """Whether the query has a batch planned, or the source a staged micro-batch the query
    has not committed yet (its messages are taken from the queue: the run is not over until
    the sink has them)."""
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
    then what it committed) and a sweep has removed what failed write jobs left: anything but
    the consumer's cursor and the write jobs' results is left behind."""
    staging = Staging(bus.storage, bus.names.prefix)
    if checkpoint.committed is not None:
        drainer = Drainer(bus, staging, READER, parallelism=1)
        StreamConsumer(drainer, staging, CONSUMER, batch_size=1).commit(checkpoint.committed)
    sweep(staging, older_than=0.0, now=now + 1.0)
    return [f"left behind: spark staging {entity.partition_key}/{entity.row_key}"
            for entity in staging.tables.query(staging.table)
            if entity.partition_key not in (f"s~{CONSUMER}", RESULTS)]
