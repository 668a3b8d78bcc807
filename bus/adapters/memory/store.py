"""In-memory queues, blobs and tables with Azure Storage's observable semantics and limits.

The limits (``bus.storage.limits``, Azure's by default) are enforced as the service enforces
them: a message, entity or transaction beyond them is refused with TooLarge or Refused and
nothing is written; delays and leases longer than the queue allows are refused. Sizes are
counted the service's way (UTF-16 for table strings).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from bus.adapters.memory.faults import Fault, FaultHooks, NoFaults
from bus.storage.errors import (
    Conflict,
    Missing,
    NotFound,
    PreconditionFailed,
    Refused,
    TransientError,
)
from bus.storage.limits import (
    AZURE,
    StorageLimits,
    check_entity,
    check_message,
    check_transaction,
)
from bus.storage.ports import Blob, Entity, QueueMessage, Storage, TableOp

T = TypeVar("T")


class _Core:
    """State shared by the three services: one lock, one clock, one fault policy."""

    def __init__(self, hooks: FaultHooks, limits: StorageLimits) -> None:
        self.hooks = hooks
        self.limits = limits
        # Hooks written before pages were modelled answer whole pages.
        self.page_length: Callable[[int], int] = getattr(
            hooks, "page_length", lambda limit: limit)
        self.lock = threading.RLock()
        self._counter = itertools.count(1)

    def tag(self, prefix: str) -> str:
        return f"{prefix}{next(self._counter)}"

    def call(self, service: str, operation: str, effect: Callable[[], T],
             duplicate: Callable[[], None] | None = None) -> T:
        fault = self.hooks.before_call(service, operation)
        if fault is Fault.FAIL_BEFORE:
            raise TransientError(f"injected: {service}.{operation} failed before effect")
        if fault is Fault.GHOST:
            self.hooks.defer(self._ghost(effect))
            raise TransientError(f"injected: {service}.{operation} timed out (ghost pending)")
        with self.lock:
            result = effect()
            if fault is Fault.DUPLICATE and duplicate is not None:
                duplicate()
        if fault is Fault.FAIL_AFTER:
            raise TransientError(f"injected: {service}.{operation} response lost after effect")
        return result

    def _ghost(self, effect: Callable[[], object]) -> Callable[[], None]:
        def apply() -> None:
            with self.lock, contextlib.suppress(Exception):
                effect()

        return apply


@dataclass
class _Stored:
    id: str
    body: str
    visible_at: float
    dequeue_count: int = 0
    pop_receipt: str = ""
    expires_at: float | None = None
    inserted_at: float = 0.0


class MemoryQueues:
    def __init__(self, core: _Core) -> None:
        self._core = core
        self.limits = core.limits
        self._queues: dict[str, list[_Stored]] = {}
        self.expired = 0
        """Messages whose time-to-live ran out (a statistic)."""

    def create_queue(self, queue: str) -> None:
        self._core.call("queue", "create", lambda: self._queues.setdefault(queue, []))

    def send(self, queue: str, body: str, *, delay: float = 0.0,
             time_to_live: float | None = None) -> None:
        """Put a message on ``queue``. ``time_to_live`` (seconds after it is sent; None or -1:
        never) is Azure's message time-to-live, gone without trace when it runs out. The bus's
        own messages never expire (the Azure adapter sends -1); a model of someone else's
        send gives it (the Functions host's poison copies keep the service's 7 days)."""
        if time_to_live is not None and time_to_live != -1 and time_to_live <= 0:
            raise Refused(f"a message time-to-live of {time_to_live} s: give a positive "
                          "number, or -1 for never")

        def put() -> None:
            check_message(body, self.limits)
            self._check_seconds("delay", delay)
            now = self._core.hooks.now()
            expires = None if time_to_live in (None, -1) else now + float(time_to_live)
            self._get(queue).append(
                _Stored(self._core.tag("m"), body, now + delay, expires_at=expires,
                        inserted_at=time.time()))  # wall time (``now`` may be monotonic)

        self._core.call("queue", "send", put, duplicate=put)

    def receive(self, queue: str, *, max_messages: int, lease: float) -> list[QueueMessage]:
        def take() -> list[QueueMessage]:
            self._check_count("receive", max_messages)
            self._check_seconds("lease", lease)
            now = self._core.hooks.now()
            visible = [m for m in self._get(queue) if m.visible_at <= now][:max_messages]
            for m in visible:
                m.visible_at = now + lease
                m.dequeue_count += 1
                m.pop_receipt = self._core.tag("r")
            return [QueueMessage(m.id, m.pop_receipt, m.body, m.dequeue_count) for m in visible]

        return self._core.call("queue", "receive", take)

    def delete(self, queue: str, message: QueueMessage) -> None:
        def remove() -> None:
            stored = self._leased(queue, message)
            self._get(queue).remove(stored)

        self._core.call("queue", "delete", remove)

    def extend(self, queue: str, message: QueueMessage, *, lease: float) -> QueueMessage:
        def renew() -> QueueMessage:
            self._check_seconds("lease", lease)
            stored = self._leased(queue, message)
            stored.visible_at = self._core.hooks.now() + lease
            stored.pop_receipt = self._core.tag("r")
            return replace(message, pop_receipt=stored.pop_receipt)

        return self._core.call("queue", "extend", renew)

    def peek(self, queue: str, *, max_messages: int) -> list[str]:
        def look() -> list[str]:
            self._check_count("peek", max_messages)
            now = self._core.hooks.now()
            return [m.body for m in self._get(queue) if m.visible_at <= now][:max_messages]

        return self._core.call("queue", "peek", look)

    def depth(self, queue: str) -> int:
        return self._core.call("queue", "depth", lambda: len(self._get(queue)))

    def oldest(self, queue: str) -> float | None:
        def peek() -> float | None:
            now = self._core.hooks.now()
            return next((m.inserted_at for m in self._get(queue) if m.visible_at <= now), None)

        return self._core.call("queue", "oldest", peek)

    # -- inspection for tests and the simulation (no faults, no scheduling) --------------
    def bodies(self, queue: str) -> list[str]:
        with self._core.lock:
            if queue in self._queues:
                self._expire(queue)
            return [m.body for m in self._queues.get(queue, [])]

    def listed(self, queue: str) -> list[tuple[str, str]]:
        """Every message's id and body, leased ones included (what an operator's last
        listing showed)."""
        with self._core.lock:
            if queue in self._queues:
                self._expire(queue)
            return [(m.id, m.body) for m in self._queues.get(queue, [])]

    def names(self) -> list[str]:
        with self._core.lock:
            return sorted(self._queues)

    def next_visible_at(self) -> float | None:
        """When the next message becomes visible, or expires (either changes what a receive
        or an inspection finds)."""
        with self._core.lock:
            times = [t for q in self._queues.values() for m in q
                     for t in (m.visible_at, m.expires_at) if t is not None]
            return min(times) if times else None

    def expire_lease(self, pick: Callable[[list[str]], int]) -> bool:
        """Make one leased (invisible) message visible now, as if its lease had run out."""
        with self._core.lock:
            now = self._core.hooks.now()
            leased = [(q, m) for q, ms in self._queues.items() for m in ms
                      if m.visible_at > now and m.dequeue_count > 0]
            if not leased:
                return False
            _, stored = leased[pick([m.id for _, m in leased])]
            stored.visible_at = now
            return True

    def _check_count(self, what: str, count: int) -> None:
        if not 1 <= count <= self.limits.messages_per_receive:
            raise Refused(f"a {what} takes 1..{self.limits.messages_per_receive} messages, "
                          f"not {count}")

    def _check_seconds(self, what: str, seconds: float) -> None:
        if not 0 <= seconds <= self.limits.visibility_seconds:
            raise Refused(f"a {what} of {seconds} s; a queue allows 0 to "
                          f"{self.limits.visibility_seconds} s")

    def _get(self, queue: str) -> list[_Stored]:
        if queue not in self._queues:
            raise Missing(f"queue {queue!r} does not exist")
        self._expire(queue)
        return self._queues[queue]

    def _expire(self, queue: str) -> None:
        """Drop the messages of ``queue`` whose time-to-live has run out."""
        now = self._core.hooks.now()
        stored = self._queues[queue]
        kept = [m for m in stored if m.expires_at is None or m.expires_at > now]
        if len(kept) != len(stored):
            self.expired += len(stored) - len(kept)
            stored[:] = kept

    def _leased(self, queue: str, message: QueueMessage) -> _Stored:
        for stored in self._get(queue):
            if stored.id == message.id:
                if stored.pop_receipt != message.pop_receipt:
                    raise NotFound(f"message {message.id}: pop receipt no longer valid")
                return stored
        raise NotFound(f"message {message.id} is not in {queue!r}")


class MemoryBlobs:
    def __init__(self, core: _Core) -> None:
        self._core = core
        self._containers: dict[str, dict[str, Blob]] = {}

    def create_container(self, container: str) -> None:
        self._core.call("blob", "create", lambda: self._containers.setdefault(container, {}))

    def read(self, container: str, name: str, *, max_bytes: int | None = None) -> Blob:
        def get() -> Blob:
            blobs = self._get(container)
            if name not in blobs:
                raise NotFound(f"blob {container}/{name} does not exist")
            blob = blobs[name]
            if max_bytes is not None and len(blob.data) > max_bytes:
                return Blob(blob.data[:max_bytes + 1], blob.etag)
            return blob

        return self._core.call("blob", "read", get)

    def write(self, container: str, name: str, data: bytes, *, etag: str | None = None,
              create_only: bool = False) -> str:
        def put() -> str:
            blobs = self._get(container)
            current = blobs.get(name)
            if create_only and current is not None:
                raise Conflict(f"blob {container}/{name} already exists")
            if etag is not None:
                if current is None:
                    raise NotFound(f"blob {container}/{name} does not exist")
                if current.etag != etag:
                    raise PreconditionFailed(f"blob {container}/{name} changed")
            blob = Blob(bytes(data), self._core.tag("b"))
            blobs[name] = blob
            return blob.etag

        return self._core.call("blob", "write", put)

    def delete(self, container: str, name: str) -> None:
        def remove() -> None:
            if self._get(container).pop(name, None) is None:
                raise NotFound(f"blob {container}/{name} does not exist")

        self._core.call("blob", "delete", remove)

    def list(self, container: str, prefix: str = "") -> list[str]:
        return self._core.call(
            "blob", "list", lambda: sorted(n for n in self._get(container) if n.startswith(prefix)))

    # -- inspection for tests and the simulation (no faults, no scheduling) --------------
    def stored(self, container: str, name: str) -> bytes | None:
        """The blob's bytes, or None when there is no such blob."""
        with self._core.lock:
            blob = self._containers.get(container, {}).get(name)
            return None if blob is None else blob.data

    def _get(self, container: str) -> dict[str, Blob]:
        if container not in self._containers:
            raise Missing(f"container {container!r} does not exist")
        return self._containers[container]


class MemoryTables:
    def __init__(self, core: _Core) -> None:
        self._core = core
        self.limits = core.limits
        self._tables: dict[str, dict[tuple[str, str], Entity]] = {}

    def create_table(self, table: str) -> None:
        self._core.call("table", "create", lambda: self._tables.setdefault(table, {}))

    def get(self, table: str, partition_key: str, row_key: str) -> Entity:
        return self._core.call("table", "get",
                               lambda: self._row(self._get(table), partition_key, row_key))

    def get_many(self, table: str, partition_key: str,
                 row_keys: Sequence[str]) -> dict[str, Entity]:
        def pick() -> dict[str, Entity]:
            rows = self._get(table)
            found = {rk: rows[(partition_key, rk)] for rk in row_keys
                     if (partition_key, rk) in rows}
            if found and self._core.page_length(len(found)) < len(found):
                # As the Azure adapter answers a query the service split into pages.
                raise TransientError("the answer came in pages: not one snapshot")
            return found

        return self._core.call("table", "get_many", pick)

    def insert(self, table: str, entity: Entity) -> str:
        return self._core.call("table", "insert",
                               lambda: self._apply(self._get(table), TableOp("insert", entity)))

    def replace(self, table: str, entity: Entity, *, etag: str | None = None) -> str:
        return self._core.call(
            "table", "replace",
            lambda: self._apply(self._get(table), TableOp("replace", entity, etag)))

    def delete(self, table: str, partition_key: str, row_key: str, *,
               etag: str | None = None) -> None:
        op = TableOp("delete", Entity(partition_key, row_key), etag)

        def remove() -> None:
            with contextlib.suppress(NotFound):  # as Azure's SDK: deleting nothing succeeds
                self._apply(self._get(table), op)

        self._core.call("table", "delete", remove)

    def transact(self, table: str, ops: Sequence[TableOp]) -> list[str]:
        def run() -> list[str]:
            _check_batch(ops)
            check_transaction(ops, self.limits)
            rows = self._get(table)
            trial = dict(rows)
            etags = [self._apply(trial, op) for op in ops]
            rows.clear()
            rows.update(trial)
            return etags

        return self._core.call("table", "transact", run)

    def query(self, table: str, partition_key: str | None = None,
              row_key: str | None = None, *, row_key_prefix: str | None = None,
              row_key_after: str | None = None, row_key_before: str | None = None,
              limit: int | None = None,
              ) -> list[Entity]:
        """Page after page, as the service answers (and the SDK follows): each page is one
        request, so what others write between two pages may be missed or seen."""
        found: list[Entity] = []
        after: tuple[str, str] | None = None
        matches = _Matches(partition_key, row_key, row_key_prefix or "", row_key_after,
                           row_key_before)
        while True:
            wanted = None if limit is None else limit - len(found)
            page, after, more = self._core.call(
                "table", "query",
                lambda after=after, wanted=wanted: self._page(  # type: ignore[misc]
                    table, matches, after, wanted))
            found.extend(page)
            if not more or (limit is not None and len(found) >= limit):
                return found

    def _page(self, table: str, matches: _Matches, after: tuple[str, str] | None,
              wanted: int | None) -> tuple[list[Entity], tuple[str, str] | None, bool]:
        """One page of a query: its rows, the key it ended after, whether more follow."""
        rows = self._get(table)
        keys = sorted(key for key in rows if matches(key) and (after is None or key > after))
        length = self._core.page_length(self.limits.query_page)
        page = keys[:length if wanted is None else min(length, wanted)]
        last = page[-1] if page else after
        return [rows[key] for key in page], last, len(keys) > len(page)

    # -- inspection for tests and the simulation ------------------------------------------
    def rows(self, table: str) -> Iterator[Entity]:
        with self._core.lock:
            yield from list(self._tables.get(table, {}).values())

    def stored(self, table: str, partition_key: str, row_key: str) -> Entity | None:
        """The row, or None when there is no such row."""
        with self._core.lock:
            return self._tables.get(table, {}).get((partition_key, row_key))

    def names(self) -> list[str]:
        with self._core.lock:
            return sorted(self._tables)

    def _get(self, table: str) -> dict[tuple[str, str], Entity]:
        if table not in self._tables:
            raise Missing(f"table {table!r} does not exist")
        return self._tables[table]

    @staticmethod
    def _row(rows: dict[tuple[str, str], Entity], pk: str, rk: str) -> Entity:
        if (pk, rk) not in rows:
            raise NotFound(f"entity {pk}/{rk} does not exist")
        return rows[(pk, rk)]

    def _apply(self, rows: dict[tuple[str, str], Entity], op: TableOp) -> str:
        if op.kind != "delete":
            check_entity(op.entity, self.limits)
        key = (op.entity.partition_key, op.entity.row_key)
        current = rows.get(key)
        if op.kind == "insert" and current is not None:
            raise Conflict(f"entity {key} already exists")
        if op.kind != "insert" and op.etag is not None:
            if current is None:
                raise NotFound(f"entity {key} does not exist")
            if current.etag != op.etag:
                raise PreconditionFailed(f"entity {key} changed")
        if op.kind == "delete":
            if current is None:
                raise NotFound(f"entity {key} does not exist")
            del rows[key]
            return ""
        etag = self._core.tag("t")
        rows[key] = replace(op.entity, properties=dict(op.entity.properties), etag=etag)
        return etag


def _check_batch(ops: Sequence[TableOp]) -> None:
    if not ops:
        raise Refused("a transaction takes at least one operation")
    partitions = {op.entity.partition_key for op in ops}
    if len(partitions) != 1:
        raise Refused("a transaction must stay inside one partition")
    keys = [(op.entity.partition_key, op.entity.row_key) for op in ops]
    if len(set(keys)) != len(keys):
        raise Refused("a transaction may touch each row once")


class InMemoryStorage(Storage):
    """Queues, blobs and tables in one process, optionally misbehaving through ``hooks``,
    with Azure's limits unless given others (smaller ones make limits easy to reach in
    tests)."""

    queues: MemoryQueues
    blobs: MemoryBlobs
    tables: MemoryTables

    def __init__(self, hooks: FaultHooks | None = None,
                 limits: StorageLimits = AZURE) -> None:
        core = _Core(hooks or NoFaults(), limits)
        super().__init__(MemoryQueues(core), MemoryBlobs(core), MemoryTables(core))


@dataclass(frozen=True)
class _Matches:
    """A query's conditions on a row's keys."""

    partition_key: str | None
    row_key: str | None
    prefix: str
    after: str | None
    before: str | None

    def __call__(self, key: tuple[str, str]) -> bool:
        return (self.partition_key in (None, key[0]) and self.row_key in (None, key[1])
                and key[1].startswith(self.prefix)
                and (self.after is None or key[1] > self.after)
                and (self.before is None or key[1] < self.before))
