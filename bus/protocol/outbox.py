"""The outbox slot: one row per state partition, beside the business state.

The slot is the receiver's claim. A handler's state changes and its outbox record are written in
one entity-group transaction whose slot operation carries the ETag read before the inbox token
was checked (or is create-only for a partition's first message). Of two copies of a message
processed concurrently, only one can commit; the other gets :class:`ClaimLost` and starts over.
The row is replaced, never deleted, so its ETag keeps changing: deleting and re-creating it
would let a stale create succeed (the ABA problem). A finished record stays in the slot until
the partition's next commit replaces it (see ``dispatch``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bus.errors import RecordTooLarge, UnreadableRecord
from bus.protocol.records import OutboxRecord
from bus.storage import (
    Conflict,
    Entity,
    EntityValue,
    Missing,
    NotFound,
    PreconditionFailed,
    TableOp,
    Tables,
)
from bus.versions import OUTBOX_RECORD

log = logging.getLogger(__name__)

SLOT_ROW = "~bus.outbox"
RESERVED_PREFIX = "~"
_CHUNK = 30_000  # characters per string property (the limit is 64 KiB of UTF-16)
_MAX_CHUNKS = 30  # an entity holds at most 1 MiB
READS_PER_CLAIM = 13  # state rows fetched with the slot: one query holds 14 keys (adapter)


def claimed_rows(reads: Sequence[str]) -> list[str]:
    """The state rows a claim fetches with the slot: the first READS_PER_CLAIM distinct ones."""
    return list(dict.fromkeys(reads))[:READS_PER_CLAIM]


class ClaimLost(Exception):
    """The slot changed since it was loaded: another worker got there first."""






@dataclass(frozen=True)
class Slot:
    partition: str
    record: OutboxRecord | None
    etag: str | None  # None: the row does not exist yet
    rows: Mapping[str, Mapping[str, EntityValue] | None] = field(default_factory=dict)
    """State rows read with the slot, in the same request (None: the row does not exist).
    One query of one partition reads one snapshot, so they are the rows as of ``etag``."""
    cached: bool = False
    """Remembered from this process's own commit (``slotcache``), not read."""


class Outbox:
    def __init__(self, tables: Tables, table: str) -> None:
        self._tables = tables
        self._table = table

    def load(self, partition: str, reads: Sequence[str] = ()) -> Slot:
        """The partition's slot, and the state rows ``reads`` names (the first
        READS_PER_CLAIM of them) fetched in the same request."""
        if not reads:
            try:
                row = self._tables.get(self._table, partition, SLOT_ROW)
            except Missing:
                raise  # no table: not provisioned, not "no slot yet"
            except NotFound:
                return Slot(partition, None, None)
            return Slot(partition, _decode(row), row.etag)
        keys = claimed_rows(reads)
        found = self._tables.get_many(self._table, partition, [SLOT_ROW, *keys])
        rows = {key: dict(found[key].properties) if key in found else None for key in keys}
        slot = found.get(SLOT_ROW)
        if slot is None:
            return Slot(partition, None, None, rows)
        return Slot(partition, _decode(slot), slot.etag, rows)

    def pending(self) -> list[Slot]:
        """Every slot of the table that holds a record, finished or not (a table scan:
        maintenance only). A record this bus cannot read is left where it is, with a
        warning: the messages of its partition are poisoned with the reason meanwhile."""
        slots: list[Slot] = []
        for row in self._tables.query(self._table, row_key=SLOT_ROW):
            try:
                record = _decode(row)
            except UnreadableRecord as exc:
                log.warning("%s: %s", self._table, exc)
                continue
            if record is not None:
                slots.append(Slot(row.partition_key, record, row.etag))
        return slots

    def commit(self, slot: Slot, state_ops: Sequence[TableOp], record: OutboxRecord,
               *, cas: bool = True) -> Slot:
        """Write the state changes and the record atomically, if the slot is unchanged."""
        op = self._slot_op(slot, record, cas)
        try:
            etags = self._tables.transact(self._table, [*state_ops, op])
        except Missing:
            raise
        except (Conflict, PreconditionFailed, NotFound) as exc:
            raise ClaimLost(str(exc)) from exc
        return Slot(slot.partition, record, etags[-1])

    @staticmethod
    def check_size(record: OutboxRecord) -> None:
        """Raise RecordTooLarge now for a record no slot can hold (with room for the ETags
        of its outgoing tokens, added when they are created before the commit)."""
        _encode("", record.placed(("W/\"datetime'0000-00-00T00%3A00%3A00.0000000Z'\"",)
                                  * len(record.outgoing)))

    def touch(self, slot: Slot) -> Slot:
        """Rewrite the slot unchanged, by compare-and-swap (create it, empty, when it does not
        exist): a commit prepared against the slot as it was fails its own compare-and-swap.
        Raises ClaimLost when the slot changed since ``slot`` was loaded."""
        if slot.etag is None:
            try:
                etag = self._tables.insert(self._table, _encode(slot.partition, None))
            except Conflict as exc:
                raise ClaimLost(str(exc)) from exc
            return Slot(slot.partition, None, etag)
        return Slot(slot.partition, slot.record, self._replace(slot, slot.record))

    def update(self, slot: Slot, record: OutboxRecord) -> Slot:
        return Slot(slot.partition, record, self._replace(slot, record))

    def _replace(self, slot: Slot, record: OutboxRecord | None) -> str:
        try:
            return self._tables.replace(self._table, _encode(slot.partition, record),
                                        etag=slot.etag)
        except Missing:
            raise
        except (PreconditionFailed, NotFound) as exc:
            raise ClaimLost(str(exc)) from exc

    @staticmethod
    def _slot_op(slot: Slot, record: OutboxRecord, cas: bool) -> TableOp:
        entity = _encode(slot.partition, record)
        if not cas:
            return TableOp("replace", entity)
        if slot.etag is None:
            return TableOp("insert", entity)
        return TableOp("replace", entity, slot.etag)


def _encode(partition: str, record: OutboxRecord | None) -> Entity:
    text = record.model_dump_json() if record is not None else ""
    chunks = [text[i:i + _CHUNK] for i in range(0, len(text), _CHUNK)]
    if len(chunks) > _MAX_CHUNKS:
        raise RecordTooLarge(
            f"the outgoing messages of one handler call take {len(text)} characters; an outbox "
            f"record holds at most {_CHUNK * _MAX_CHUNKS}. Send a reference to data you store "
            "yourself instead of the data.")
    properties: dict[str, str | int] = {"chunks": len(chunks)}
    properties.update({f"r{i}": chunk for i, chunk in enumerate(chunks)})
    return Entity(partition, SLOT_ROW, properties)


def _decode(row: Entity) -> OutboxRecord | None:
    """The record a slot row holds (None: an empty slot), or UnreadableRecord."""
    count = row.properties.get("chunks", 0)
    if not count:
        return None
    try:
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"chunk count {count!r}")
        text = "".join(str(row.properties[f"r{i}"]) for i in range(count))
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        return OutboxRecord.model_validate(OUTBOX_RECORD.read(document))
    except (KeyError, ValueError) as exc:  # JSON, validation and version errors included
        raise UnreadableRecord(
            f"the outbox slot of partition {row.partition_key!r} holds a record this bus "
            f"cannot read ({str(exc).splitlines()[0]})") from exc
