"""The ``bus`` data source for Spark 4 (the Python Data Source API): the pyspark side.

    bus.spark.register(spark)
    df.write.format("bus").option("message_type", "orders.contracts:PlaceOrder") ...
    spark.read.format("bus").option("endpoint", "analytics").option("run_key", "day-1") ...
    spark.readStream.format("bus").option("endpoint", "analytics").option("consumer", "c1") ...

The classes here only adapt Spark's calls; the work is in ``writer``, ``reader`` and ``stream``.
Options: docs/spark.md. This module imports pyspark; ``bus.integrations.spark`` does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import Row, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from bus.integrations.spark.batch import BatchRead
from bus.integrations.spark.columns import Selection, every_column, schema_ddl, select
from bus.integrations.spark.options import (
    OptionError,
    ReadOptions,
    check_message_class,
    read_options,
    resolve_contract,
    write_options,
)
from bus.integrations.spark.reader import Drainer, staged_rows
from bus.integrations.spark.staging import Staging
from bus.integrations.spark.stream import DEFAULT, StreamConsumer, split
from bus.integrations.spark.writer import JobWriter, PartReport, check_columns
from bus.messages import Message


def register(spark: SparkSession, contracts: Sequence[type[Message]] = ()) -> None:
    """Make ``format("bus")`` available in ``spark`` (once per session). ``contracts``: classes
    the option ``message_type`` may name by their message type (``"PlaceOrder"``) - those
    defined in a notebook among them: they travel to the executors with the data source,
    pickled by value, where their module cannot be imported."""
    registered = {c.message_type: check_message_class(c, repr(c)) for c in contracts}
    spark.dataSource.register(type("BusDataSource", (BusDataSource,), {"contracts": registered}))


class BusDataSource(DataSource):
    """``format("bus")``: write rows as messages, read an endpoint's messages as rows."""

    contracts: dict[str, type[Message]] = {}

    @classmethod
    def name(cls) -> str:
        return "bus"

    def schema(self) -> str:
        message_type = self.options.get("message_type")
        if not message_type:
            return schema_ddl(None)
        return schema_ddl(resolve_contract(self.contracts.get(message_type, message_type)))

    def writer(self, schema: StructType, overwrite: bool) -> BusWriter:
        if overwrite:
            raise OptionError("the bus data source appends messages: use mode('append')")
        return BusWriter(self._job(schema))

    def streamWriter(self, schema: StructType,  # noqa: N802 (Spark's name)
                     overwrite: bool) -> BusStreamWriter:
        if overwrite:
            raise OptionError("the bus data source appends messages: use outputMode('append')")
        return BusStreamWriter(self._job(schema))

    def _job(self, schema: StructType) -> JobWriter:
        """A write job for rows of ``schema``, its options checked and its tables made (on
        the driver, before any task runs)."""
        options = write_options(self.options, self.contracts)
        check_columns(options.contract(), schema.fieldNames(), options.key_columns)
        job = JobWriter(options)
        job.prepare()
        return job

    def reader(self, schema: StructType) -> BusReader:
        return BusReader(_with_schema(read_options(self.options, streaming=False,
                                                   contracts=self.contracts), schema))

    def streamReader(self, schema: StructType) -> BusStreamReader:  # noqa: N802 (Spark's name)
        return _stream_reader(_with_schema(read_options(self.options, streaming=True,
                                                        contracts=self.contracts), schema))


def _with_schema(options: ReadOptions, schema: StructType) -> ReadOptions:
    """``options`` with the columns of a schema the user gave (``.schema(...)``); Spark passes
    the data source's own schema when the user gave none."""
    wanted = columns_of(schema)
    if wanted == every_column(options.contract()):
        return options
    return replace(options, columns=select(options.contract(), wanted))


def columns_of(schema: StructType) -> Selection:
    """A Spark schema's columns as (name, ``simpleString()``)."""
    return tuple((f.name, f.dataType.simpleString()) for f in schema.fields)


# -- writing -------------------------------------------------------------------------------------
@dataclass
class BusCommitMessage(WriterCommitMessage):
    report: PartReport


