"""Per-minute statistics of each endpoint, kept in its state table for the operators' tools.

The dashboard shows an endpoint's throughput and processing time over a period it chooses;
OpenTelemetry's metrics go to whatever backend the application chose, if any, so the bus keeps
its own small record too. Each process's receiver adds every signal's outcome and processing
time to the current minute's tally, in memory; at most every ``Settings.stats_flush_seconds``
(and when the minute changes) it writes the minute's tally so far as one row of the endpoint's
state table - an upsert of the process's own row, so processes never contend:

* partition ``~bus.stats.<yyyymmdd>`` (one per UTC day: a period's rows are read, and an old
  day's removed, by partition),
* row ``<minute start, epoch seconds, 10 digits>~<process id>``,
* ``processed``, ``failed`` (the handler raised or storage failed: the signal comes back),
  ``poisoned`` (poisoned or expired), ``other`` (duplicates, deferrals, scheduled copies put
  back, ...), ``total_ms`` and ``max_ms`` (processing time: decoding to outcome).

A write that fails is logged and retried at the next flush: statistics never fail a message.
The last flush of a process that stops, or goes idle, is at most ``stats_flush_seconds`` old.
Maintenance removes days older than ``Settings.stats_retention_days``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

from bus.naming import RESERVED_PARTITION_PREFIX
from bus.storage import Entity, StorageError, TableOp, Tables

log = logging.getLogger(__name__)

PARTITION = RESERVED_PARTITION_PREFIX + "stats."
_PROCESSED = frozenset({"processed"})
_FAILED = frozenset({"retry", "error"})
_POISONED = frozenset({"poisoned", "expired"})


@dataclass(frozen=True)
class Tally:
    """What one minute saw (of one process, or summed)."""

    processed: int = 0
    failed: int = 0
    poisoned: int = 0
    other: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0

    def add(self, outcome: str, milliseconds: float) -> Tally:
        kind = ("processed" if outcome in _PROCESSED else "failed" if outcome in _FAILED
                else "poisoned" if outcome in _POISONED else "other")
        return replace(self, **{kind: getattr(self, kind) + 1},
                       total_ms=self.total_ms + milliseconds,
                       max_ms=max(self.max_ms, milliseconds))

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.processed + other.processed, self.failed + other.failed,
                     self.poisoned + other.poisoned, self.other + other.other,
                     self.total_ms + other.total_ms, max(self.max_ms, other.max_ms))

    @property
    def signals(self) -> int:
        return self.processed + self.failed + self.poisoned + self.other


def day_partition(moment: float) -> str:
    return PARTITION + datetime.fromtimestamp(moment, tz=timezone.utc).strftime("%Y%m%d")


@dataclass
class StatsBook:
    """One endpoint's tally in this process, written to ``table`` now and then."""

    tables: Tables
    table: str
    flush_seconds: float
    clock: Callable[[], float]
    instance: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _minute: float | None = None
    _tally: Tally = field(default_factory=Tally)
    _flushed_at: float = 0.0
    _timer: threading.Timer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _writing: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: str, seconds: float) -> None:
        """Count one signal's outcome and processing time; write when it is time to, else
        make sure a write follows within ``flush_seconds`` (a timer: an endpoint that goes
        idle still has its last signals written)."""
        now = self.clock()
        minute = now - now % 60
        finished: tuple[float, Tally] | None = None
        with self._lock:
            if self._minute is not None and minute != self._minute:
                finished = (self._minute, self._tally)
                self._tally = Tally()
            self._minute = minute
            self._tally = self._tally.add(outcome, seconds * 1000)
            wait = self.flush_seconds - (now - self._flushed_at)
            current = (minute, self._tally) if wait <= 0 else None
            if current is not None:
                self._flushed_at = now
            elif self._timer is None:
                self._timer = threading.Timer(wait, self.flush)
                self._timer.daemon = True
                self._timer.start()
        for written in (finished, current):
            if written is not None:
                self._write(*written)

    def flush(self) -> None:
        """Write the current minute's tally now (the timer; a host stopping)."""
        with self._lock:
            current = (self._minute, self._tally) if self._minute is not None else None
            self._flushed_at = self.clock()
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()  # harmless from the timer's own thread
        if current is not None:
            self._write(*current)

    def _write(self, minute: float, tally: Tally) -> None:
        with self._writing:  # one write at a time: an older tally never overwrites a newer
            try:
                self.tables.replace(self.table, Entity(
                    day_partition(minute), f"{int(minute):010d}~{self.instance}", {
                        "processed": tally.processed, "failed": tally.failed,
                        "poisoned": tally.poisoned, "other": tally.other,
                        "total_ms": tally.total_ms, "max_ms": tally.max_ms}))
            except StorageError as exc:
                log.info("could not write the statistics of %s: %s", self.table, exc)


def read(tables: Tables, table: str, since: float, until: float) -> dict[float, Tally]:
    """Each minute's tally, summed over processes, for the minutes that start in
    [``since``, ``until``)."""
    minutes: dict[float, Tally] = {}
    day = datetime.fromtimestamp(since, tz=timezone.utc).date()
    last = datetime.fromtimestamp(until, tz=timezone.utc).date()
    while day <= last:
        for row in tables.query(table, PARTITION + day.strftime("%Y%m%d")):
            minute = float(row.row_key.split("~", 1)[0])
            if since <= minute < until:
                minutes[minute] = minutes.get(minute, Tally()) + _tally(row)
        day += timedelta(days=1)
    return dict(sorted(minutes.items()))


def forget(tables: Tables, table: str, now: float, retention_days: int) -> int:
    """Remove the rows of the two days just past the retention (maintenance visits every day
    many times); returns how many rows went."""
    removed = 0
    for age in (retention_days + 1, retention_days + 2):
        partition = day_partition(now - age * 86_400)
        keys = [row.row_key for row in tables.query(table, partition)]
        per = tables.limits.transaction_operations
        for start in range(0, len(keys), per):
            tables.transact(table, [TableOp("delete", Entity(partition, key))
                                    for key in keys[start:start + per]])
        removed += len(keys)
    return removed


def _tally(row: Entity) -> Tally:
    props = row.properties

    def number(name: str) -> float:
        value = props.get(name, 0)
        return float(value) if isinstance(value, (int, float)) else 0.0

    return Tally(int(number("processed")), int(number("failed")), int(number("poisoned")),
                 int(number("other")), number("total_ms"), number("max_ms"))
