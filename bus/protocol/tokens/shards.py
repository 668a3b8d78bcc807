"""Token shards: an endpoint's inbox tokens spread over several table partitions.

Azure serves a table partition at about 2,000 entities per second, and a message draws about
four entities on its token's partition (created, read, consumed; a handler's copies are created
pending and confirmed), so with every token of an endpoint in one partition the endpoint could
not pass about 500 messages per second however far its compute scales. So the tokens live in
up to ``SHARDS`` partitions: shard 0 is the endpoint's own name (where every token lived before
shards, and where all of them live with one shard), shard ``k`` the partition ``<endpoint>~<k>``
(endpoint names never contain ``~``).

An attempt id names its token's shard: ``<id>_<k>`` for shard ``k`` (one digit, 1-7), no
suffix for shard 0. Whoever holds an attempt id - a receiver with a signal, a helper with an
outbox record, the sweeper with a payload's name - knows the token's partition without a look-up,
and ids made before shards existed name shard 0. An attempt id from outside with a suffix names
a partition like any other; no token is there unless a sender made it.

Which shard a new id names (``ShardedIds``): a process stays in one shard for a run of ids
(``run``), then moves to the next of ``shards``, starting from a shard its first id picks. A
batch - a send group's flush, a record's copies to one endpoint - so almost always lies in one
partition and stays one transaction (the inbox splits the rare one that does not), while many
processes, each starting elsewhere, spread evenly. The number of shards may change at any time:
each id keeps naming the shard it was made for.

Two kinds of rows are found by message id, not attempt id: send marks (``bus.protocol.send.
marked``) stay in shard 0 with their tokens, so that a mark is found whatever the settings were
when it was made; a deferral's index row lies beside its token (one transaction), so finding a
deferred message reads the index of every shard.
"""

from __future__ import annotations

import re
import threading
import zlib

from bus.ids import IdFactory
from bus.settings import MAX_TOKEN_SHARDS

SHARDS = MAX_TOKEN_SHARDS
"""The most shards an endpoint's tokens use (``Settings.token_shards`` is at most this)."""

_SUFFIX = re.compile(r"_([1-7])\Z")
_PARTITION = re.compile(r"~([1-7])\Z")


def shard_of(attempt_id: str) -> int:
    """The shard an attempt id names (0 when it names none)."""
    found = _SUFFIX.search(attempt_id)
    return int(found.group(1)) if found else 0


def in_shard(attempt_id: str, shard: int) -> str:
    """``attempt_id`` (a fresh id naming no shard) made to name ``shard``."""
    if not 0 <= shard < SHARDS:
        raise ValueError(f"shard {shard} is not one of 0-{SHARDS - 1}")
    return f"{attempt_id}_{shard}" if shard else attempt_id


def widest(attempt_id: str) -> str:
    """The longest an attempt id made by the same factory may be: the same id naming a shard
    (what an outbox record reserves room for: a helper's fresh ids may name any shard)."""
    plain = attempt_id[:-2] if shard_of(attempt_id) else attempt_id
    return in_shard(plain, SHARDS - 1)


def shard_partition(endpoint: str, shard: int) -> str:
    """The token partition of ``endpoint``'s shard ``shard``."""
    return f"{endpoint}~{shard}" if shard else endpoint


def partition(endpoint: str, attempt_id: str) -> str:
    """The partition of the token of ``attempt_id`` at ``endpoint``."""
    return shard_partition(endpoint, shard_of(attempt_id))


def endpoint_of(partition_key: str) -> str:
    """The endpoint whose token partition ``partition_key`` is."""
    found = _PARTITION.search(partition_key)
    return partition_key[:found.start()] if found else partition_key


def partitions(endpoint: str) -> list[str]:
    """Every partition that may hold ``endpoint``'s tokens, shard 0 first."""
    return [shard_partition(endpoint, shard) for shard in range(SHARDS)]


class ShardedIds:
    """Attempt ids over ``shards`` shards, ``run`` ids in a row in each (module doc).
    Thread-safe; ``new_id`` makes the ids themselves (random in production)."""

    def __init__(self, new_id: IdFactory, shards: int, run: int = 100) -> None:
        if not 1 <= shards <= SHARDS:
            raise ValueError(f"token shards must be 1-{SHARDS}, not {shards}")
        self._new_id = new_id
        self._shards = shards
        self._run = max(1, run)
        self._lock = threading.Lock()
        self._made = 0
        self._start: int | None = None

    def __call__(self) -> str:
        fresh = self._new_id()
        if self._shards == 1:
            return fresh
        with self._lock:
            if self._start is None:  # from the first id: random in production, replayable in tests
                self._start = zlib.crc32(fresh.encode()) % self._shards
            shard = (self._start + self._made // self._run) % self._shards
            self._made += 1
        return in_shard(fresh, shard)
