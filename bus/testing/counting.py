"""Storage operations counted, not estimated: a wrapper around the three storage ports.

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

from bus.storage import Blob, Blobs, Entity, QueueMessage, Queues, Storage, TableOp, Tables

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
        self.add(service, operation)
        return result


class CountingQueues:
    def __init__(self, inner: Queues, counter: OpCounter) -> None:
        self._inner = inner
        self.limits = inner.limits
        self._counter = counter

    def create_queue(self, queue: str) -> None:
        self._counter.call("queue", "create_queue", lambda: self._inner.create_queue(queue))

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        self._counter.call("queue", "send", lambda: self._inner.send(queue, body, delay=delay))

    def receive(self, queue: str, *, max_messages: int, lease: float) -> list[QueueMessage]:
        try:
            messages = self._inner.receive(queue, max_messages=max_messages, lease=lease)
        except Exception as exc:
            self._counter.add("queue", "receive", type(exc).__name__)
            raise
        self._counter.add("queue", "receive" if messages else "receive_empty")
        return messages

    def delete(self, queue: str, message: QueueMessage) -> None:
        self._counter.call("queue", "delete", lambda: self._inner.delete(queue, message))

    def extend(self, queue: str, message: QueueMessage, *, lease: float) -> QueueMessage:
        return self._counter.call(
            "queue", "extend", lambda: self._inner.extend(queue, message, lease=lease))

    def depth(self, queue: str) -> int:
        return self._counter.call("queue", "depth", lambda: self._inner.depth(queue))


class CountingBlobs:
    def __init__(self, inner: Blobs, counter: OpCounter) -> None:
        self._inner = inner
        self._counter = counter

    def create_container(self, container: str) -> None:
        self._counter.call("blob", "create_container",
                           lambda: self._inner.create_container(container))

    def read(self, container: str, name: str, *, max_bytes: int | None = None) -> Blob:
        return self._counter.call("blob", "read",
                                  lambda: self._inner.read(container, name, max_bytes=max_bytes))

    def write(self, container: str, name: str, data: bytes, *, etag: str | None = None,
              create_only: bool = False) -> str:
        return self._counter.call("blob", "write", lambda: self._inner.write(
            container, name, data, etag=etag, create_only=create_only))

    def delete(self, container: str, name: str) -> None:
        self._counter.call("blob", "delete", lambda: self._inner.delete(container, name))

    def list(self, container: str, prefix: str = "") -> list[str]:
        return self._counter.call("blob", "list", lambda: self._inner.list(container, prefix))


class CountingTables:
    def __init__(self, inner: Tables, counter: OpCounter) -> None:
        self._inner = inner
        self.limits = inner.limits
        self._counter = counter

    def create_table(self, table: str) -> None:
        self._counter.call("table", "create_table", lambda: self._inner.create_table(table))

    def get(self, table: str, partition_key: str, row_key: str) -> Entity:
        return self._counter.call(
            "table", "get", lambda: self._inner.get(table, partition_key, row_key))

    def get_many(self, table: str, partition_key: str,
                 row_keys: Sequence[str]) -> dict[str, Entity]:
        return self._counter.call(
            "table", "get_many", lambda: self._inner.get_many(table, partition_key, row_keys))

    def insert(self, table: str, entity: Entity) -> str:
        return self._counter.call("table", "insert", lambda: self._inner.insert(table, entity))

    def replace(self, table: str, entity: Entity, *, etag: str | None = None) -> str:
        return self._counter.call(
            "table", "replace", lambda: self._inner.replace(table, entity, etag=etag))

    def delete(self, table: str, partition_key: str, row_key: str, *,
               etag: str | None = None) -> None:
        self._counter.call("table", "delete", lambda: self._inner.delete(
            table, partition_key, row_key, etag=etag))

    def transact(self, table: str, ops: Sequence[TableOp]) -> list[str]:
        return self._counter.call("table", "transact", lambda: self._inner.transact(table, ops))

    def query(self, table: str, partition_key: str | None = None,
              row_key: str | None = None, *, row_key_prefix: str | None = None,
              ) -> list[Entity]:
        return self._counter.call("table", "query", lambda: self._inner.query(
            table, partition_key, row_key, row_key_prefix=row_key_prefix))


def counting_storage(storage: Storage,
                     counter: OpCounter | None = None) -> tuple[Storage, OpCounter]:
    """``storage`` with every port call counted, and the counter (a new one unless given)."""
    counter = counter or OpCounter()
    wrapped = Storage(queues=CountingQueues(storage.queues, counter),
                      blobs=CountingBlobs(storage.blobs, counter),
                      tables=CountingTables(storage.tables, counter))
    return wrapped, counter
