"""Writing rows as messages: the tasks send, exactly once per message id; the driver reports.

A partition's task may run several times (a retry, a speculative copy, a recomputed stage) and
a job may be run again. So:

* every message id comes from the row itself: a hash of the message type, its destination (or
  topic), the optional ``run_key`` and the key column(s) the user names - never from the row's
  position, which Spark does not keep from one run to the next;
* each task sends its rows with ``Bus.send_once_many`` (``bus.protocol.send.marked``): tokens and
  their send marks 50 to a transaction, signals bundled, so a row costs about 0.05 storage
  requests; whoever sends a message id first sends it, every other attempt finds its mark;
* each task reports how many rows this job sent (any attempt of it: the marks name the job)
  and how many an earlier job had; Spark keeps one report per partition, which the driver
  adds up into the job's ``PublishResult``, logs, and stores in the results table
  (``write_results``).

A job that fails part-way has sent part of its rows: run it again with the same ids and only
the rest goes out.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any

from pydantic import ValidationError

from bus.bus import Bus
from bus.errors import BusError, PayloadError
from bus.ids import BUS_NAMESPACE, random_id
from bus.integrations.spark.options import OptionError, WriteOptions
from bus.integrations.spark.staging import StagedRow, Staging, each
from bus.messages import Command, Event, Message, topic_of
from bus.observability import Telemetry
from bus.observability.propagation import carrier
from bus.storage import Storage
from bus.storage.counting import counting_storage

log = logging.getLogger("bus.spark")

CHUNK = 500
"""Rows a task sends per ``send_once_many`` call."""
RESULTS = "w~results"
"""The staging partition holding each write job's result."""
_REASONS = 10  # reasons of refused rows kept per task


class RowError(BusError, ValueError):
    """A row cannot become a message; the message says which row and why."""


@dataclass(frozen=True)
class PartReport:
    """What one task attempt did with its partition: Spark keeps one of these per partition."""

    partition_id: int
    rows: int = 0
    published: int = 0
    already_sent: int = 0
    refused: int = 0
    no_subscriber: int = 0
    reasons: tuple[str, ...] = ()
    requests: int = 0


@dataclass(frozen=True)
class PublishResult:
    """The outcome of a write: ``published`` messages sent by this run, ``already_sent``
    ones an earlier run (or another row with the same key) had sent, ``refused`` rows that
    could not become a message (with ``invalid_rows='report'``; ``reasons`` has a few),
    ``no_subscriber`` events nobody subscribed to; ``requests`` to Azure Storage the tasks
    made (each port call: a transaction or a bundled send is one), their attempts that Spark
    kept the reports of."""

    rows: int
    published: int
    already_sent: int
    seconds: float
    refused: int = 0
    no_subscriber: int = 0
    reasons: tuple[str, ...] = ()
    job: str = ""
    message_type: str = ""
    target: str = ""
    finished_at: float = 0.0
    requests: int = 0

    @property
    def requests_per_row(self) -> float:
        """What a row cost in storage requests (0 for a job without rows)."""
        return round(self.requests / self.rows, 3) if self.rows else 0.0


def check_columns(contract: type[Message], columns: Sequence[str],
                  key_columns: Sequence[str]) -> None:
    """Fail early (on the driver) when a required field or a key column has no column."""
    missing = [name for name, f in contract.model_fields.items()
               if f.is_required() and name not in columns]
    if missing:
        raise OptionError(f"{contract.message_type} needs the column(s) {', '.join(missing)}; "
                          f"the DataFrame has {', '.join(columns) or 'no columns'}")
    absent = [name for name in key_columns if name not in columns]
    if absent:
        raise OptionError(f"key column(s) {', '.join(map(repr, absent))} not in the DataFrame")


class MessageMapper:
    """Turns a row (column name -> value) into a message and its message id."""

    def __init__(self, contract: type[Message], *, key_columns: Sequence[str],
                 run_key: str | None, target: str) -> None:
        self.contract = contract
        self.key_columns = tuple(key_columns)
        self._scope = f"spark/{contract.message_type}/{target}/{run_key or ''}"
        self._fields = list(contract.model_fields)

    def where(self, row: Mapping[str, Any], position: int, partition_id: int) -> str:
        """How an error names a row: by its key columns' values (a repartitioned job's
        positions move), and where the task met it."""
        keys = ", ".join(f"{name}={row.get(name)!r}" for name in self.key_columns)
        at = f"row {position} of partition {partition_id}"
        return f"the row {keys} ({at})" if keys else at

    def message_id(self, row: Mapping[str, Any], where: str) -> str:
        """The row's message id: a UUID5 of the message type, target, run key and key."""
        values = [row.get(name) for name in self.key_columns]
        if any(value is None for value in values):
            nulls = [n for n, v in zip(self.key_columns, values, strict=True) if v is None]
            raise RowError(f"{where}: key column(s) {', '.join(map(repr, nulls))} null")
        key = (str(values[0]) if len(values) == 1
               else json.dumps(values, default=str, separators=(",", ":")))
        return uuid.uuid5(BUS_NAMESPACE, f"{self._scope}/{key}").hex

    def message(self, row: Mapping[str, Any], where: str) -> Message:
        # Extra columns are ignored; a null for a field with a default means "use the default".
        data = {name: row[name] for name in self._fields
                if name in row and not (row[name] is None
                                        and not self.contract.model_fields[name].is_required())}
        try:
            return self.contract.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"column {'.'.join(map(str, e['loc']))}: {e['msg']}"
                                 for e in exc.errors())
            raise RowError(f"{where} is not a valid {self.contract.message_type}: "
                           f"{problems}") from exc


