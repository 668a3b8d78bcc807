"""The Spark 3.4+ API (Azure Synapse has no Python Data Source API): functions, same guarantees.

    result = bus.spark.publish(df, PlaceOrder, destination="orders", key_column="order_id",
                               connection_string=conn)
    df = bus.spark.receive(spark, "analytics", run_key="2024-06-01", connection_string=conn)

``publish`` sends each partition from its task (``mapInArrow``: Spark keeps one result per
partition, like a data source's commit messages) and adds up the tasks' reports on the
driver. ``receive`` drains and stages on the driver and returns the staged rows;
``commit_read`` settles them once the results are stored (``batch``). Only APIs Spark 3.4 has
(also on Spark Connect); pyspark and pyarrow are imported inside the functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from bus.integrations.spark.batch import BatchRead, sweep_reads
from bus.integrations.spark.columns import schema_ddl, select
from bus.integrations.spark.options import (
    SIGNERS,
    Connection,
    OptionError,
    ReadOptions,
    WriteOptions,
    check_message_class,
)
from bus.integrations.spark.options import key_columns as _key_columns
from bus.integrations.spark.reader import Drainer, staged_rows
from bus.integrations.spark.reader import subscribe as _subscribe
from bus.integrations.spark.staging import Staging
from bus.integrations.spark.writer import (
    JobWriter,
    PartReport,
    PublishResult,
    check_columns,
    prune_results,
    results,
    sweep,
)
from bus.messages import Message
from bus.settings import Settings

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_REPORT = ("partition_id int, rows long, published long, already_sent long, refused long, "
           "no_subscriber long, reasons array<string>")


def publish(df: DataFrame, message_type: type[Message] | str, *,
            destination: str | None = None, key_column: str | None = None,
            key_columns: Sequence[str] = (), run_key: str | None = None,
            connection_string: str | None = None, account_name: str | None = None,
            prefix: str = "", parallelism: int = 4, invalid_rows: str = "fail",
            settings: Settings | None = None, **credentials: Any) -> PublishResult:
    """Send each row of ``df`` as a ``message_type`` command to ``destination``, or publish it
    as an event, exactly once per message id, from the executors (see docs/spark.md for the
    ids and options; ``settings``: signing and encryption, docs/signing.md)."""
    if not isinstance(message_type, str):  # the class itself: it travels with the job
        message_type = check_message_class(message_type, repr(message_type))
    options = WriteOptions(_connection(connection_string, account_name, prefix, settings,
                                       credentials),
                           message_type, destination=destination,
                           key_columns=_key_columns(key_column, key_columns), run_key=run_key,
                           parallelism=parallelism, invalid_rows=invalid_rows)
    job = JobWriter(options)
    check_columns(options.contract(), df.columns, options.key_columns)
    job.prepare()
    started = time.time()
    try:
        reports = df.mapInArrow(_PublishTask(job), _REPORT).collect()
    except Exception:
        job.abort()
        raise
    return job.commit([report_of(r) for r in reports], started)


class _PublishTask:
    """The task function of ``publish`` (picklable: Spark ships it to the executors)."""

    def __init__(self, job: JobWriter) -> None:
        self.job = job

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
        from pyspark import TaskContext

        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        rows = (row for batch in batches for row in _pylist(batch))
        report = self.job.publish(partition_id, rows)
        yield pa.RecordBatch.from_pylist([report_values(report)],
                                         schema=pa.schema(report_fields()))


def _pylist(batch: Any) -> list[dict[str, Any]]:
    """An Arrow batch's rows as dicts, map columns as dicts too: Arrow gives a map as a list of
    key-value pairs (``maps_as_pydicts`` is too new for the pyarrow of older runtimes)."""
    rows: list[dict[str, Any]] = batch.to_pylist()
    mapped = [f for f in batch.schema if _has_map(f.type)]
    for row in rows:
        for f in mapped:
            row[f.name] = _dicts(row[f.name], f.type)
    return rows


def _has_map(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_map(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_has_map(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_map(kind.value_type)
    return False


def _dicts(value: Any, kind: Any) -> Any:
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_map(kind):
        return {k: _dicts(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {kind.field(i).name: _dicts(value[kind.field(i).name], kind.field(i).type)
                for i in range(kind.num_fields)}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_dicts(v, kind.value_type) for v in value]
    return value


def report_fields() -> list[tuple[str, Any]]:
    """A task's report as Arrow fields (``_REPORT``'s columns), for ``mapInArrow``."""
    import pyarrow as pa

    return [("partition_id", pa.int32()), ("rows", pa.int64()), ("published", pa.int64()),
            ("already_sent", pa.int64()), ("refused", pa.int64()),
            ("no_subscriber", pa.int64()), ("reasons", pa.list_(pa.string()))]


def report_values(report: PartReport) -> dict[str, Any]:
    """A task's report as the values of ``report_fields``."""
    return {"partition_id": report.partition_id, "rows": report.rows,
            "published": report.published, "already_sent": report.already_sent,
            "refused": report.refused, "no_subscriber": report.no_subscriber,
            "reasons": list(report.reasons)}


