"""Per-minute statistics of each endpoint, kept in its state table for the operators' tools.

The dashboard shows an endpoint's throughput, processing and critical time and queue length over
a period it chooses; OpenTelemetry's metrics go to whatever backend the application chose, if
any, so the bus keeps its own small record too. Each process's receiver adds every signal's
outcome, processing time and message type - and, for a processed one, its **critical time**
(from when it was due, its send or its ``not_before``, to processed: what the
``eobus.message.end_to_end.duration`` metric records) - to the current minute's tally, in
memory; at most every ``Settings.stats_flush_seconds`` (and when the minute changes) it writes
the minute's tally so far as one row of the endpoint's state table - an upsert of the process's
own row, so processes never contend:

* partition ``~bus.stats.<yyyymmdd>`` (one per UTC day: a period's rows are read, and an old
  day's removed, by partition),
* row ``<minute start, epoch seconds, 10 digits>~<process id>``,
* ``processed``, ``failed`` (the handler raised or storage failed: the signal comes back),
  ``poisoned`` (poisoned or expired), ``other`` (duplicates, deferrals, scheduled copies put
  back, ...), ``total_ms`` and ``max_ms`` (processing time: decoding to outcome),
* ``time_hist`` and ``critical_hist``: how many signals fell in each bucket of processing time
  (``TIME_BUCKETS_MS``) and processed messages in each of critical time
  (``CRITICAL_BUCKETS_S``), as comma-separated counts, the last for anything above,
* ``types``: the same per message type, as JSON (at most ``MAX_TYPES`` types a row; the rest
  counted under ``OTHER_TYPES``).

Maintenance adds the queue's length as it finds it on each pass (``record_depth``, a row
``<minute>~depth`` of the same partition): one write per endpoint per pass.

The percentiles are read from the buckets (linear within a bucket, as Prometheus's
``histogram_quantile`` does): exact to the bucket, whatever the traffic, at a row's fixed size.
A write that fails is logged and retried at the next flush: statistics never fail a message.
The last flush of a process that stops, or goes idle, is at most ``stats_flush_seconds`` old.
Maintenance removes days older than ``Settings.stats_retention_days``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from bus.naming import RESERVED_PARTITION_PREFIX
from bus.storage import Entity, EntityValue, StorageError, TableOp, Tables

log = logging.getLogger(__name__)

PARTITION = RESERVED_PARTITION_PREFIX + "stats."
DEPTH = "depth"
"""The row key suffix of a minute's queue length (``record_depth``)."""
TIME_BUCKETS_MS = (5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
                   10000.0, 30000.0)
"""Upper bounds of the processing-time buckets (milliseconds); one more bucket above."""
CRITICAL_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
                      4 * 3600.0, 24 * 3600.0)
"""Upper bounds of the critical-time buckets (seconds); one more bucket above."""
MAX_COUNT = 10**9
"""More signals than this in one minute of one process is no row this bus wrote: read as 0."""
MAX_TYPES = 50
OTHER_TYPES = "~other"
_PROCESSED = frozenset({"processed"})
_FAILED = frozenset({"retry", "error"})
_POISONED = frozenset({"poisoned", "expired"})
Histogram = tuple[int, ...]


def _empty(bounds: Sequence[float]) -> Histogram:
    return (0,) * (len(bounds) + 1)


def _bucket(bounds: Sequence[float], value: float) -> int:
    return next((i for i, bound in enumerate(bounds) if value <= bound), len(bounds))


def _sum(a: Histogram, b: Histogram) -> Histogram:
    if len(a) != len(b):  # a row of another version's buckets: left out
        return a if sum(a) >= sum(b) else b
    return tuple(x + y for x, y in zip(a, b, strict=True))


def percentile(hist: Histogram, bounds: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0-1) of what ``hist`` counts, linear within its bucket; the last
    bucket's lower bound for one above every bound; None when it counts nothing."""
    total = sum(hist)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(hist):
        if count and seen + count >= rank:
            if i == len(bounds):
                return bounds[-1]
            low = bounds[i - 1] if i else 0.0
            return low + (bounds[i] - low) * max(0.0, rank - seen) / count
        seen += count
    return bounds[-1]


_NO_TIMES = _empty(TIME_BUCKETS_MS)
_NO_CRITICAL = _empty(CRITICAL_BUCKETS_S)


