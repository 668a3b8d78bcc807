"""The send marks' log: which message ids a marked send marked at a destination, and when, so
that the sweeper finds the marks past their retention by reading a few rows, not every mark.

A send mark (``bus.protocol.send.marked``) lives under its message id, which says nothing of
its age; a data pipeline makes millions of them, kept ``ledger_retention_seconds`` (7 days).
Scanning them all on every sweep is what this log replaces. Before a marked send writes its
marks at a destination it writes one row here (more for a very long list) naming the message
ids and the moment, under a row key that starts with the moment the row is **due**: when its
marks' retention has passed. The sweeper reads the partition's first rows (one request: row
keys sort by due time), and for each due one looks at the marks it names:

* a mark made by that send (no later than ``CALL_SLACK`` after the row) and past its retention
  whose token is gone is forgotten;
* one whose token still waits is kept: its id goes into a row due again after ``recheck``;
* a mark made later (the message id sent again after its mark was forgotten) is left to the row
  of that later send.

The row is written before the marks, so every mark has one (a send that stops after the row
leaves a row naming marks that never came: nothing to forget). Marks written before this log
existed have no row; ``Inbox.all_marks`` (a scan) still finds them for tooling.

All rows lie in one partition of the tokens table, ``~marks`` (no endpoint is named so).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from bus.ids import IdFactory
from bus.protocol.tokens.inbox import MARK_LOG
from bus.storage import Entity, NotFound, PreconditionFailed, TableOp, Tables
from bus.storage.limits import split_text, transactions, utf16_bytes

log = logging.getLogger(__name__)

PARTITION = MARK_LOG
CALL_SLACK = 3600.0
"""How long after its log row a send's marks may be made (a send's rounds take seconds)."""
_PER_ROW_BYTES = 256 * 1024  # of message ids, as JSON (a row holds 1 MiB)


@dataclass(frozen=True)
class LogRow:
    """A row as read: the marks ``message_ids`` of a send to ``endpoint`` made at ``at``."""

    endpoint: str
    message_ids: tuple[str, ...]
    at: float
    due: float
    row_key: str
    etag: str


class MarkLog:
    def __init__(self, tables: Tables, table: str, new_id: IdFactory) -> None:
        self._tables = tables
        self._table = table
        self._new_id = new_id

    def record(self, endpoint: str, message_ids: Sequence[str], at: float,
               due: float) -> None:
        """Log that a send at ``at`` is about to mark ``message_ids`` at ``endpoint``; its row
        comes due at ``due``."""
        rows = [self._entity(endpoint, group, at, due) for group in self._groups(message_ids)]
        for batch in transactions([TableOp("insert", row) for row in rows],
                                  self._tables.limits):
            self._tables.transact(self._table, batch)

    def due(self, now: float, limit: int) -> list[LogRow]:
        """The rows due at ``now``, earliest first: at most ``limit`` (one request)."""
        found = []
        for entity in self._tables.query(self._table, PARTITION, limit=limit):
            try:
                row = _row(entity)
            except (KeyError, ValueError, TypeError) as exc:  # not a row this bus wrote
                log.warning("send mark log row %s is not one this bus wrote (%s): left out",
                            entity.row_key[:100], exc)
                continue
            if row.due > now:
                break
            found.append(row)
        return found

    def settle(self, row: LogRow, waiting: Sequence[str], recheck_at: float) -> None:
        """Drop ``row``, and log the ``waiting`` ids again, due at ``recheck_at``: in one
        transaction, unless the row changed or went since it was read (another sweeper). (A
        list too long for one goes in several, the new rows first: a stop in between leaves
        a row twice, never a waiting mark unlogged.)"""
        ops = [TableOp("insert", self._entity(row.endpoint, group, row.at, recheck_at))
               for group in self._groups(waiting)]
        ops.append(TableOp("delete", Entity(PARTITION, row.row_key), etag=row.etag))
        with contextlib.suppress(PreconditionFailed, NotFound):
            for batch in transactions(ops, self._tables.limits):
                self._tables.transact(self._table, batch)

    def _groups(self, message_ids: Sequence[str]) -> list[list[str]]:
        groups: list[list[str]] = [[]]
        size = 0
        for message_id in dict.fromkeys(message_ids):
            cost = utf16_bytes(_json(message_id)) + 4  # as stored, with its separator
            if groups[-1] and size + cost > _PER_ROW_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(message_id)
            size += cost
        return [group for group in groups if group]

    def _entity(self, endpoint: str, message_ids: Sequence[str], at: float,
                due: float) -> Entity:
        pieces = split_text(_json(list(message_ids)), self._tables.limits.property_bytes)
        return Entity(PARTITION, f"{due:017.3f}~{self._new_id()}", {
            "endpoint": endpoint, "at": at, "due": due, "pieces": len(pieces),
            **{f"ids{n}": piece for n, piece in enumerate(pieces)}})


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _row(entity: Entity) -> LogRow:
    props = entity.properties
    text = "".join(str(props[f"ids{n}"]) for n in range(int(str(props["pieces"]))))
    return LogRow(str(props["endpoint"]), tuple(json.loads(text)), float(str(props["at"])),
                  float(str(props["due"])), entity.row_key, entity.etag)