def report_of(row: Any) -> PartReport:
    """The report a task's row (collected on the driver) holds."""
    return PartReport(int(row["partition_id"]), int(row["rows"]), int(row["published"]),
                      int(row["already_sent"]), int(row["refused"]),
                      int(row["no_subscriber"]), tuple(row["reasons"] or ()))


def write_results(*, limit: int = 10, connection_string: str | None = None,
                  account_name: str | None = None, prefix: str = "",
                  **credentials: Any) -> list[PublishResult]:
    """The results of the latest write jobs (``df.write.format("bus")`` and ``publish``),
    newest first: rows, published, already sent, refused (with a few reasons), job id."""
    connection = _connection(connection_string, account_name, prefix, None, credentials)
    return results(Staging(connection.storage(), prefix), limit)


def receive(spark: SparkSession, endpoint: str, *, run_key: str,
            message_type: type[Message] | str | None = None, max_messages: int = 10_000,
            lease_seconds: float = 300.0, subscribe: Sequence[str] = (),
            connection_string: str | None = None, account_name: str | None = None,
            prefix: str = "", settings: Settings | None = None, schema: Any = None,
            **credentials: Any) -> DataFrame:
    """The messages pending at ``endpoint`` as a DataFrame, each taken exactly once. The
    first call with a ``run_key`` drains and stages; later calls with it return the same rows
    until ``commit_read``, which settles them once the results are stored: a run that fails
    before leaves them to the next read, whatever its run key (docs/spark.md). Columns:
    docs/spark.md. ``settings``: signing and encryption (docs/signing.md). ``schema`` (DDL
    text or a ``StructType``): the columns to return, by name, as ``.schema()`` of a read."""
    if message_type is not None and not isinstance(message_type, str):
        message_type = check_message_class(message_type, repr(message_type))
    options = ReadOptions(_connection(connection_string, account_name, prefix, settings,
                                      credentials),
                          endpoint,
                          message_class=message_type, max_messages=max_messages,
                          lease_seconds=lease_seconds, subscribe=tuple(subscribe),
                          run_key=run_key)
    options.check(streaming=False)
    bus = options.connection.bus()
    staging = Staging(bus.storage, prefix)
    contract = options.contract()
    struct = None if schema is None else _struct(schema)  # checked before anything is taken
    selection = None if struct is None else select(
        contract, [(f.name, f.dataType.simpleString()) for f in struct.fields])
    drainer = Drainer(bus, staging, endpoint, contract=contract, lease_seconds=lease_seconds)
    drainer.prepare(options.subscribe)
    keys = BatchRead(drainer, staging).read(run_key, max_messages)
    rows = [row for key in keys for row in staged_rows(staging, key, contract, selection)]
    return spark.createDataFrame(rows, schema=struct if struct is not None
                                 else schema_ddl(contract))