@dataclass(frozen=True)
class Tally:
    """What one minute saw (of one process, or summed), of one message type or all."""

    processed: int = 0
    failed: int = 0
    poisoned: int = 0
    other: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0
    time_hist: Histogram = _NO_TIMES
    critical_hist: Histogram = _NO_CRITICAL

    def add(self, outcome: str, milliseconds: float, critical: float | None = None) -> Tally:
        kind = ("processed" if outcome in _PROCESSED else "failed" if outcome in _FAILED
                else "poisoned" if outcome in _POISONED else "other")
        time_hist = list(self.time_hist)
        time_hist[_bucket(TIME_BUCKETS_MS, milliseconds)] += 1
        critical_hist = self.critical_hist
        if critical is not None:
            counts = list(critical_hist)
            counts[_bucket(CRITICAL_BUCKETS_S, critical)] += 1
            critical_hist = tuple(counts)
        return Tally(**{**self._counts(), kind: getattr(self, kind) + 1},
                     total_ms=self.total_ms + milliseconds,
                     max_ms=max(self.max_ms, milliseconds), time_hist=tuple(time_hist),
                     critical_hist=critical_hist)

    def _counts(self) -> dict[str, int]:
        return {"processed": self.processed, "failed": self.failed,
                "poisoned": self.poisoned, "other": self.other}

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.processed + other.processed, self.failed + other.failed,
                     self.poisoned + other.poisoned, self.other + other.other,
                     self.total_ms + other.total_ms, max(self.max_ms, other.max_ms),
                     _sum(self.time_hist, other.time_hist),
                     _sum(self.critical_hist, other.critical_hist))

    @property
    def signals(self) -> int:
        return self.processed + self.failed + self.poisoned + self.other

    def processing_ms(self, q: float) -> float | None:
        """The ``q`` quantile of processing time (ms), from the buckets."""
        return percentile(self.time_hist, TIME_BUCKETS_MS, q)

    def critical_seconds(self, q: float) -> float | None:
        """The ``q`` quantile of critical time (s) of the processed messages."""
        return percentile(self.critical_hist, CRITICAL_BUCKETS_S, q)

    def as_list(self) -> list[float | int | list[int]]:
        return [self.processed, self.failed, self.poisoned, self.other, self.total_ms,
                self.max_ms, list(self.time_hist), list(self.critical_hist)]

    @classmethod
    def from_list(cls, values: object) -> Tally | None:
        """The tally ``as_list`` wrote; None for anything else."""
        if not isinstance(values, list) or len(values) != 8:
            return None
        try:
            processed, failed, poisoned, other = (int(v) for v in values[:4])
            if not all(0 <= c <= MAX_COUNT for c in (processed, failed, poisoned, other)):
                return None
            return cls(processed, failed, poisoned, other, float(values[4]),
                       float(values[5]), _hist(values[6], TIME_BUCKETS_MS),
                       _hist(values[7], CRITICAL_BUCKETS_S))
        except (TypeError, ValueError, OverflowError):
            return None


def _hist(values: object, bounds: Sequence[float]) -> Histogram:
    if isinstance(values, str):
        values = values.split(",") if values else []
    if not isinstance(values, list) or len(values) != len(bounds) + 1:
        return _empty(bounds)
    try:
        counts = tuple(max(0, int(v)) for v in values)
    except (TypeError, ValueError, OverflowError):  # a row not of this bus's writing
        return _empty(bounds)
    return counts if all(c <= MAX_COUNT for c in counts) else _empty(bounds)


