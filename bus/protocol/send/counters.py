"""Sequence counters of client streams (``bus.protocol.sessions.order``), in the send ledger table.

A handler's sends are numbered from its partition's outbox slot, which every commit rewrites
anyway. A client has no slot: each of its streams - one destination and session - keeps a
counter row of its own, advanced by compare-and-swap before the copy is made (clients of the
same name share the stream). A request whose outcome is unknown is resolved by reading the row
again: the row names the call that wrote it.

A process remembers each counter row as it last wrote it, so its next send to the same session
writes without reading first: one request per numbered send, two after another process wrote
the row (the compare-and-swap fails, and the row is read again).

A number is taken whether or not the send then succeeds: a send that fails after it leaves a
gap in the stream, which the receiving endpoint's reorder window closes (``skip_gaps``) or
reports.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from bus.errors import Contention
from bus.protocol.sessions.order import counter_partition
from bus.storage import Conflict, Entity, NotFound, PreconditionFailed, StorageError, Tables

_ROW = "counter"
_ROUNDS = 20
_REMEMBERED = 4_096


class Counters:
    """Numbers the copies of one client's streams."""

    def __init__(self, *, tables: Tables, table: str, stream: str,
                 new_id: Callable[[], str]) -> None:
        self._tables = tables
        self._table = table
        self.stream = stream
        self._new_id = new_id
        self._known: dict[str, tuple[int, str | None]] = {}
        """Counter rows as this process last wrote them: number and ETag, oldest first."""
        self._lock = threading.Lock()

    def next(self, destination: str, session: str) -> tuple[str, int]:
        """This client's stream and the next number for ``destination`` and ``session``."""
        partition = counter_partition(self.stream, destination, session)
        call = self._new_id()
        for _ in range(_ROUNDS):
            taken = self._advance(partition, call, destination, session)
            if taken is not None:
                return self.stream, taken
        raise Contention(f"the sequence counter of session {session!r} at {destination!r} "
                         "kept changing")

    def _advance(self, partition: str, call: str, destination: str, session: str) -> int | None:
        """One compare-and-swap, from the row as this process last wrote it when it remembers
        it (no read: usually nobody else writes it), else as read now; the number taken, or
        None when another call got there."""
        with self._lock:
            known = self._known.pop(partition, None)
        if known is None:
            try:
                row = self._tables.get(self._table, partition, _ROW)
                known = (_number(row), row.etag)
            except NotFound:
                known = (0, None)
        number, etag = known[0] + 1, known[1]
        entity = Entity(partition, _ROW, {"n": number, "by": call, "stream": self.stream,
                                          "destination": destination, "session": session})
        try:
            if etag is None:
                written = self._tables.insert(self._table, entity)
            else:
                written = self._tables.replace(self._table, entity, etag=etag)
        except (Conflict, PreconditionFailed):
            return self._mine(partition, call, number)
        except StorageError:
            if self._mine(partition, call, number) is None:
                raise
            return number
        self._remember(partition, number, written)
        return number

    def _remember(self, partition: str, number: int, etag: str) -> None:
        with self._lock:
            self._known[partition] = (number, etag)
            while len(self._known) > _REMEMBERED:
                del self._known[next(iter(self._known))]

    def _mine(self, partition: str, call: str, number: int) -> int | None:
        """``number`` if the row says this call wrote it (a request that landed although its
        answer was lost or refused as a conflict on a retry), else None."""
        try:
            row = self._tables.get(self._table, partition, _ROW)
        except NotFound:
            return None
        mine = row.properties.get("by") == call and _number(row) == number
        return number if mine else None


def _number(row: Entity) -> int:
    value = row.properties.get("n", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
