"""Heartbeats: which processes serve which endpoints, and when each was last seen.

Every process that hosts endpoints - a Functions app's instance, a polling worker, a Spark
stream reading a reader endpoint - writes one row of the bus's instances table every
``Settings.heartbeat_seconds``: an upsert of its own row, so processes never contend and each
costs one request an interval, however many endpoints it serves:

* partition ``instance``, row key the instance id (random, one per process and bus);
* ``kind`` (``functions``, ``worker``, ``spark``), ``host`` (the Functions instance's
  ``WEBSITE_INSTANCE_ID`` on Azure, else the machine's name), ``pid``, ``version`` (of this
  package), ``endpoints`` (a JSON list), ``started_at``, ``last_seen`` (epoch seconds, the
  writer's clock), ``every`` (its interval) and ``stopped`` (a process that stops cleanly
  writes its row once more, stopped).

A reader (``Instance.live``) calls an instance live while it has not stopped and its
last beat is at most ``LIVE_INTERVALS`` intervals old: a process killed right after a beat is
shown without it 1.5 intervals later, one killed just before its next beat half an interval
later - always within two. A beat that fails (storage away) is tried again after a third of
the interval, so one failed write does not make a live process look dead. Maintenance removes
rows last seen more than ``FORGET_SECONDS`` ago.

``instances`` reads the rows back; ``Bus.instances`` and ``Bus.health`` (which adds each
endpoint's queue lengths and flags one **unserved**: messages wait and no live instance serves
it) are how the command line (``python -m bus status``), the dashboard and the alerts
(``bus.hosting.alerts``) read them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from bus.storage import Entity, NotFound, PreconditionFailed, StorageError, Tables

log = logging.getLogger(__name__)

PARTITION = "instance"
LIVE_INTERVALS = 1.5
"""An instance is live while its last beat is at most this many of its intervals old."""
FORGET_SECONDS = 24 * 3600.0
"""Maintenance removes an instance's row once it was last seen this long ago."""
STOP_WAIT_SECONDS = 30.0
"""How long the last loop to stop waits for the stopped row to be written."""
Kind = Literal["functions", "worker", "spark"]


def host_name() -> str:
    """The Functions instance on Azure (``WEBSITE_INSTANCE_ID``, which Azure sets per
    instance), the machine elsewhere."""
    return os.environ.get("WEBSITE_INSTANCE_ID", "").strip() or socket.gethostname()


@functools.cache  # read once: a beat every few seconds need not look it up each time
def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("eobus")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "0"


class Heartbeat:
    """This process's row in the instances table, written every ``every`` seconds on a
    daemon thread while it serves at least one endpoint."""

    def __init__(self, tables: Tables, table: str, kind: Kind, every: float,
                 clock: Callable[[], float], *, instance: str | None = None) -> None:
        self.tables, self.table, self.kind, self.every = tables, table, kind, every
        self.clock = clock
        self.instance = instance or uuid.uuid4().hex[:16]
        self.started_at = clock()
        self._endpoints: dict[str, int] = {}  # endpoint -> how many loops serve it here
        self._served: list[str] = []  # the last endpoints served: a stopped row names them
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def endpoints(self) -> list[str]:
        with self._lock:
            return sorted(self._endpoints)

    def serve(self, endpoints: Iterable[str]) -> None:
        """Say this process serves ``endpoints`` from now on (for good: a Functions app)."""
        with self._lock:
            for name in endpoints:
                self._endpoints[name] = self._endpoints.get(name, 0) + 1
            if self._endpoints:
                self._served = sorted(self._endpoints)
            start = self._thread is None and bool(self._endpoints)
            if start:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"bus-heartbeat-{self.instance}")
        if start:
            assert self._thread is not None
            self._thread.start()
        else:
            self._wake.set()  # the endpoints changed: say so now

    @contextmanager
    def serving(self, endpoint: str) -> Iterator[None]:
        """Serve ``endpoint`` while the block runs (a polling worker's loop); the last one to
        end writes the row stopped."""
        self.serve([endpoint])
        try:
            yield
        finally:
            with self._lock:
                left = self._endpoints.get(endpoint, 1) - 1
                if left:
                    self._endpoints[endpoint] = left
                else:
                    self._endpoints.pop(endpoint, None)
                thread = self._thread if not self._endpoints else None
            self._wake.set()
            if thread is not None:  # the last one: the stopped row is written when this ends
                thread.join(timeout=STOP_WAIT_SECONDS)

    def stop(self) -> None:
        """Serve nothing any more: the row is written stopped (a process shutting down)."""
        with self._lock:
            self._endpoints.clear()
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=STOP_WAIT_SECONDS)

    def beat(self, *, stopped: bool = False) -> bool:
        """Write the row now; False when storage refused (logged). A stopped row names the
        endpoints served last."""
        with self._lock:
            endpoints = sorted(self._endpoints) or self._served
        try:
            self.tables.replace(self.table, Entity(PARTITION, self.instance, {
                "kind": self.kind, "host": host_name(), "pid": os.getpid(),
                "version": package_version(), "endpoints": json.dumps(endpoints),
                "started_at": self.started_at, "last_seen": self.clock(),
                "every": self.every, "stopped": stopped}))
        except StorageError as exc:
            log.warning("could not write the heartbeat of %s: %s", self.instance, exc)
            return False
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                done = not self._endpoints
            if done:
                break
            wrote = self.beat()
            self._wake.wait(self.every if wrote else self.every / 3)
            self._wake.clear()
        self.beat(stopped=True)
        with self._lock:
            self._thread = None
            restart = bool(self._endpoints)  # served again while the last beat went out
        if restart:
            self.serve([])


def forget(tables: Tables, table: str, now: float) -> int:
    """Remove the rows of instances last seen more than ``FORGET_SECONDS`` ago; how many."""
    removed = 0
    for row in tables.query(table, PARTITION):
        seen = row.properties.get("last_seen")
        if isinstance(seen, (int, float)) and now - seen > FORGET_SECONDS:
            try:  # by its ETag: a process that beat again meanwhile keeps its row
                tables.delete(table, PARTITION, row.row_key, etag=row.etag or None)
            except (NotFound, PreconditionFailed):
                continue
            removed += 1
    return removed


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


def instances(tables: Tables, table: str) -> list[Instance]:
    """Every instance with a row (live or not), most recently seen first: one query."""
    found = [instance for row in tables.query(table, PARTITION)
             if (instance := _instance(row)) is not None]
    return sorted(found, key=lambda i: (-i.last_seen, i.id))


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
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
