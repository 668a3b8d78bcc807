"""A wrapper around the three storage ports that passes every request through an observer.

Every call to a port method is one request to Azure Storage (a table batch is one request), so
an observer sees each billable operation once, named ``(service, operation)``, e.g.
``("queue", "send")``, ``("table", "transact")``, ``("blob", "write")``. Two observers use it:
the operation counter (``bus.storage.counting``: the benchmarks', a Spark job's requests) and
the storage-duration metric (``bus.observability``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from bus.storage.ports import Blob, Blobs, Entity, QueueMessage, Queues, Storage, TableOp, Tables

T = TypeVar("T")


class Observer(Protocol):
    def call(self, service: str, operation: str, fn: Callable[[], T]) -> T:
        """Make the request (``fn``) and return its result or raise its error."""


class ObservedQueues:
    def __init__(self, inner: Queues, observer: Observer) -> None:
        self._inner = inner
        self.limits = inner.limits
        self._observer = observer

    def create_queue(self, queue: str) -> None:
        self._observer.call("queue", "create_queue", lambda: self._inner.create_queue(queue))

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        self._observer.call("queue", "send", lambda: self._inner.send(queue, body, delay=delay))

    def receive(self, queue: str, *, max_messages: int, lease: float) -> list[QueueMessage]:
        return self._observer.call("queue", "receive", lambda: self._inner.receive(
            queue, max_messages=max_messages, lease=lease))

    def delete(self, queue: str, message: QueueMessage) -> None:
        self._observer.call("queue", "delete", lambda: self._inner.delete(queue, message))

    def extend(self, queue: str, message: QueueMessage, *, lease: float) -> QueueMessage:
        return self._observer.call(
            "queue", "extend", lambda: self._inner.extend(queue, message, lease=lease))

    def peek(self, queue: str, *, max_messages: int) -> list[str]:
        return self._observer.call(
            "queue", "peek", lambda: self._inner.peek(queue, max_messages=max_messages))

    def depth(self, queue: str) -> int:
        return self._observer.call("queue", "depth", lambda: self._inner.depth(queue))

    def oldest(self, queue: str) -> float | None:
        return self._observer.call("queue", "oldest", lambda: self._inner.oldest(queue))


class ObservedBlobs:
    def __init__(self, inner: Blobs, observer: Observer) -> None:
        self._inner = inner
        self._observer = observer

    def create_container(self, container: str) -> None:
        self._observer.call("blob", "create_container",
                           lambda: self._inner.create_container(container))

    def read(self, container: str, name: str, *, max_bytes: int | None = None) -> Blob:
        return self._observer.call("blob", "read",
                                  lambda: self._inner.read(container, name, max_bytes=max_bytes))

    def write(self, container: str, name: str, data: bytes, *, etag: str | None = None,
              create_only: bool = False) -> str:
        return self._observer.call("blob", "write", lambda: self._inner.write(
            container, name, data, etag=etag, create_only=create_only))

    def delete(self, container: str, name: str) -> None:
        self._observer.call("blob", "delete", lambda: self._inner.delete(container, name))

    def list(self, container: str, prefix: str = "") -> list[str]:
        return self._observer.call("blob", "list", lambda: self._inner.list(container, prefix))


class ObservedTables:
    def __init__(self, inner: Tables, observer: Observer) -> None:
        self._inner = inner
        self.limits = inner.limits
        self._observer = observer

    def create_table(self, table: str) -> None:
        self._observer.call("table", "create_table", lambda: self._inner.create_table(table))

    def get(self, table: str, partition_key: str, row_key: str) -> Entity:
        return self._observer.call(
            "table", "get", lambda: self._inner.get(table, partition_key, row_key))

    def get_many(self, table: str, partition_key: str,
                 row_keys: Sequence[str]) -> dict[str, Entity]:
        return self._observer.call(
            "table", "get_many", lambda: self._inner.get_many(table, partition_key, row_keys))

    def insert(self, table: str, entity: Entity) -> str:
        return self._observer.call("table", "insert", lambda: self._inner.insert(table, entity))

    def replace(self, table: str, entity: Entity, *, etag: str | None = None) -> str:
        return self._observer.call(
            "table", "replace", lambda: self._inner.replace(table, entity, etag=etag))

    def delete(self, table: str, partition_key: str, row_key: str, *,
               etag: str | None = None) -> None:
        self._observer.call("table", "delete", lambda: self._inner.delete(
            table, partition_key, row_key, etag=etag))

    def transact(self, table: str, ops: Sequence[TableOp]) -> list[str]:
        return self._observer.call("table", "transact", lambda: self._inner.transact(table, ops))

    def query(self, table: str, partition_key: str | None = None,
              row_key: str | None = None, *, row_key_prefix: str | None = None,
              row_key_after: str | None = None, row_key_before: str | None = None,
              limit: int | None = None,
              ) -> list[Entity]:
        return self._observer.call("table", "query", lambda: self._inner.query(
            table, partition_key, row_key, row_key_prefix=row_key_prefix,
            row_key_after=row_key_after, row_key_before=row_key_before, limit=limit))


def observed_storage(storage: Storage, observer: Observer) -> Storage:
    """``storage`` with every port call passed through ``observer``."""
    return Storage(queues=ObservedQueues(storage.queues, observer),
                   blobs=ObservedBlobs(storage.blobs, observer),
                   tables=ObservedTables(storage.tables, observer))
