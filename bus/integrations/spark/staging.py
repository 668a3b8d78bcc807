"""The staging table: where Spark work waits between "done by a task" and "made visible".

Spark may run a task more than once and keeps only one attempt's result, but it never undoes
what the others did. So nothing a task does may be visible on the bus: writes stage their
messages here and the driver publishes the winning attempts' rows once Spark commits; reads
stage what they took from a queue here before settling it, so a replayed batch reads the same
rows. One table (``<prefix>busstaging``) and one blob container (``<prefix>-bus-staging``, for
values too large for a table property). Partition keys, by user:

* ``w~<job>``                     - the task attempts of a write job (one row per attempt);
* ``w~<job>~<partition>~<attempt>`` - the messages one write attempt staged;
* ``r~<endpoint>~<run key>``      - the messages a batch read took;
* ``s~<consumer>``                - a streaming consumer's cursor; ``s~<consumer>~<batch>``
  the messages of one micro-batch.

Every write here is an upsert or a delete, so a retried call or a re-run task is harmless.
"""

from __future__ import annotations

import contextlib
import contextvars
import random as _random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from bus.backoff import FIRST_WAIT, LONGEST_WAIT, backoff, transient_retries
from bus.storage import Entity, EntityValue, NotFound, Storage, TableOp
from bus.storage.limits import transactions, utf16_bytes

T = TypeVar("T")

MARKER = "~done"
"""The row that closes a read batch: its messages are all staged (``~`` sorts last)."""
_INLINE_SHARE = 0.9  # of a string property's bytes: larger texts go to a blob
_BLOB_SUFFIX = "__blob"


def retried(call: Callable[..., T], *args: object, **kwargs: object) -> T:
    """Run one storage call, retrying transient errors (every call here is idempotent)."""
    return transient_retries(6)(call, *args, **kwargs)


def each(parallelism: int, call: Callable[[T], object], items: Iterable[T]) -> list[object]:
    """``call`` on every item, ``parallelism`` at a time; at 1, in the caller's thread (no
    pool to start, and the simulation's actors can only switch on their own thread)."""
    if parallelism <= 1:
        return [call(item) for item in items]
    with ThreadPoolExecutor(parallelism) as pool:  # each call in the caller's trace context
        return list(pool.map(lambda item: contextvars.copy_context().run(call, item), items))


@dataclass(frozen=True)
class StagedRow:
    """One staged row: small ``values`` stay in the table row; ``texts`` may be large and move
    to a blob when they do not fit a table property."""

    row_key: str
    values: Mapping[str, EntityValue] = field(default_factory=dict)
    texts: Mapping[str, str] = field(default_factory=dict)


def table_name(prefix: str) -> str:
    return f"{prefix}busstaging"


def container_name(prefix: str) -> str:
    return f"{prefix}-bus-staging" if prefix else "bus-staging"


class Staging:
    def __init__(self, storage: Storage, prefix: str,
                 sleep: Callable[[float], None] = time.sleep,
                 random: Callable[[], float] | None = None) -> None:
        self.tables = storage.tables
        self._blobs = storage.blobs
        self.table = table_name(prefix)
        self.container = container_name(prefix)
        self._sleep = sleep
        self._random = random or _random.random

    def retried(self, call: Callable[..., T], *args: object, **kwargs: object) -> T:
        """:func:`retried`, waiting between tries by this staging's ``sleep`` and ``random``
        (virtual time and seeded jitter in the simulation, so a run replays exactly)."""
        wait = backoff(FIRST_WAIT, LONGEST_WAIT, self._random)
        return transient_retries(6, wait=wait, sleep=self._sleep)(call, *args, **kwargs)

    def ensure(self) -> None:
        """Create the table and the container (idempotent; call on the driver)."""
        self.retried(self.tables.create_table, self.table)
        self.retried(self._blobs.create_container, self.container)

    # -- rows ---------------------------------------------------------------------------------
    def put(self, partition: str, rows: Sequence[StagedRow]) -> None:
        """Upsert ``rows`` into ``partition``, 100 per transaction. Large texts go to blobs
        first, so a row never points at a blob that is not there."""
        ops = [TableOp("replace", self._entity(partition, row)) for row in rows]
        for batch in transactions(ops, self.tables.limits):
            self.retried(self.tables.transact, self.table, batch)

    def upsert(self, partition: str, row: StagedRow) -> None:
        self.retried(self.tables.replace, self.table, self._entity(partition, row))

    def get(self, partition: str, row_key: str) -> dict[str, EntityValue] | None:
        try:
            entity = self.retried(self.tables.get, self.table, partition, row_key)
        except NotFound:
            return None
        return self._values(entity)

    def rows(self, partition: str, limit: int | None = None,
             ) -> list[tuple[str, dict[str, EntityValue]]]:
        """Every row of ``partition`` as (row key, values), in row-key order; the first
        ``limit`` only, when given (read as such: one small request)."""
        entities = self.retried(self.tables.query, self.table, partition, limit=limit)
        return [(e.row_key, self._values(e)) for e in sorted(entities, key=_row_key)]

    def delete_partition(self, partition: str) -> int:
        """Delete every row of ``partition`` and its blobs; returns how many rows."""
        return self.delete_rows(partition, self.retried(self.tables.query, self.table,
                                                        partition))

    def delete_after(self, partition: str, row_key: str) -> int:
        """Delete the rows of ``partition`` whose row key comes after ``row_key`` (a range
        read, not a scan), and their blobs; returns how many rows."""
        return self.delete_rows(partition, self.retried(
            self.tables.query, self.table, partition, row_key_after=row_key))

    def delete_rows(self, partition: str, entities: Sequence[Entity]) -> int:
        """Delete ``entities`` (rows of ``partition`` as read) and their blobs."""
        for entity in entities:
            for name, value in entity.properties.items():
                if name.endswith(_BLOB_SUFFIX) and isinstance(value, str):
                    with contextlib.suppress(NotFound):
                        self.retried(self._blobs.delete, self.container, value)
        per = self.tables.limits.transaction_operations
        for start in range(0, len(entities), per):
            chunk = entities[start:start + per]
            try:
                self.retried(self.tables.transact, self.table,
                        [TableOp("delete", Entity(partition, e.row_key)) for e in chunk])
            except NotFound:  # someone deleted a row meanwhile: delete one by one
                for e in chunk:
                    self.retried(self.tables.delete, self.table, partition, e.row_key)
        return len(entities)

    # -- encoding -----------------------------------------------------------------------------
    def _entity(self, partition: str, row: StagedRow) -> Entity:
        properties: dict[str, EntityValue] = dict(row.values)
        limits = self.tables.limits
        room = limits.entity_bytes // 2  # for the texts kept inline, beside the values
        for name, text in row.texts.items():
            size = utf16_bytes(text)
            if size <= limits.property_bytes * _INLINE_SHARE and size <= room:
                room -= size
                properties[name] = text
            else:
                blob = f"{partition}/{row.row_key}/{name}"
                self.retried(self._blobs.write, self.container, blob, text.encode("utf-8"))
                properties[name + _BLOB_SUFFIX] = blob
        return Entity(partition, row.row_key, properties)

    def _values(self, entity: Entity) -> dict[str, EntityValue]:
        values: dict[str, EntityValue] = {}
        for name, value in entity.properties.items():
            if name.endswith(_BLOB_SUFFIX) and isinstance(value, str):
                blob = self.retried(self._blobs.read, self.container, value)
                values[name.removesuffix(_BLOB_SUFFIX)] = blob.data.decode("utf-8")
            else:
                values[name] = value
        return values


def _row_key(entity: Entity) -> str:
    return entity.row_key
