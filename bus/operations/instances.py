"""Is anything running? The processes serving each endpoint, from their heartbeats
(``bus.hosting.heartbeat``), beside what waits in its queues.

An endpoint is **unserved** when messages wait in its queue and no live instance serves it:
the first thing to look at in an incident (a crashed worker, a Functions app that is stopped
or cannot start, a Spark stream that ended).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from bus.hosting.heartbeat import LIVE_INTERVALS, PARTITION
from bus.parts import Parts
from bus.storage import Entity, StorageError


@dataclass(frozen=True)
class Instance:
    """One process that serves (or served) endpoints, as its last heartbeat says."""

    id: str
    kind: str
    """``functions``, ``worker`` or ``spark``."""
    host: str
    pid: int
    version: str
    endpoints: tuple[str, ...]
    started_at: float
    last_seen: float
    every: float
    """Its heartbeat interval (seconds)."""
    stopped: bool
    """It stopped cleanly (its last beat said so)."""

    def live(self, now: float) -> bool:
        """Not stopped, and its last beat at most ``LIVE_INTERVALS`` intervals old."""
        return not self.stopped and now - self.last_seen <= self.every * LIVE_INTERVALS


@dataclass(frozen=True)
class EndpointHealth:
    endpoint: str
    reader: bool
    """Served by Spark jobs (a reader endpoint), not by this app."""
    live: tuple[str, ...]
    """The ids of the live instances serving it."""
    depth: int | None
    """Messages in its queue (approximate, as Azure counts them); None: not readable."""
    poisoned: int | None
    """Entries in its poison queue; None: not readable."""

    @property
    def unserved(self) -> bool:
        """Messages wait and no live instance serves it."""
        return not self.live and bool(self.depth)


def instances(parts: Parts) -> list[Instance]:
    """Every instance with a row (live or not; maintenance forgets one a day after it was
    last seen), most recently seen first: one query."""
    rows = parts.observed.tables.query(parts.names.instances_table, PARTITION)
    found = [instance for row in rows if (instance := _instance(row)) is not None]
    return sorted(found, key=lambda i: (-i.last_seen, i.id))


def health(parts: Parts, now: float | None = None,
           known: list[Instance] | None = None) -> list[EndpointHealth]:
    """Per endpoint (the app's, then its readers'): its live instances at ``now``, its queue's
    and poison queue's depths (two requests an endpoint)."""
    now = parts.clock() if now is None else now
    known = instances(parts) if known is None else known
    names = [(name, False) for name in sorted(parts.topology.endpoints)]
    names += [(name, True) for name in sorted(parts.topology.readers)]
    found = []
    for name, reader in names:
        live = tuple(i.id for i in known if name in i.endpoints and i.live(now))
        found.append(EndpointHealth(name, reader, live, _depth(parts, parts.names.queue(name)),
                                    _depth(parts, parts.names.poison_queue(name))))
    return found


def _depth(parts: Parts, queue: str) -> int | None:
    try:
        return parts.observed.queues.depth(queue)
    except StorageError:
        return None


def _instance(row: Entity) -> Instance | None:
    """The row as an instance; None for a row that is not one (written by hand, or by a
    version that wrote other fields)."""
    p = row.properties
    try:
        endpoints = json.loads(str(p.get("endpoints", "[]")))
        return Instance(
            id=row.row_key, kind=str(p.get("kind", "")), host=str(p.get("host", "")),
            pid=int(p.get("pid", 0)),  # type: ignore[arg-type]
            version=str(p.get("version", "")),
            endpoints=tuple(str(name) for name in endpoints),
            started_at=float(p.get("started_at", 0.0)),  # type: ignore[arg-type]
            last_seen=float(p["last_seen"]),  # type: ignore[arg-type]
            every=float(p["every"]),  # type: ignore[arg-type]
            stopped=bool(p.get("stopped", False)))
    except (KeyError, TypeError, ValueError):
        return None
