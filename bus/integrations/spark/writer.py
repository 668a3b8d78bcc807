"""Writing rows as messages: tasks stage, the driver publishes once Spark has committed.

A partition's task may run several times (retry, speculation, stage recompute) and a job may be
re-run. So:

* every message id is deterministic: from the key column (``key_column``), or from the run key,
  the partition number and the row's position in it (``run_key``);
* each task attempt stages its rows under a partition key of its own and reports it; Spark keeps
  exactly one report per partition (the commit messages, or the results of a collect);
* the driver publishes the reported attempts' rows with ``Bus.send_once`` / ``publish_once``
  (the send ledger: once per message id, whoever calls and however often), then deletes the
  staging of every attempt of the job, winners and losers alike.

A job that fails, or dies while publishing, can be re-run with the same ids: what was sent is
not sent again.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from bus.bus import Bus
from bus.errors import BusError
from bus.ids import BUS_NAMESPACE, random_id
from bus.integrations.spark.options import OptionError, WriteOptions, message_id_ok
from bus.integrations.spark.staging import StagedRow, Staging, each
from bus.messages import Command, Event, Message
from bus.storage import Storage

log = logging.getLogger("bus.spark")

_STAGE_CHUNK = 100  # rows staged per call (staging splits them into transactions)


class RowError(BusError, ValueError):
    """A row cannot become a message; the message says which row and why."""


class StagingError(BusError, RuntimeError):
    """A committed task's staging is not what it reported (should not happen: a bug or a
    staging table changed by hand)."""


@dataclass(frozen=True)
class StagedPart:
    """What one task attempt staged: Spark keeps exactly one of these per partition."""

    partition_id: int
    staging: str  # the staging partition key
    rows: int


@dataclass(frozen=True)
class PublishResult:
    """The outcome of a write: ``published`` new messages, ``already_sent`` ones whose id an
    earlier run (or an earlier row with the same key) had sent."""

    rows: int
    published: int
    already_sent: int
    seconds: float


def check_columns(contract: type[Message], columns: Sequence[str],
                  key_column: str | None) -> None:
    """Fail early (on the driver) when a required field has no column."""
    missing = [name for name, f in contract.model_fields.items()
               if f.is_required() and name not in columns]
    if missing:
        raise OptionError(f"{contract.message_type} needs the column(s) {', '.join(missing)}; "
                          f"the DataFrame has {', '.join(columns) or 'no columns'}")
    if key_column is not None and key_column not in columns:
        raise OptionError(f"key_column {key_column!r} is not a column of the DataFrame")


class MessageMapper:
    """Turns a row (column name -> value) into a message and its deterministic id."""

    def __init__(self, contract: type[Message], *, key_column: str | None,
                 run_key: str | None) -> None:
        self.contract = contract
        self.key_column = key_column
        self.run_key = run_key
        self._fields = list(contract.model_fields)

    def message_id(self, row: Mapping[str, Any], partition_id: int, position: int) -> str:
        if self.key_column is None:
            assert self.run_key is not None
            return f"{self.run_key}-{partition_id}-{position}"
        value = row.get(self.key_column)
        if value is None:
            raise RowError(f"row {position} of partition {partition_id}: key column "
                           f"{self.key_column!r} is null")
        key = str(value)
        if self.run_key is None and message_id_ok(key):
            return key  # readable, and what other producers keyed by the same value use
        scope = self.run_key if self.run_key is not None else "key"
        return uuid.uuid5(BUS_NAMESPACE, f"spark/{scope}/{key}").hex

    def message(self, row: Mapping[str, Any], partition_id: int, position: int) -> Message:
        # Extra columns are ignored; a null for a field with a default means "use the default".
        data = {name: row[name] for name in self._fields
                if name in row and not (row[name] is None
                                        and not self.contract.model_fields[name].is_required())}
        try:
            return self.contract.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"column {'.'.join(map(str, e['loc']))}: {e['msg']}"
                                 for e in exc.errors())
            raise RowError(f"row {position} of partition {partition_id} is not a valid "
                           f"{self.contract.message_type}: {problems}") from exc


class JobWriter:
    """One write job. Picklable: ``stage`` runs in the tasks, ``commit`` / ``abort`` on the
    driver. ``job`` names the job's staging; make it fresh for every run."""

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

    def staging(self, storage: Storage) -> Staging:
        return Staging(storage, self.options.connection.prefix, sleep=self._sleep,
                       random=self._random)

    def prepare(self) -> None:
        """On the driver, before the tasks: the staging table and the bus's own tables and
        containers (the send ledger, the tokens) exist. Idempotent."""
        bus = self.options.connection.bus(self.options.routes())
        staging = self.staging(bus.storage)
        staging.retried(bus.provision)  # a transient error need not fail the job
        staging.ensure()

    @property
    def registry(self) -> str:
        return f"w~{self.job}"

    # -- in the tasks ---------------------------------------------------------------------------
    def stage(self, partition_id: int, rows: Iterable[Mapping[str, Any]],
              task_attempt: int = 0) -> StagedPart:
        """Stage one partition's rows under a key of this attempt's own; report it."""
        mapper = MessageMapper(self.options.contract(), key_column=self.options.key_column,
                               run_key=self.options.run_key)
        staging = self.staging(self.options.connection.storage())
        attempt = self._new_id()[:12]
        key = f"w~{self.job}~{partition_id:05d}~{attempt}"
        # Registered before staging anything, so the driver can clean up a losing attempt.
        staging.upsert(self.registry, StagedRow(f"{partition_id:05d}~{attempt}", {
            "staging": key, "task_attempt": task_attempt, "at": self._clock()}))
        chunk: list[StagedRow] = []
        count = 0
        for position, row in enumerate(rows):
            message = mapper.message(row, partition_id, position)
            chunk.append(StagedRow(f"{position:09d}", {
                "message_id": mapper.message_id(row, partition_id, position),
                "at": self._clock()}, {"message": message.model_dump_json()}))
            count += 1
            if len(chunk) == _STAGE_CHUNK:
                staging.put(key, chunk)
                chunk = []
        staging.put(key, chunk)
        return StagedPart(partition_id, key, count)

    # -- on the driver --------------------------------------------------------------------------
    def commit(self, parts: Sequence[StagedPart | None]) -> PublishResult:
        """Publish the rows of the reported attempts (one per partition), then remove the
        job's staging. Raises when a send keeps failing: the job may then be re-run with the
        same ids, which sends only what is missing."""
        bus = self.options.connection.bus(self.options.routes())
        staging = self.staging(bus.storage)
        try:
            result = self._publish(bus, staging, parts)
        except Exception:  # not a dying process (BaseException): it cleans nothing up
            # What was sent stays sent (a re-run skips it); the staging is of no further use.
            with contextlib.suppress(Exception):
                self.cleanup(staging)
            raise
        self.cleanup(staging)
        log.info("job %s: %d rows, %d messages published, %d already sent, %.1f s",
                 self.job, result.rows, result.published, result.already_sent, result.seconds)
        return result

    def _publish(self, bus: Bus, staging: Staging,
                 parts: Sequence[StagedPart | None]) -> PublishResult:
        started = time.monotonic()
        if any(part is None for part in parts):
            raise StagingError("a partition has no commit message: its task did not finish")
        ordered = sorted((p for p in parts if p is not None), key=lambda p: p.partition_id)
        contract = self.options.contract()
        total = sum(part.rows for part in ordered)
        done = published = 0
        log.info("publishing %d rows of %d partitions (job %s)", total, len(ordered), self.job)
        for part in ordered:
            rows = staging.rows(part.staging)
            if len(rows) != part.rows:
                raise StagingError(f"partition {part.partition_id}: {len(rows)} rows staged "
                                   f"under {part.staging}, the task reported {part.rows}")
            items = [(str(values["message_id"]), str(values["message"])) for _, values in rows]
            for sent in each(self.options.parallelism,
                             lambda item: self._send(bus, contract, *item), items):
                published += bool(sent)
                done += 1
                if done % 1000 == 0:
                    log.info("published %d/%d rows", done, total)
        return PublishResult(total, published, total - published,
                             round(time.monotonic() - started, 3))

    def abort(self) -> None:
        """Spark gave up on the job: nothing was published; drop its staging."""
        storage = self.options.connection.storage()
        self.cleanup(self.staging(storage))

    def cleanup(self, staging: Staging) -> None:
        """Delete the staging of every attempt of the job, winners and losers, then the
        job's registry. An attempt still running (a speculative copy Spark has not killed yet)
        may leave rows behind; they are never published."""
        for _, values in staging.rows(self.registry):
            staging.delete_partition(str(values["staging"]))
        staging.delete_partition(self.registry)

    def _send(self, bus: Bus, contract: type[Message], message_id: str, body: str) -> bool:
        message = contract.model_validate_json(body)
        if isinstance(message, Command):
            return bus.send_once(message, message_id=message_id, to=self.options.destination)
        assert isinstance(message, Event)
        return bus.publish_once(message, message_id=message_id)


def sweep(staging: Staging, older_than: float, now: float | None = None) -> int:
    """Delete staging left behind: jobs whose driver died before publishing and attempts
    Spark killed too late, when nothing in them is newer than ``older_than`` seconds (a table
    scan: run it now and then, not while such a job may still be running), and a streaming
    consumer's batches at or below its committed one (a delayed write can land after the
    consumer deleted a batch). Returns how many staging partitions it deleted."""
    cutoff = (time.time() if now is None else now) - older_than
    newest: dict[str, float] = {}
    committed: dict[str, int] = {}
    batches: list[tuple[str, str, int]] = []
    for entity in staging.retried(staging.tables.query, staging.table):
        key = entity.partition_key
        if key.startswith("w~"):
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