@dataclass
class _Tally:
    rows: int = 0
    published: int = 0
    already_sent: int = 0
    refused: int = 0
    no_subscriber: int = 0
    reasons: list[str] = field(default_factory=list)

    def refuse(self, error: RowError) -> None:
        self.refused += 1
        if len(self.reasons) < _REASONS:
            self.reasons.append(str(error))

    def count(self, sent: Sequence[bool | None]) -> None:
        self.published += sum(s is True for s in sent)
        self.already_sent += sum(s is False for s in sent)
        self.no_subscriber += sum(s is None for s in sent)


class JobWriter:
    """One write job. Picklable: ``publish`` runs in the tasks, ``commit`` on the driver.
    ``job`` names the job in its result; fresh for every run by default."""

    def __init__(self, options: WriteOptions, job: str | None = None, *,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time,
                 new_id: Callable[[], str] = random_id,
                 random: Callable[[], float] | None = None) -> None:
        options.check()
        self.options = options
        self.job = job or new_id()[:16]
        # The simulation's seams (virtual time, seeded ids); module-level defaults, so the
        # writer still pickles to the executors.
        self._sleep = sleep
        self._clock = clock
        self._new_id = new_id
        self._random = random
        self.trace = carrier()
        """The driver's trace context where the job was made: the tasks' sends join it."""

    def staging(self, storage: Storage) -> Staging:
        return Staging(storage, self.options.connection.prefix, sleep=self._sleep,
                       random=self._random)

    def prepare(self) -> None:
        """On the driver, before the tasks: the bus's tables, containers and queues and the
        staging table (for the results) exist. Idempotent."""
        bus = self.options.connection.bus(self.options.routes())
        staging = self.staging(bus.storage)
        staging.retried(bus.provision)  # a transient error need not fail the job
        staging.ensure()

    @property
    def target(self) -> str:
        """The destination endpoint, or the event's topic."""
        contract = self.options.contract()
        if self.options.destination is not None:
            return self.options.destination
        return topic_of(contract) if issubclass(contract, Event) else ""

    # -- in the tasks ---------------------------------------------------------------------------
    def publish(self, partition_id: int, rows: Iterable[Mapping[str, Any]]) -> PartReport:
        """Send one partition's rows, each once per message id; report what happened."""
        contract = self.options.contract()
        mapper = MessageMapper(contract, key_columns=self.options.key_columns,
                               run_key=self.options.run_key, target=self.target)
        connection = self.options.connection
        storage, requests = counting_storage(connection.storage())
        bus = connection.bus(self.options.routes(), storage=storage)
        tally = _Tally()
        chunks = _chunks(self._messages(mapper, partition_id, rows, tally), CHUNK)
        parallelism = self.options.parallelism
        with Telemetry.continued(self.trace):
            while wave := list(islice(chunks, parallelism)):  # memory: a wave at a time
                for sent in each(parallelism, lambda chunk: self._send(bus, chunk, tally),
                                 wave):
                    assert isinstance(sent, list)
                    tally.count(sent)
        return PartReport(partition_id, tally.rows, tally.published, tally.already_sent,
                          tally.refused, tally.no_subscriber, tuple(tally.reasons),
                          requests.total())

    def _messages(self, mapper: MessageMapper, partition_id: int,
                  rows: Iterable[Mapping[str, Any]], tally: _Tally,
                  ) -> Iterator[tuple[Command | Event, str, str]]:
        """Each row's message, message id and how errors name the row."""
        for position, row in enumerate(rows):
            tally.rows += 1
            where = mapper.where(row, position, partition_id)
            try:
                message = mapper.message(row, where)
                message_id = mapper.message_id(row, where)
            except RowError as exc:
                self._refuse(exc, tally)
                continue
            assert isinstance(message, (Command, Event))
            yield message, message_id, where

    def _send(self, bus: Bus, chunk: list[tuple[Command | Event, str, str]],
              tally: _Tally) -> list[bool | None]:
        """``send_once_many`` for a chunk; when a message of it is refused before anything
        is sent (a payload over ``Settings.max_payload_bytes``), the chunk's messages one at a
        time, so that the refused row is named - and, reporting, the others go."""
        def send(items: list[tuple[Command | Event, str, str]]) -> list[bool | None]:
            return bus.send_once_many([(m, i) for m, i, _ in items],
                                      to=self.options.destination, origin=self.job)

        try:
            return send(chunk)
        except PayloadError:
            pass
        sent: list[bool | None] = []
        for item in chunk:
            try:
                sent += send([item])
            except PayloadError as exc:
                self._refuse(RowError(f"{item[2]}: {exc}"), tally)
        return sent

    def _refuse(self, error: RowError, tally: _Tally) -> None:
        if self.options.invalid_rows == "fail":
            raise error
        tally.refuse(error)

    # -- on the driver --------------------------------------------------------------------------
    def commit(self, reports: Sequence[PartReport | None], started: float | None = None,
               batch: int | None = None) -> PublishResult:
        """Add up the tasks' reports (one per partition), log and store the result (a
        streaming sink's: one per micro-batch, ``batch``)."""
        if any(report is None for report in reports):
            raise BusError("a partition has no report: its task did not finish")
        done = [r for r in reports if r is not None]
        result = PublishResult(
            rows=sum(r.rows for r in done), published=sum(r.published for r in done),
            already_sent=sum(r.already_sent for r in done),
            seconds=round(self._clock() - started, 3) if started is not None else 0.0,
            refused=sum(r.refused for r in done),
            no_subscriber=sum(r.no_subscriber for r in done),
            reasons=tuple(reason for r in done for reason in r.reasons)[:_REASONS],
            job=self.job if batch is None else f"{self.job}-{batch}",
            message_type=self.options.contract().message_type,
            target=self.target, finished_at=self._clock(),
            requests=sum(r.requests for r in done))
        log.info("job %s: %d rows, %d messages published, %d already sent, %d refused; %d "
                 "storage requests", self.job, result.rows, result.published,
                 result.already_sent, result.refused, result.requests)
        self._store(result)
        return result

    def abort(self) -> None:
        """Spark gave up on the job: what its tasks sent stays sent (a re-run skips it)."""
        log.warning("job %s failed; rows its tasks sent stay sent, a re-run with the same ids "
                    "sends the rest", self.job)

    def _store(self, result: PublishResult) -> None:
        """The result in the results table (best effort: the job itself succeeded)."""
        staging = self.staging(self.options.connection.storage())
        newest_first = f"{_newest_first(result.finished_at)}~{result.job}"
        try:
            staging.put(RESULTS, [StagedRow(newest_first, texts={
                "result": json.dumps(asdict(result))})])
        except Exception:
            log.exception("job %s: its result could not be stored", self.job)


