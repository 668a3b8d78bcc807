"""The receiver's memory of the slots it committed: a claim without the read, when it is safe.

A worker that commits a partition's slot knows what the slot and the rows it wrote look like
right after the commit: the slot's new ETag is the transaction's answer, and the rows are
the ones it read with the claim plus the ones it wrote. When the next message of that
partition reaches the same process, the claim can start from that memory instead of reading
the slot again (one table request per message fewer).

Why this is as safe as reading: every write to a state partition is a transaction that
includes the slot with its ETag (``Outbox.commit``, ``touch``, ``update``), so while the slot's
ETag is unchanged no row of the partition changed either. The commit is conditional on the
remembered ETag exactly as on a freshly read one: if anyone wrote since (another worker or
process, the sweeper fencing the slot, a helper finishing a record), the commit fails with
ClaimLost and the message goes the one-message way, which reads the slot afresh. The token
check still reads the inbox after the (remembered) slot, so R3 still precedes R4.

What it costs when it is wrong: a stale entry means a handler run, its pending tokens and a
failed commit for nothing. When several processes share a partition's messages (a scaled-out
Function app) that can happen more often than a hit saves, so the cache watches itself: after
every ``WINDOW`` remembered claims it checks how many were stale and, above
``MAX_STALE_SHARE``, stays off for the next ``REST`` claims. Only rows whose values come back
from Table Storage exactly as written (str, int, float, bool) are remembered; a row with other
values is read again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from bus.protocol.outbox.slot import Slot
from bus.storage import EntityValue, TableOp

WINDOW = 64
"""Remembered claims between two checks of the stale share."""
MAX_STALE_SHARE = 0.2
"""Above this share of stale claims in a window, the cache rests."""
REST = 1024
"""Claims made by reading while the cache rests."""

_EXACT = (str, int, float, bool)


class SlotCache:
    """The slots an endpoint's receiver committed in this process, by partition (at most
    ``capacity``, least recently used first out). Thread-safe: a process's workers share it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slots: OrderedDict[str, Slot] = OrderedDict()
        self._lock = threading.Lock()
        self._used = 0
        self._stale = 0
        self._resting = 0
        self.hits = 0
        self.stale = 0

    def lookup(self, partition: str, rows: Sequence[str]) -> Slot | None:
        """The remembered slot of ``partition`` if it knows every one of ``rows`` (those a
        claim reads: ``Outbox.claimed_rows``)."""
        if self.capacity <= 0:
            return None
        with self._lock:
            if self._resting > 0:
                self._resting -= 1
                return None
            slot = self._slots.get(partition)
            if slot is None or any(key not in slot.rows for key in rows):
                return None
            self._slots.move_to_end(partition)
            self._used += 1
            self.hits += 1
            self._review()
            return replace(slot, cached=True)

    def remember(self, committed: Slot, claimed: Slot, operations: Sequence[TableOp]) -> None:
        """``committed`` (the commit's answer) with the rows of ``claimed`` as changed by
        ``operations``: the partition as it is while the slot keeps its ETag."""
        if self.capacity <= 0 or committed.etag is None:
            return
        rows: dict[str, Mapping[str, EntityValue] | None] = dict(claimed.rows)
        for op in operations:
            key = op.entity.row_key
            if op.kind == "delete":
                rows[key] = None
            elif all(isinstance(v, _EXACT) for v in op.entity.properties.values()):
                rows[key] = dict(op.entity.properties)
            else:
                rows.pop(key, None)  # read it again next time
        with self._lock:
            self._slots[committed.partition] = replace(committed, rows=rows, cached=False)
            self._slots.move_to_end(committed.partition)
            while len(self._slots) > self.capacity:
                self._slots.popitem(last=False)

    def forget(self, partition: str) -> None:
        """Drop ``partition``'s slot (about to change, or changed in a way not remembered)."""
        with self._lock:
            self._slots.pop(partition, None)

    def lost(self, slot: Slot) -> None:
        """A claim of ``slot`` lost its compare-and-swap: forget the partition, and count it
        against the cache if the claim started from memory."""
        with self._lock:
            self._slots.pop(slot.partition, None)
            if not slot.cached:
                return
            self._stale += 1
            self.stale += 1
            self._review()

    def _review(self) -> None:
        """Every WINDOW remembered claims: rest if too many of them were stale (lock held)."""
        if self._used < WINDOW:
            return
        if self._stale > MAX_STALE_SHARE * self._used:
            self._resting = REST
            self._slots.clear()
        self._used = self._stale = 0
