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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from bus.integrations.spark.options import OptionError
from bus.integrations.spark.reader import Drainer
from bus.integrations.spark.staging import StagedRow, Staging

_CURSOR = "cursor"


class StreamConsumer:
    """Offsets and batches of one streaming consumer (one query; not shared)."""

    def __init__(self, drainer: Drainer, staging: Staging, consumer: str, *, batch_size: int,
                 poll_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._drainer = drainer
        self._staging = staging
        self.consumer = consumer
        self._batch_size = batch_size
        self._poll = poll_seconds
        self._clock = clock
        self._sleep = sleep
        self._cursor = self._load_cursor()
        self._returned: int | None = None  # the highest offset answered by this process
        self._absent: int | None = None  # a batch known not to be staged
        self._idle_at: float | None = None  # when a take last found nothing

    def batch_key(self, batch: int) -> str:
        return f"s~{self.consumer}~{batch:09d}"

    # -- Spark's calls ---------------------------------------------------------------------------
    def initial_offset(self) -> dict[str, int]:
        return {"batch": self._cursor["committed"]}

    def latest_offset(self, start: Mapping[str, Any] | None = None) -> dict[str, int]:
        """The offset after ``start``: a newly staged batch, a batch staged before a crash, or
        ``start`` itself when there is nothing to read. Spark 4.0/4.1 do not pass ``start``;
        then the first call answers the last staged batch (Spark treats it as new data or as
        nothing new) and later calls continue from the last answer."""
        if start is None:
            if self._returned is None:
                self._returned = max(self._cursor["staged"], self._cursor["committed"])
                return {"batch": self._returned}
            current = self._returned
        else:
            current = int(start["batch"])
        batch = current + 1
        self._throttle()
        count = self._drainer.stage(self.batch_key(batch), self._batch_size, close_empty=False,
                                    fresh=self._absent == batch)
        if count is None:
            self._absent, self._idle_at = batch, self._clock()
            return {"batch": current}
        self._idle_at = None
        self._absent = batch + 1  # only this reader stages this consumer's batches
        if batch > self._cursor["staged"]:
            self._cursor["staged"] = batch
            self._save_cursor()
        self._returned = batch
        return {"batch": batch}

    def batch_keys(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> list[str]:
        return [self.batch_key(n) for n in range(int(start["batch"]) + 1, int(end["batch"]) + 1)]

    def commit(self, end: Mapping[str, Any]) -> None:
        """Spark has processed every batch up to ``end``: delete them (then the cursor, so a
        crash in between only repeats the deletes)."""
        last = int(end["batch"])
        for batch in range(self._cursor["committed"] + 1, last + 1):
            self._staging.delete_partition(self.batch_key(batch))
        if last > self._cursor["committed"]:
            self._cursor["committed"] = last
            self._save_cursor()

    # -- helpers ------------------------------------------------------------------------------
    def _throttle(self) -> None:
        """Between two empty takes wait ``poll_seconds``: Spark asks again at once."""
        if self._idle_at is not None:
            wait = self._idle_at + self._poll - self._clock()
            if wait > 0:
                self._sleep(wait)

    def _load_cursor(self) -> dict[str, int]:
        values = self._staging.get(f"s~{self.consumer}", _CURSOR)
        endpoint = self._drainer.endpoint
        if values is None:
            return {"staged": 0, "committed": 0}
        if values.get("endpoint") != endpoint:
            raise OptionError(f"consumer {self.consumer!r} reads endpoint "
                              f"{values.get('endpoint')!r}, not {endpoint!r}: a consumer name "
                              "belongs to one query")
        return {"staged": int(str(values["staged"])), "committed": int(str(values["committed"]))}

    def _save_cursor(self) -> None:
        self._staging.upsert(f"s~{self.consumer}", StagedRow(_CURSOR, {
            "endpoint": self._drainer.endpoint, **self._cursor}))
