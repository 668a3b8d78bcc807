"""The audit trail: who did what to which messages, and when.

Every operator action - a poison-queue replay or purge, a pause or resume, the release of a
deferred message, a session's skip or close - writes one record to the bus's audit table
before it acts, from whichever way it came in (the Python API, ``python -m bus``, the
dashboard): an action whose record cannot be written does not happen (the operator sees the
storage error and runs it again), so nothing is done that the trail does not show. The log
carries each record too (logger ``bus.audit``, INFO).

A record names the action, the endpoint, what it was asked to act on (entry ids, a message
id, a session, a pause's length and reason) and **who**: the principal the platform
authenticated (the dashboard behind Easy Auth: ``X-MS-CLIENT-PRINCIPAL``), or whoever code
names with ``acting_as``, else the operating-system user and host of the process. A record
says what was asked, not what came of it: the command's own answer says that.

The table is partitioned by UTC day, newest first within a day (the row key counts down), so
``recent`` reads the latest days without scanning the table. Nothing removes old records.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from bus.ids import random_id
from bus.storage import Entity, Tables

log = logging.getLogger(__name__)

ACTIONS = ("replay", "purge", "pause", "resume", "release", "skip", "close")
"""The operator actions the trail records."""
AUTOMATIC_ACTIONS = ("retry",)
"""What the bus does on its own that the trail records too: maintenance's automatic retry of
a message the Functions host moved to the poison queue after a crash."""
MAX_IDS = 100
"""Ids a record lists per list (the rest are counted), and ``MAX_TEXT`` the characters of any
other text it keeps: a record stays inside a table row's property, whatever it was asked."""
MAX_TEXT = 1_000
_COUNTDOWN = 10**17  # microseconds: row keys count down from here, so the newest sorts first

_acting: ContextVar[str | None] = ContextVar("bus_audit_acting_as", default=None)

Audit = Callable[[str, str, Mapping[str, Any]], None]
"""What an operator action calls before it acts: ``audit(action, endpoint, target)``."""


@contextlib.contextmanager
def acting_as(who: str) -> Iterator[None]:
    """Record the operator actions inside the block as ``who``'s (a principal's name)."""
    token = _acting.set(who)
    try:
        yield
    finally:
        _acting.reset(token)


def who() -> str:
    """Who acts now: ``acting_as``'s name, else ``<os user>@<host>``."""
    named = _acting.get()
    if named:
        return named
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class AuditRecord:
    """One operator action, as the trail holds it."""

    at: float
    """When it was asked for (epoch seconds, the bus's clock)."""
    who: str
    action: str
    endpoint: str
    target: dict[str, Any]
    """What it was asked to act on: for a replay or purge the entries asked for (``asked``,
    or ``all``) and those it found (``entries``, their ``messages``); a ``message_id``; a
    ``session``; a pause's ``seconds`` and ``reason``."""


class AuditTrail:
    """The bus's audit table: ``record`` before an action, ``recent`` to read."""

    def __init__(self, tables: Tables, table: str, clock: Callable[[], float],
                 new_id: Callable[[], str] = random_id) -> None:
        self._tables = tables
        self._table = table
        self._clock = clock
        self._new_id = new_id

    def record(self, action: str, endpoint: str, target: Mapping[str, Any]) -> None:
        """Write the record of an action about to run (one insert); raises the storage
        error when it cannot, and the action must not run then."""
        if action not in ACTIONS + AUTOMATIC_ACTIONS:
            raise ValueError(f"not an audited action: {action!r}")
        at, by = self._clock(), who()
        shown = _bounded(target)
        self._tables.insert(self._table, Entity(
            _day(at), f"{_COUNTDOWN - int(at * 1_000_000):017d}~{self._new_id()}",
            {"at": at, "who": by[:MAX_TEXT], "action": action, "endpoint": endpoint,
             "target": json.dumps(shown, sort_keys=True, default=str)}))
        log.info("audit: %s %s at %s by %s: %s", action, endpoint, _day(at), by,
                 json.dumps(shown, sort_keys=True, default=str))

    def recent(self, limit: int = 100, *, days: int = 30) -> list[AuditRecord]:
        """The latest ``limit`` records of the last ``days`` days, newest first (a query
        per day read)."""
        if limit < 1 or days < 1:
            raise ValueError("limit and days are 1 or more")
        now = self._clock()
        found: list[AuditRecord] = []
        for back in range(days):
            day = _day(now - back * 86_400.0)
            rows = sorted(self._tables.query(self._table, partition_key=day),
                          key=lambda row: row.row_key)
            found.extend(record for row in rows if (record := _record(row)) is not None)
            if len(found) >= limit:
                break
        return found[:limit]


def _day(at: float) -> str:
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%d")


def _bounded(target: Mapping[str, Any]) -> dict[str, Any]:
    """``target`` with its id lists cut to ``MAX_IDS`` (and counted), its text to
    ``MAX_TEXT``."""
    shown: dict[str, Any] = {}
    for key, value in target.items():
        if isinstance(value, (list, tuple, set, frozenset)):
            items = sorted(str(v) for v in value)
            shown[key] = items[:MAX_IDS]
            if len(items) > MAX_IDS:
                shown[f"{key}_count"] = len(items)
        elif isinstance(value, str):
            shown[key] = value[:MAX_TEXT]
        else:
            shown[key] = value
    return shown


def _record(row: Entity) -> AuditRecord | None:
    """The record a row holds, or None for a row this trail did not write."""
    props = row.properties
    try:
        target = json.loads(str(props["target"]))
        at = props["at"]
        if not isinstance(target, dict) or not isinstance(at, (int, float)):
            return None
        return AuditRecord(float(at), str(props["who"]), str(props["action"]),
                           str(props["endpoint"]), target)
    except (KeyError, ValueError):
        return None

