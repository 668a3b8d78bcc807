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

A reader (``bus.operations.instances``) calls an instance live while it has not stopped and its
last beat is at most ``LIVE_INTERVALS`` intervals old: a process killed right after a beat is
shown without it 1.5 intervals later, one killed just before its next beat half an interval
later - always within two. A beat that fails (storage away) is tried again after a third of
the interval, so one failed write does not make a live process look dead. Maintenance removes
rows last seen more than ``FORGET_SECONDS`` ago.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
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
        """Write the row now; False when storage refused (logged)."""
        try:
            self.tables.replace(self.table, Entity(PARTITION, self.instance, {
                "kind": self.kind, "host": host_name(), "pid": os.getpid(),
                "version": package_version(), "endpoints": json.dumps(self.endpoints),
                "started_at": self.started_at, "last_seen": self.clock(),
                "every": self.every, "stopped": stopped}))
        except StorageError as exc:
            log.warning("could not write the heartbeat of %s (tried again in %.0f s): %s",
                        self.instance, self.every / 3, exc)
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