def _struct(schema: Any) -> Any:
    """A ``StructType`` from itself or DDL text (parsed by the session's Spark)."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = _parse_datatype_string(schema) if isinstance(schema, str) else schema
    if not isinstance(struct, StructType):
        raise OptionError(f"schema must be a StructType or DDL text of columns, not {schema!r}")
    return struct


def commit_read(endpoint: str, run_key: str, *, connection_string: str | None = None,
                account_name: str | None = None, prefix: str = "",
                settings: Settings | None = None, **credentials: Any) -> int:
    """The results of the batch read ``run_key`` (``receive`` or ``spark.read``) are stored:
    settle its messages - they are taken for good - and delete what it staged. Returns how
    many messages it read. Until it is called, the next read with another run key gives this
    one up and reads its messages again; after it, the run key cannot be read again (until
    ``forget_read``). Calling it again is harmless; call it again if it fails."""
    return _batch_read(endpoint, _connection(connection_string, account_name, prefix,
                                             settings, credentials)).commit(run_key)


def forget_read(endpoint: str, run_key: str, *, connection_string: str | None = None,
                account_name: str | None = None, prefix: str = "",
                settings: Settings | None = None, **credentials: Any) -> int:
    """Drop the batch read ``run_key``: one not committed is given up (its messages come back
    and the next read takes them), a committed one is only forgotten; then the run key can be
    read again, draining the queue anew. Returns how many messages it had staged."""
    return _batch_read(endpoint, _connection(connection_string, account_name, prefix,
                                             settings, credentials)).forget(run_key)


def _batch_read(endpoint: str, connection: Connection) -> BatchRead:
    bus = connection.bus()
    staging = Staging(bus.storage, connection.prefix)
    return BatchRead(Drainer(bus, staging, endpoint), staging)


def subscribe(endpoint: str, topics: Sequence[str] = (), *,
              connection_string: str | None = None, account_name: str | None = None,
              prefix: str = "", **credentials: Any) -> None:
    """Make ``endpoint`` a reader endpoint subscribed to ``topics`` (event type names): creates
    the bus's tables, the endpoint's queues and the staging table. Idempotent. Subscribe before
    the events are published: a subscriber gets the events published after it subscribed."""
    connection = _connection(connection_string, account_name, prefix, None, credentials)
    bus = connection.bus()
    _subscribe(bus, endpoint, topics)
    Staging(bus.storage, prefix).ensure()


def sweep_staging(older_than_seconds: float = 24 * 3600.0, *,
                  keep_results_seconds: float = 30 * 86400.0,
                  connection_string: str | None = None, account_name: str | None = None,
                  prefix: str = "", **credentials: Any) -> int:
    """Delete staging nobody will read again: write staging left by versions before tasks
    sent themselves (older than ``older_than_seconds``), a stream's committed batches, and
    rows of batch reads done or given up that a late write left; returns how many staging
    partitions. And the write results older than ``keep_results_seconds`` (``write_results``;
    a streaming sink adds one a micro-batch). A table scan: schedule it daily."""
    connection = _connection(connection_string, account_name, prefix, None, credentials)
    staging = Staging(connection.storage(), prefix)
    pruned = prune_results(staging, keep_results_seconds)
    if pruned:
        log.info("deleted %d write results older than %.0f s", pruned, keep_results_seconds)
    return sweep(staging, older_than_seconds) + sweep_reads(staging)


_CREDENTIALS = (*SIGNERS, "endpoints")


def _connection(connection_string: str | None, account_name: str | None, prefix: str,
                settings: Settings | None, credentials: dict[str, Any]) -> Connection:
    """The connection the keyword arguments describe (``credentials``: ``sas_token``,
    ``token``, ``platform_credential``, ``credential_provider``, ``endpoints``; see
    docs/spark.md, "Connection")."""
    unknown = sorted(set(credentials) - set(_CREDENTIALS))
    if unknown:
        raise OptionError(f"unknown argument(s) {', '.join(unknown)}; the credentials are "
                          f"{', '.join(_CREDENTIALS)}")
    return Connection(connection_string, account_name, prefix, settings, **credentials)
