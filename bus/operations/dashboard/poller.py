"""Readings of storage shared by every viewer of the dashboard, at most one per interval.

A dashboard that reads storage once per viewer and refresh costs money and, with many viewers,
throttles the account it watches. Every number the Endpoints page shows (queue depth, poison
count, pause, deferred count) goes through one ``Poller`` per app: a reading is taken at most
once per ``interval`` seconds per key, whoever asks; viewers asking meanwhile get the last one
(with its age). Concurrent askers of a key that is due wait for the one reading in flight
instead of making their own. A failed reading is kept like a value (its error text), so a
storage outage is not hammered either. An action that changes what a key reads (a replay, a
pause) drops the key: the next viewer reads it anew.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Reading(Generic[T]):
    """One reading: its value (None when it failed), when it was taken, the error if any."""

    value: T | None
    read_at: float
    error: str | None = None


class Poller:
    """Caches readings per key for ``interval`` seconds (0: every ask reads)."""

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.time) -> None:
        if interval < 0:
            raise ValueError("the polling interval is a number of seconds, 0 or more")
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._readings: dict[Hashable, Reading[object]] = {}
        self._key_locks: dict[Hashable, threading.Lock] = {}
        self.reads = 0  # readings taken (for tests and the settings route)

    def get(self, key: Hashable, read: Callable[[], T]) -> Reading[T]:
        """The reading of ``key``: the cached one while younger than the interval, else a new
        one from ``read`` (exceptions become the reading's error)."""
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # one reading in flight per key; the others wait for it
            cached = self._fresh(key)
            if cached is not None:
                return cached  # type: ignore[return-value]  # stored by this key's reader
            try:
                reading: Reading[object] = Reading(read(), self._clock())
            except Exception as exc:
                reading = Reading(None, self._clock(), f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._readings[key] = reading
                self.reads += 1
            return reading  # type: ignore[return-value]

    def now(self) -> float:
        """The time by this poller's clock (readings are stamped with it)."""
        return self._clock()

    def forget(self, *keys: Hashable) -> None:
        """Drop the readings of ``keys`` (after an action changed what they read)."""
        with self._lock:
            for key in keys:
                self._readings.pop(key, None)

    def _fresh(self, key: Hashable) -> Reading[object] | None:
        with self._lock:
            reading = self._readings.get(key)
        if reading is None or self._clock() - reading.read_at >= self.interval:
            return None
        return reading
