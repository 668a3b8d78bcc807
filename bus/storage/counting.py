"""Storage operations counted, not estimated: an observer of the storage ports
(``bus.storage.observed``), for the benchmarks and tests (``bus.testing.counting``) and a Spark
job's ``PublishResult.requests``.

Every call to a port method is one request to Azure Storage (a table batch is one request), so
counting calls counts billable operations. Counts are keyed ``(service, operation)``, e.g.
``("queue", "send")``, ``("table", "transact")``, ``("blob", "write")``::

    storage, counter = counting_storage(AzureStorage.from_connection_string(connection))
    bus = Bus(storage, endpoints)
    ...
    counter.snapshot()  # {("queue", "receive"): 12, ("table", "get"): 40, ...}

A call that raises is still counted (the request was made, and Azure bills most failed
requests), and also recorded in ``errors`` under ``(service, operation, error class)``. A
receive that returns no message is counted as ``receive_empty``: idle polling depends on the
load and the poll interval, not on what it takes to move a message. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from bus.storage import Storage
from bus.storage.observed import observed_storage

T = TypeVar("T")
OpKey = tuple[str, str]
ErrorKey = tuple[str, str, str]


class OpCounter:
    """Thread-safe counts of storage operations and of the errors they raised."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: dict[OpKey, int] = {}
        self._errors: dict[ErrorKey, int] = {}

    def add(self, service: str, operation: str, error: str | None = None) -> None:
        with self._lock:
            key = (service, operation)
            self._ops[key] = self._ops.get(key, 0) + 1
            if error is not None:
                ekey = (service, operation, error)
                self._errors[ekey] = self._errors.get(ekey, 0) + 1

    def snapshot(self) -> dict[OpKey, int]:
        """A copy of the operation counts."""
        with self._lock:
            return dict(self._ops)

    def errors(self) -> dict[ErrorKey, int]:
        """A copy of the error counts (each error is also counted as its operation)."""
        with self._lock:
            return dict(self._errors)

    def total(self, *, exclude: Sequence[OpKey] = ()) -> int:
        with self._lock:
            return sum(n for key, n in self._ops.items() if key not in exclude)

    def reset(self) -> None:
        with self._lock:
            self._ops.clear()
            self._errors.clear()

    def call(self, service: str, operation: str, fn: Callable[[], T]) -> T:
        """Run one storage request and count it (with its error class if it raises)."""
        try:
            result = fn()
        except Exception as exc:
            self.add(service, operation, type(exc).__name__)
            raise
        if operation == "receive" and not result:
            operation = "receive_empty"
        self.add(service, operation)
        return result


def counting_storage(storage: Storage,
                     counter: OpCounter | None = None) -> tuple[Storage, OpCounter]:
    """``storage`` with every port call counted, and the counter (a new one unless given)."""
    counter = counter or OpCounter()
    return observed_storage(storage, counter), counter