def _newest_first(moment: float) -> str:
    """A results row key's first part: later moments sort first."""
    return f"{10**13 - int(moment * 1000):014d}"


def results(staging: Staging, limit: int = 10) -> list[PublishResult]:
    """The latest write jobs' results, newest first (their first rows: one small read)."""
    found: list[PublishResult] = []
    for _, values in staging.rows(RESULTS, limit=limit):
        data = json.loads(str(values["result"]))
        data["reasons"] = tuple(data.get("reasons", ()))
        found.append(PublishResult(**data))
    return found


def prune_results(staging: Staging, keep_seconds: float, now: float | None = None) -> int:
    """Delete the write results older than ``keep_seconds`` (a range read: they are the
    results partition's last rows); returns how many."""
    cutoff = (time.time() if now is None else now) - keep_seconds
    return staging.delete_after(RESULTS, f"{_newest_first(cutoff)}~")


def sweep(staging: Staging, older_than: float, now: float | None = None) -> int:
    """Delete staging left behind: write staging of jobs from before tasks sent themselves
    (nothing in them newer than ``older_than`` seconds; a table scan: run it now and then),
    and a streaming consumer's batches at or below its committed one (a delayed write can land
    after the consumer deleted a batch). Keeps the write results (``prune_results`` ages
    them). Returns how many staging partitions it deleted."""
    cutoff = (time.time() if now is None else now) - older_than
    newest: dict[str, float] = {}
    committed: dict[str, int] = {}
    batches: list[tuple[str, str, int]] = []
    for entity in staging.retried(staging.tables.query, staging.table):
        key = entity.partition_key
        if key.startswith("w~") and key != RESULTS:
            at = entity.properties.get("at")
            stamp = float(at) if isinstance(at, (int, float)) else 0.0
            newest[key] = max(newest.get(key, 0.0), stamp)
        elif key.startswith("s~") and key.count("~") == 1:
            committed[key] = int(str(entity.properties.get("committed") or 0))
        elif key.startswith("s~") and key.rpartition("~")[2].isdigit():
            batches.append((key, key.rpartition("~")[0], int(key.rpartition("~")[2])))
    old = sorted(key for key, stamp in newest.items() if stamp < cutoff)
    old.extend(sorted({key for key, consumer, batch in batches
                       if batch <= committed.get(consumer, 0)}))
    for key in old:
        staging.delete_partition(key)
    return len(old)


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk
