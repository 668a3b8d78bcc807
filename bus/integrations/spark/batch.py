"""Batch reads: a run key's messages, settled only once the read is committed.

A batch read (``spark.read.format("bus")``, ``bus.spark.receive``) is named by its run key.
It takes messages as a stream's batch does (``reader.Drainer``) but does not settle them:
their inbox tokens stay live and their queue messages leased, and only ``commit`` - the job
says its results are stored - settles them. So a run that fails after reading strands nothing:
the next read, whatever its run key, gives up every read that was never committed and makes
its messages visible again, then takes them.

Staging: the rows of run key ``K`` at ``endpoint`` are in ``chunks`` partitions
``r~<endpoint>~K~<n>`` (one per Spark input partition, filled one after the other, each closed
by its marker), and the endpoint's registry partition ``r~<endpoint>`` has a row per run key:

* ``open`` - staging or staged (``closed`` once every chunk is); a re-run reads the same rows;
* ``committed`` - ``commit`` began: the read counts, whatever happens next. Its rows are being
  settled (tokens consumed, claim-check blobs and queue messages deleted), then deleted;
* ``done`` - committed and settled; a read with that run key is refused (``ReadClosed``);
* ``abandoned`` - a later read gave it up (it was never committed); refused likewise.

Before it takes anything, a read finishes every ``committed`` read of its endpoint (a commit
that stopped half-way would otherwise leave live tokens whose copies it would take again) and
abandons every ``open`` one: marks it, makes its queue messages visible again at once and
deletes its rows. Only one read runs at an endpoint at a time (docs/spark.md), so "the other
reads" are finished or failed ones. ``forget`` drops a run key's row (and gives up an open
read), so the run key can be used again.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field, replace

from bus.errors import BusError, Conflict, Contention, NotFound, PreconditionFailed
from bus.integrations.spark.reader import Drainer
from bus.integrations.spark.staging import MARKER, Staging
from bus.storage import Entity

log = logging.getLogger("bus.spark")

OPEN, COMMITTED, DONE, ABANDONED = "open", "committed", "done", "abandoned"


class ReadClosed(BusError, ValueError):
    """A batch read's run key was committed, or given up by a later read: it cannot be read
    again (``forget_read`` frees it)."""


@dataclass(frozen=True)
class ReadState:
    run_key: str
    state: str
    chunks: int = 0
    closed: bool = False
    chunk_rows: int = 0
    """The size of a chunk (the last may hold fewer)."""
    rows: int = 0
    """How many messages it holds, once closed."""
    etag: str = field(default="", compare=False)
    """The registry row's ETag: every change is a compare-and-swap, so a delayed write (a
    request that lands late) cannot set an older state again."""


def registry_key(endpoint: str) -> str:
    return f"r~{endpoint}"


def chunk_key(endpoint: str, run_key: str, chunk: int) -> str:
    return f"r~{endpoint}~{run_key}~{chunk}"


class BatchRead:
    """The batch reads of one endpoint (driver side)."""

    def __init__(self, drainer: Drainer, staging: Staging) -> None:
        self._drainer = drainer
        self._staging = staging
        self.endpoint = drainer.endpoint
        self._parts = drainer.bus.parts

    # -- reading ------------------------------------------------------------------------------
    def read(self, run_key: str, max_messages: int, partitions: int = 1) -> list[str]:
        """Stage (or find staged) the read ``run_key`` and return its chunk keys."""
        found = self.state(run_key)
        if found is not None and found.state == COMMITTED:
            found = self._finish(found)
        if found is not None and found.state in (DONE, ABANDONED):
            verb = "committed" if found.state == DONE else "given up by a later read"
            raise ReadClosed(f"the batch read {run_key!r} of {self.endpoint!r} was {verb}: "
                             "read with a new run key (or bus.spark.forget_read it first)")
        if found is None or not found.closed:
            self._tidy(run_key)
            if found is None:
                found = self._save(ReadState(run_key, OPEN))
            found = self._stage(found, max_messages, partitions)
        return [chunk_key(self.endpoint, run_key, n) for n in range(found.chunks)]

    def _stage(self, read: ReadState, max_messages: int, partitions: int) -> ReadState:
        if read.chunks == 0:  # chunks of a size that gives ``partitions`` of them, as it looks
            depth = self._staging.retried(self._parts.storage.queues.depth,
                                          self._parts.names.queue(self.endpoint))
            per = max(1, math.ceil(min(max_messages, max(depth, 1)) / partitions))
            read = replace(read, chunk_rows=per)
        total, seen = 0, set[str]()  # what the chunks before the last hold (after a crash)
        for n in range(read.chunks - 1):
            rows = self._staging.rows(chunk_key(self.endpoint, read.run_key, n))
            total += len(rows) - 1
            seen.update(row_key for row_key, _ in rows if row_key != MARKER)
        settle = not self._parts.safeguards.settle_reads_on_commit  # off: a simulation break
        n = max(read.chunks - 1, 0)  # a read a crash interrupted goes on in its last chunk
        while total < max_messages:
            fresh = n >= read.chunks
            if fresh:  # the registry knows a chunk before it holds anything
                read = self._save(replace(read, chunks=n + 1))
            asked = min(read.chunk_rows, max_messages - total)
            count = self._drainer.stage(chunk_key(self.endpoint, read.run_key, n), asked,
                                        close_empty=n == 0, fresh=fresh, settle=settle,
                                        seen=seen, most=max_messages - total)
            if count is None:  # nothing came: the chunk holds nothing, it is not one
                read = replace(read, chunks=n)
                break
            total += count
            if count < asked:
                break
            n += 1
        return self._save(replace(read, closed=True, rows=total))

    def _tidy(self, run_key: str) -> None:
        """Finish the committed reads of the endpoint and give up its open ones."""
        for other in self.states():
            if other.run_key == run_key:
                continue
            if other.state == COMMITTED and self._parts.safeguards.finish_commits:
                self._finish(other)
            elif other.state == OPEN and self._parts.safeguards.abandon_failed_reads:
                log.warning("the batch read %r of %s was never committed: its messages are "
                            "read again", other.run_key, self.endpoint)
                self._give_up(other)

    # -- committing ---------------------------------------------------------------------------
    def commit(self, run_key: str) -> int:
        """The results of the read ``run_key`` are stored: settle its messages. Returns how
        many; 0 for a run key that was never read. Calling it again is harmless."""
        found = self.state(run_key)
        if found is None:
            return 0
        if found.state == ABANDONED:
            raise ReadClosed(f"the batch read {run_key!r} of {self.endpoint!r} was given up by "
                             "a later read, which reads its messages again: its results "
                             "must be dropped")
        if found.state == OPEN and not found.closed:
            raise ReadClosed(f"the batch read {run_key!r} of {self.endpoint!r} never finished "
                             "staging: nothing of it can have been stored")
        if found.state == OPEN:
            found = self._save(replace(found, state=COMMITTED))  # from here on it counts
        if found.state == COMMITTED:
            found = self._finish(found)
        return found.rows

    def _finish(self, read: ReadState) -> ReadState:
        """Settle a committed read's rows, delete them, and mark it done."""
        for n in range(read.chunks):
            key = chunk_key(self.endpoint, read.run_key, n)
            rows = [values for row_key, values in self._staging.rows(key) if row_key != MARKER]
            self._drainer.settle_rows(rows)
        for n in range(read.chunks):
            self._staging.delete_partition(chunk_key(self.endpoint, read.run_key, n))
        return self._save(replace(read, state=DONE, chunks=0))

    # -- giving up ----------------------------------------------------------------------------
    def forget(self, run_key: str) -> int:
        """Drop the run key: an open read is given up (its messages are read again by the next
        read), a committed one finished first. Returns how many rows it had staged."""
        found = self.state(run_key)
        if found is None:
            return 0
        if found.state == COMMITTED:
            found = self._finish(found)
        elif found.state == OPEN:
            found = self._give_up(found)
        with contextlib.suppress(NotFound):  # (a delete that landed, answered late)
            self._staging.retried(self._staging.tables.delete, self._staging.table,
                                  registry_key(self.endpoint), run_key, etag=found.etag)
        return found.rows

    def _give_up(self, read: ReadState) -> ReadState:
        read = self._save(replace(read, state=ABANDONED))
        for n in range(read.chunks):
            key = chunk_key(self.endpoint, read.run_key, n)
            rows = [values for row_key, values in self._staging.rows(key) if row_key != MARKER]
            self._drainer.release_rows(rows)
            self._staging.delete_partition(key)
        return self._save(replace(read, chunks=0))

    # -- the registry -------------------------------------------------------------------------
    def state(self, run_key: str) -> ReadState | None:
        try:
            entity = self._staging.retried(self._staging.tables.get, self._staging.table,
                                           registry_key(self.endpoint), run_key)
        except NotFound:
            return None
        return _state(entity)

    def states(self) -> list[ReadState]:
        return [_state(entity) for entity in self._staging.retried(
            self._staging.tables.query, self._staging.table, registry_key(self.endpoint))]

    def _save(self, read: ReadState) -> ReadState:
        """Write ``read`` over the row it was read as (its ETag; none: a new row)."""
        entity = Entity(registry_key(self.endpoint), read.run_key, {
            "state": read.state, "chunks": read.chunks, "closed": read.closed,
            "chunk_rows": read.chunk_rows, "rows": read.rows, "at": self._parts.clock()})
        tables, table = self._staging.tables, self._staging.table
        try:
            if read.etag:
                etag = self._staging.retried(tables.replace, table, entity, etag=read.etag)
            else:
                etag = self._staging.retried(tables.insert, table, entity)
        except (PreconditionFailed, Conflict):
            now = self.state(read.run_key)  # a write of unknown outcome: did it land?
            if now != read:
                raise Contention(f"the batch read {read.run_key!r} of {self.endpoint!r} "
                                 "changed meanwhile: is another read running?") from None
            return now
        return replace(read, etag=etag)


def _state(entity: Entity) -> ReadState:
    values = entity.properties

    def number(name: str) -> int:
        return int(str(values.get(name) or 0))

    return ReadState(entity.row_key, str(values["state"]), number("chunks"),
                     bool(values.get("closed")), number("chunk_rows"), number("rows"),
                     entity.etag)


def sweep_reads(staging: Staging) -> int:
    """Delete the chunks of batch reads that are done, given up or forgotten (a staging write
    that landed late, after the read deleted its rows). A table scan; returns how many
    partitions it deleted."""
    states: dict[str, str] = {}
    chunks: set[str] = set()
    for entity in staging.retried(staging.tables.query, staging.table):
        key = entity.partition_key
        if key.startswith("r~") and key.count("~") == 1:
            states[f"{key}~{entity.row_key}"] = str(entity.properties.get("state"))
        elif key.startswith("r~") and key.count("~") == 3:
            chunks.add(key)
    old = sorted(key for key in chunks
                 if states.get(key.rpartition("~")[0], DONE) in (DONE, ABANDONED))
    for key in old:
        staging.delete_partition(key)
    return len(old)
