"""The driver side of a streaming read: micro-batches staged before Spark plans them.

A Storage queue cannot seek back, but Spark replays a micro-batch after a failure from its
checkpointed offsets. So the offsets are batch numbers (``{"batch": n}``) and batch ``n`` is a
staged partition of the staging table: asked for the latest offset after ``n``, the reader takes
messages into batch ``n + 1`` (staged, then settled: see ``reader``) and answers ``n + 1``;
reading a batch only reads its staged rows, so a replay reads the same messages. Spark's
``commit(end)`` (it comes late: while the next batch is planned) deletes batches up to ``end``.

After a crash the reader finds batch ``n + 1`` already staged (closed, or left open and then
finished) and answers it instead of taking new messages. The cursor row
(``s~<consumer>`` / ``cursor``) remembers the endpoint, the last staged and the last committed
batch: a query started on a fresh checkpoint begins after the last committed batch.

One answer may stage several batches: a micro-batch ``(start, end]`` reads batches
``start + 1 .. end``, each an input partition (``partitions``: the micro-batch is split into
that many batches, as far as the queue's depth tells). How much one answer takes is Spark's
read limit, in rows: at most ``max_rows``, or (``None``) what the queue holds when it is asked -
its approximate depth in queue messages times the rows a message has held so far (a bundle
holds up to 32 signals: ``Drainer.rows_per_message``), learnt as it takes, so a queue that
never empties still gives an answer and a bundled backlog is read whole. Under
``Trigger.AvailableNow`` (``prepare_available_now``) the answers stop once as many queue
messages have been consumed - deleted, every row of each taken - as the queue held at the
start, or when it is empty: then the latest offset is the start offset and Spark ends the
run. (A bundle a micro-batch's end splits comes back for the next one, and counts once.)

Spark 4.0 and 4.1 ask for the latest offset without the start offset (and without a limit):
then the answer follows the last one this reader gave, or the last staged or committed batch
for the first one (a batch staged that Spark never planned is read with the next one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from bus.errors import Conflict, Contention, NotFound, PreconditionFailed
from bus.integrations.spark.options import OptionError
from bus.integrations.spark.reader import Drainer
from bus.integrations.spark.staging import MARKER, Staging
from bus.storage import Entity

_CURSOR = "cursor"
DEFAULT = -1
"""``latest_offset``'s limit when Spark gives none (4.0, 4.1): the consumer's own."""


class StreamConsumer:
    """Offsets and batches of one streaming consumer (one query; not shared)."""

    def __init__(self, drainer: Drainer, staging: Staging, consumer: str, *,
                 max_rows: int | None = None, partitions: int = 1, poll_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._drainer = drainer
        self._staging = staging
        self.consumer = consumer
        self.max_rows = max_rows
        """At most this many messages per micro-batch; None: what the queue holds."""
        self.partitions = partitions
        self._poll = poll_seconds
        self._clock = clock
        self._sleep = sleep
        self._etag = ""
        self._cursor = self._load_cursor()
        self._returned: int | None = None  # the highest offset answered by this process
        self._absent: int | None = None  # a batch known not to be staged
        self._idle_at: float | None = None  # when a take last found nothing
        self._until: int | None = None  # Trigger.AvailableNow: consumed messages to stop at

    def batch_key(self, batch: int) -> str:
        return f"s~{self.consumer}~{batch:09d}"

    # -- Spark's calls ---------------------------------------------------------------------------
    def initial_offset(self) -> dict[str, int]:
        return {"batch": self._cursor["committed"]}

    def prepare_available_now(self) -> None:
        """``Trigger.AvailableNow`` begins: read what the queue holds now, then stop."""
        self._until = self._drainer.consumed + self._depth()

    def latest_offset(self, start: Mapping[str, Any] | None = None,
                      limit: int | None = DEFAULT) -> dict[str, int]:
        """The offset after ``start``: batches staged before (a crash, a restart) and newly
        staged ones, together at most ``limit`` messages (None: what the queue holds;
        ``DEFAULT``: ``max_rows``), or ``start`` itself when there is nothing to read."""
        if start is not None:
            current = int(start["batch"])
        elif self._returned is not None:
            current = self._returned
        else:
            current = max(self._cursor["staged"], self._cursor["committed"])
        cap = self.max_rows if limit == DEFAULT else limit
        end, rows = current, 0
        while end < self._cursor["staged"]:  # staged before: answered first, whatever else
            size = self._size(end + 1)
            if rows and cap is not None and rows + size > cap:
                break
            end, rows = end + 1, rows + size
        left = None if self._until is None else self._until - self._drainer.consumed
        if (cap is None or rows < cap) and (left is None or left > 0):
            end = self._take(end, rows, cap, left)
        self._returned = max(end, self._returned or 0)
        return {"batch": end}

    def batch_keys(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> list[str]:
        return [self.batch_key(n) for n in range(int(start["batch"]) + 1, int(end["batch"]) + 1)]

    def splits(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> list[list[str]]:
        """The batches of ``(start, end]`` as at most ``partitions`` input partitions."""
        return split(self.batch_keys(start, end), self.partitions)

    def commit(self, end: Mapping[str, Any]) -> None:
        """Spark has processed every batch up to ``end``: delete them (then the cursor, so a
        crash in between only repeats the deletes)."""
        last = int(end["batch"])
        for batch in range(self._cursor["committed"] + 1, last + 1):
            self._staging.delete_partition(self.batch_key(batch))
        if last > self._cursor["committed"]:
            self._cursor["committed"] = last
            self._save_cursor()

    # -- taking ---------------------------------------------------------------------------------
    def _take(self, end: int, rows: int, cap: int | None, left: int | None) -> int:
        """Stage new batches after ``end`` (holding ``rows`` already); the last one staged.
        ``left``: under AvailableNow, the queue messages of the backlog not consumed yet."""
        room = None if cap is None else cap - rows
        depth = self._depth() if room is None or self.partitions > 1 or left is not None else None
        self._throttle()
        taken = 0
        while taken < (bound := self._bound(room, depth, left)):
            # In rows, from the depth in messages: learnt again after each batch taken.
            held = math.ceil((depth or 0) * self._drainer.rows_per_message)
            expected = bound if depth is None else max(min(bound, held), 1)
            per = max(1, math.ceil(expected / self.partitions))
            batch = end + 1
            asked = min(per, bound - taken)
            count = self._drainer.stage(self.batch_key(batch), asked, close_empty=False,
                                        fresh=self._absent == batch)
            if count is None:
                self._absent, self._idle_at = batch, self._clock()
                break
            self._idle_at = None
            self._absent = batch + 1  # only this reader stages this consumer's batches
            if batch > self._cursor["staged"]:
                self._cursor["staged"] = batch
                self._save_cursor()
            end, taken = batch, taken + count
            if count < asked:
                break
            if self._until is not None and self._drainer.consumed >= self._until:
                break
        return end

    def _bound(self, room: int | None, depth: int | None, left: int | None) -> int:
        """Rows one answer may take: the read limit's ``room``, or (none) the rows the queue's
        ``depth`` holds; under AvailableNow no more than the rows ``left`` of the backlog hold
        (the depth is approximate, and the rows per message an average: at least one)."""
        per_message = self._drainer.rows_per_message
        bound = room if room is not None else max(math.ceil((depth or 0) * per_message), 1)
        if left is not None:
            bound = min(bound, max(math.ceil(left * per_message), 1))
        return bound

    def _size(self, batch: int) -> int:
        marker = self._staging.get(self.batch_key(batch), MARKER)
        return int(str(marker["rows"])) if marker else 0

    def _depth(self) -> int:
        return self._staging.retried(self._drainer.bus.storage.queues.depth, self._drainer.queue)

    # -- helpers ------------------------------------------------------------------------------
    def _throttle(self) -> None:
        """Between two empty takes wait ``poll_seconds``: Spark asks again at once."""
        if self._idle_at is not None:
            wait = self._idle_at + self._poll - self._clock()
            if wait > 0:
                self._sleep(wait)

    def _load_cursor(self) -> dict[str, int]:
        try:
            entity = self._staging.retried(self._staging.tables.get, self._staging.table,
                                           f"s~{self.consumer}", _CURSOR)
        except NotFound:
            self._etag = ""
            return {"staged": 0, "committed": 0}
        values = entity.properties
        endpoint = self._drainer.endpoint
        if values.get("endpoint") != endpoint:
            raise OptionError(f"consumer {self.consumer!r} reads endpoint "
                              f"{values.get('endpoint')!r}, not {endpoint!r}: a consumer name "
                              "belongs to one query")
        self._etag = entity.etag
        return {"staged": int(str(values["staged"])), "committed": int(str(values["committed"]))}

    def _save_cursor(self) -> None:
        """Write the cursor over the one it was read as (compare-and-swap), so a write that
        lands late cannot move it back; if it changed meanwhile (such a write of ours, or of
        an earlier reader of this consumer), both are merged: each number only grows."""
        for _ in range(10):
            entity = Entity(f"s~{self.consumer}", _CURSOR, {
                "endpoint": self._drainer.endpoint, **self._cursor})
            tables, table = self._staging.tables, self._staging.table
            try:
                if self._etag:
                    self._etag = self._staging.retried(tables.replace, table, entity,
                                                       etag=self._etag)
                else:
                    self._etag = self._staging.retried(tables.insert, table, entity)
                return
            except (PreconditionFailed, Conflict):
                wanted = dict(self._cursor)
                found = self._load_cursor()
                self._cursor = {name: max(wanted[name], found[name]) for name in wanted}
                if self._cursor == found:
                    return
        raise Contention(f"the cursor of consumer {self.consumer!r} keeps changing: is "
                         "another query running with that consumer name?")

def split(keys: list[str], parts: int) -> list[list[str]]:
    """``keys`` in at most ``parts`` runs of consecutive keys, as even as can be."""
    if not keys:
        return []
    parts = min(parts, len(keys))
    size, extra = divmod(len(keys), parts)
    found, at = [], 0
    for index in range(parts):
        step = size + (index < extra)
        found.append(keys[at:at + step])
        at += step
    return found