def _publish(job: JobWriter, iterator: Iterator[Row]) -> BusCommitMessage:
    """A task's partition sent (``JobWriter.publish``), its report as the commit message."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition_id = context.partitionId() if context is not None else 0
    rows = (row.asDict(recursive=True) for row in iterator)
    return BusCommitMessage(job.publish(partition_id, rows))


class BusWriter(DataSourceWriter):
    """Tasks send their partition (``write``); the driver adds up their reports (``commit``)."""

    def __init__(self, job: JobWriter) -> None:
        self.job = job
        self.started = time.time()

    def write(self, iterator: Iterator[Row]) -> BusCommitMessage:
        return _publish(self.job, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.job.commit([m.report if isinstance(m, BusCommitMessage) else None
                         for m in messages], self.started)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.job.abort()


class BusStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("bus")``: each micro-batch as a write job of its own. A batch Spark
    runs again after a failure sends its rows under the same ids: nothing twice."""

    def __init__(self, job: JobWriter) -> None:
        self.job = job

    def write(self, iterator: Iterator[Row]) -> BusCommitMessage:
        return _publish(self.job, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self.job.commit([m.report if isinstance(m, BusCommitMessage) else None
                         for m in messages], batch=batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self.job.abort()


# -- reading -------------------------------------------------------------------------------------
class _Batch(InputPartition):
    """Staged batches one task reads (their staging partitions, in order)."""

    def __init__(self, keys: Sequence[str]) -> None:
        super().__init__(list(keys))
        self.keys = list(keys)


def _drainer(options: ReadOptions) -> tuple[Drainer, Staging]:
    bus = options.connection.bus()
    staging = Staging(bus.storage, options.connection.prefix)
    drainer = Drainer(bus, staging, options.endpoint, contract=options.contract(),
                      lease_seconds=options.lease_seconds)
    return drainer, staging


class BusReader(DataSourceReader):
    """A batch read: drained and staged once per run key (on the driver, while Spark plans),
    then only read - a re-run with the same run key reads the same messages. They are settled
    by ``bus.spark.commit_read`` once the results are stored (``batch``)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        assert self.options.run_key is not None
        drainer, staging = _drainer(self.options)
        drainer.prepare(self.options.subscribe)
        keys = BatchRead(drainer, staging).read(self.options.run_key, self.options.max_messages,
                                                self.options.partitions)
        return [_Batch(share) for share in split(keys, self.options.partitions)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        yield from _read(self.options, partition)


def _read(options: ReadOptions, partition: InputPartition) -> list[tuple[Any, ...]]:
    assert isinstance(partition, _Batch)
    contract: type[Message] | None = options.contract()
    staging = Staging(options.connection.storage(), options.connection.prefix)
    return [row for key in partition.keys
            for row in staged_rows(staging, key, contract, options.columns)]


class BusStreamReader(DataSourceStreamReader):
    """A streaming read; lives on the driver across micro-batches (see ``stream``).

    ``latestOffset`` takes Spark 4.2's ``(start, limit)`` and Spark 4.0/4.1's nothing; with
    Spark 4.2+ the reader is a ``BusAvailableNowReader`` (``Trigger.AvailableNow``)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._consumer: StreamConsumer | None = None
        self._serving: AbstractContextManager[None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark ships the reader to the executors for ``read``: without the storage clients.
        return {"options": self.options, "_consumer": None, "_serving": None}

    @property
    def consumer(self) -> StreamConsumer:
        if self._consumer is None:
            assert self.options.consumer is not None
            drainer, staging = _drainer(self.options)
            drainer.prepare(self.options.subscribe)
            self._consumer = StreamConsumer(
                drainer, staging, self.options.consumer,
                max_rows=self.options.max_rows_per_trigger, partitions=self.options.partitions,
                poll_seconds=self.options.poll_seconds)
            heartbeat = drainer.bus.parts.heartbeat("spark")  # while the query runs
            if heartbeat is not None:
                self._serving = heartbeat.serving(self.options.endpoint)
                self._serving.__enter__()
        return self._consumer

    def stop(self) -> None:
        """The query stopped: this process no longer serves the endpoint."""
        serving, self._serving = self._serving, None
        if serving is not None:
            serving.__exit__(None, None, None)

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 (Spark's name)
        return self.consumer.initial_offset()

    def latestOffset(self, start: dict[str, Any] | None = None,  # noqa: N802 (Spark's name)
                     limit: Any = None) -> dict[str, int]:
        # Spark 4.2+ passes (start, limit), 4.0 and 4.1 pass nothing (DEFAULT: our own limit).
        return self.consumer.latest_offset(start, DEFAULT if limit is None else _rows(limit))

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 (Spark 4.2+'s name)
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        rows = self.options.max_rows_per_trigger
        return ReadAllAvailable() if rows is None else ReadMaxRows(rows)

    def reportLatestOffset(self) -> None:  # noqa: N802 (Spark 4.2+'s name)
        return None  # a queue has no offsets ahead of what is staged

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return [_Batch(keys) for keys in self.consumer.splits(start, end)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        yield from _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self.consumer.commit(end)


def _rows(limit: Any) -> int | None:
    """Spark's read limit as a row count; None for all that is available (any other kind)."""
    rows = getattr(limit, "max_rows", None)
    return int(rows) if rows is not None else None


try:  # Spark 4.2+: Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # Spark 4.0, 4.1: AvailableNow runs as one batch (Trigger.Once)
    _stream_reader: type[BusStreamReader] = BusStreamReader
else:
    class BusAvailableNowReader(BusStreamReader, SupportsTriggerAvailableNow):
        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 (Spark's name)
            self.consumer.prepare_available_now()

    _stream_reader = BusAvailableNowReader