@dataclass(frozen=True)
class Minute:
    """One minute's tally, all types, and per message type."""

    tally: Tally = field(default_factory=Tally)
    types: Mapping[str, Tally] = field(default_factory=dict)
    depth: int | None = None
    """The queue's length maintenance found in it (the largest, if several)."""

    def __add__(self, other: Minute) -> Minute:
        types = dict(self.types)
        for name, tally in other.types.items():
            types[name] = types.get(name, Tally()) + tally
        depths = [d for d in (self.depth, other.depth) if d is not None]
        return Minute(self.tally + other.tally, types, max(depths) if depths else None)


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
    _tally: Minute = field(default_factory=Minute)
    _flushed_at: float = 0.0
    _timer: threading.Timer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _writing: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: str, seconds: float, message_type: str | None = None,
               critical: float | None = None) -> None:
        """Count one signal's outcome, processing time and type (and a processed message's
        critical time, seconds); write when it is time to, else make sure a write follows
        within ``flush_seconds`` (a timer: an endpoint that goes idle still has its last
        signals written)."""
        now = self.clock()
        minute = now - now % 60
        finished: tuple[float, Minute] | None = None
        with self._lock:
            if self._minute is not None and minute != self._minute:
                finished = (self._minute, self._tally)
                self._tally = Minute()
            self._minute = minute
            self._tally = _counted(self._tally, outcome, seconds * 1000, message_type,
                                   critical)
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

    def _write(self, minute: float, tally: Minute) -> None:
        with self._writing:  # one write at a time: an older tally never overwrites a newer
            try:
                self.tables.replace(self.table, Entity(
                    day_partition(minute), f"{int(minute):010d}~{self.instance}",
                    _properties(tally)))
            except StorageError as exc:
                log.info("could not write the statistics of %s: %s", self.table, exc)


def _counted(minute: Minute, outcome: str, milliseconds: float, message_type: str | None,
             critical: float | None) -> Minute:
    types = dict(minute.types)
    if message_type is not None:
        name = message_type if message_type in types or len(types) < MAX_TYPES else OTHER_TYPES
        types[name] = types.get(name, Tally()).add(outcome, milliseconds, critical)
    return Minute(minute.tally.add(outcome, milliseconds, critical), types, minute.depth)


def _properties(minute: Minute) -> dict[str, EntityValue]:
    tally = minute.tally
    return {"processed": tally.processed, "failed": tally.failed,
            "poisoned": tally.poisoned, "other": tally.other,
            "total_ms": tally.total_ms, "max_ms": tally.max_ms,
            "time_hist": ",".join(map(str, tally.time_hist)),
            "critical_hist": ",".join(map(str, tally.critical_hist)),
            "types": json.dumps({name: t.as_list() for name, t in minute.types.items()},
                                separators=(",", ":"))}


def record_depth(tables: Tables, table: str, now: float, depth: int) -> None:
    """The queue's length at ``now``, in its minute's row (maintenance, each pass)."""
    minute = now - now % 60
    tables.replace(table, Entity(day_partition(minute), f"{int(minute):010d}~{DEPTH}",
                                 {"depth": depth}))


def read(tables: Tables, table: str, since: float, until: float) -> dict[float, Minute]:
    """Each minute's tally, summed over processes, for the minutes that start in
    [``since``, ``until``) - those with signals or a queue length."""
    minutes: dict[float, Minute] = {}
    day = datetime.fromtimestamp(since, tz=timezone.utc).date()
    last = datetime.fromtimestamp(until, tz=timezone.utc).date()
    while day <= last:
        for row in tables.query(table, PARTITION + day.strftime("%Y%m%d")):
            start, _, who = row.row_key.partition("~")
            try:
                minute = float(start)
            except ValueError:
                continue
            if since <= minute < until:
                found = _depth(row) if who == DEPTH else _minute(row)
                minutes[minute] = minutes.get(minute, Minute()) + found
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


def _depth(row: Entity) -> Minute:
    value = row.properties.get("depth")
    return Minute(depth=value if isinstance(value, int) and value >= 0 else None)


def _minute(row: Entity) -> Minute:
    props = row.properties

    def number(name: str) -> float:
        value = props.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return 0.0
        try:
            found = float(value)
        except OverflowError:  # an integer past any float: not this bus's writing
            return 0.0
        return found if math.isfinite(found) and found >= 0 else 0.0

    def count(name: str) -> int:
        found = number(name)
        return int(found) if found <= MAX_COUNT else 0

    tally = Tally(count("processed"), count("failed"), count("poisoned"), count("other"),
                  number("total_ms"), number("max_ms"),
                  _hist(props.get("time_hist"), TIME_BUCKETS_MS),
                  _hist(props.get("critical_hist"), CRITICAL_BUCKETS_S))
    types: dict[str, Tally] = {}
    try:
        stored = json.loads(str(props.get("types", "{}")))
    except ValueError:
        stored = {}
    if isinstance(stored, dict):
        for name, values in list(stored.items())[:MAX_TYPES + 1]:
            found = Tally.from_list(values)
            if found is not None:
                types[str(name)] = found
    return Minute(tally, types)
