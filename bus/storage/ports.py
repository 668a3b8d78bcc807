"""The storage ports: minimal, synchronous, typed.

Each method documents the errors it raises. Every method may also raise
:class:`~bus.storage.errors.TransientError` (outcome unknown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from bus.storage.limits import StorageLimits

EntityValue = str | int | float | bool | bytes | datetime | None


@dataclass(frozen=True)
class QueueMessage:
    """A received queue message, leased to the receiver until its visibility timeout ends."""

    id: str
    pop_receipt: str
    body: str
    dequeue_count: int


@dataclass(frozen=True)
class Blob:
    data: bytes
    etag: str


@dataclass(frozen=True)
class Entity:
    """A table row. ``etag`` is empty for an entity that has not been read from storage."""

    partition_key: str
    row_key: str
    properties: Mapping[str, EntityValue] = field(default_factory=dict)
    etag: str = ""


@dataclass(frozen=True)
class TableOp:
    """One operation of an entity-group transaction.

    ``insert`` fails with Conflict when the row exists; ``replace`` with an ``etag`` fails with
    PreconditionFailed when the row changed (without one it is an upsert); ``delete`` with an
    ``etag`` is conditional the same way and fails with NotFound when the row is absent.
    """

    kind: Literal["insert", "replace", "delete"]
    entity: Entity
    etag: str | None = None


class Queues(Protocol):
    limits: StorageLimits
    """What this queue service accepts (``bus.storage.limits``); a request beyond it raises
    TooLarge or Refused and writes nothing."""

    def create_queue(self, queue: str) -> None:
        """Create the queue if it does not exist."""

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        """Append a message; it becomes visible after ``delay`` seconds (at most
        ``limits.visibility_seconds``); it never expires. Raises NotFound, TooLarge."""

    def receive(self, queue: str, *, max_messages: int, lease: float) -> list[QueueMessage]:
        """Lease up to ``max_messages`` (1..32) visible messages for ``lease`` seconds."""

    def delete(self, queue: str, message: QueueMessage) -> None:
        """Delete a leased message. Raises NotFound when the lease was lost (pop receipt stale)."""

    def extend(self, queue: str, message: QueueMessage, *, lease: float) -> QueueMessage:
        """Restart the lease from now; returns the message with its new pop receipt.

        ``lease=0`` releases the message for redelivery at once. Raises NotFound when the
        lease was lost.
        """

    def peek(self, queue: str, *, max_messages: int) -> list[str]:
        """The bodies of up to ``max_messages`` (1..32) visible messages at the front of the
        queue: one request that leases none of them and changes nothing (a peek), so a
        reader that only looks hides nothing from the others, whatever becomes of it."""

    def depth(self, queue: str) -> int:
        """Approximate number of messages in the queue, visible or not."""

    def oldest(self, queue: str) -> float | None:
        """When the message at the front of the queue - the first visible one - was put on
        it (epoch seconds), or None when none is visible. One request that changes nothing
        (a peek); queues are roughly first in, first out, so "the oldest" is approximate."""


class Blobs(Protocol):
    def create_container(self, container: str) -> None:
        """Create the container if it does not exist."""

    def read(self, container: str, name: str, *, max_bytes: int | None = None) -> Blob:
        """Raises NotFound. With ``max_bytes``, at most ``max_bytes + 1`` bytes are read: a
        longer blob comes back cut there, so the caller can tell it is over its limit without
        holding all of it."""

    def write(
        self, container: str, name: str, data: bytes, *, etag: str | None = None,
        create_only: bool = False,
    ) -> str:
        """Write and return the new ETag.

        ``create_only`` fails with Conflict when the blob exists; ``etag`` fails with
        PreconditionFailed when the blob changed (or NotFound when it is gone).
        """

    def delete(self, container: str, name: str) -> None:
        """Raises NotFound."""

    def list(self, container: str, prefix: str = "") -> list[str]:
        """Names of the blobs whose name starts with ``prefix``."""


class Tables(Protocol):
    limits: StorageLimits
    """What this table service accepts (``bus.storage.limits``); a request beyond it raises
    TooLarge or Refused and writes nothing."""

    def create_table(self, table: str) -> None:
        """Create the table if it does not exist."""

    def get(self, table: str, partition_key: str, row_key: str) -> Entity:
        """Raises NotFound."""

    def get_many(self, table: str, partition_key: str,
                 row_keys: Sequence[str]) -> dict[str, Entity]:
        """The existing rows among ``row_keys`` of one partition, by row key: one request,
        one snapshot, for up to ``limits.keys_per_read`` keys (a missing row is simply
        absent from the result). An answer the service splits into pages raises
        TransientError: the rows of two pages may come from different moments."""

    def insert(self, table: str, entity: Entity) -> str:
        """Create the row; returns its ETag. Raises Conflict."""

    def replace(self, table: str, entity: Entity, *, etag: str | None = None) -> str:
        """Replace the row (upsert when ``etag`` is None). Raises PreconditionFailed, NotFound."""

    def delete(self, table: str, partition_key: str, row_key: str, *,
               etag: str | None = None) -> None:
        """Delete the row; a missing row is not an error. Raises PreconditionFailed."""

    def transact(self, table: str, ops: Sequence[TableOp]) -> list[str]:
        """Apply up to ``limits.transaction_operations`` operations on one partition
        atomically: all or none. Raises TooLarge or Refused beyond ``limits``.

        Returns the new ETag of each operation ("" for a delete). Raises the error of the first
        operation that fails (Conflict, PreconditionFailed or NotFound); then nothing was written.
        """

    def query(self, table: str, partition_key: str | None = None,
              row_key: str | None = None, *, row_key_prefix: str | None = None,
              row_key_after: str | None = None, row_key_before: str | None = None,
              limit: int | None = None,
              ) -> list[Entity]:
        """The rows matching the given keys (all of the table when none is given), or whose
        row key starts with ``row_key_prefix``, or comes after ``row_key_after`` or before
        ``row_key_before`` (filtered by the service: what it leaves out is not sent); in key order
        (partition key, then row key), the first ``limit`` of them when it is given (the
        service is asked for no more: a partition's newest rows under a descending key are
        one small request).
        For tooling and maintenance, not hot paths: the service answers in pages of at most
        ``limits.query_page`` rows, and the pages are not one snapshot (a row written during
        the query may be missing, one deleted may still be there)."""


@dataclass(frozen=True)
class Storage:
    """The three ports together: what an endpoint needs to run."""

    queues: Queues
    blobs: Blobs
    tables: Tables
