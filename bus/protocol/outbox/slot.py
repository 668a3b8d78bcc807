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

from bus.errors import RecordTooLarge, StateError, UnreadableRecord
from bus.naming import RESERVED_PREFIX
from bus.protocol.records import OutboxRecord
from bus.protocol.tokens.shards import widest
from bus.storage import (
    Conflict,
    Entity,
    EntityValue,
    Missing,
    NotFound,
    PreconditionFailed,
    Refused,
    TableOp,
    Tables,
)
from bus.storage.limits import StorageLimits, check_entity, check_transaction, split_text
from bus.versions import OUTBOX_RECORD

__all__ = ["RESERVED_PREFIX"]  # kept importable from here

log = logging.getLogger(__name__)

SLOT_ROW = "~bus.outbox"


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
    def __init__(self, tables: Tables, table: str, *, reserve_growth: bool = True) -> None:
        self._tables = tables
        self._table = table
        self._limits = tables.limits
        self._reserve_growth = reserve_growth  # off only for the "unreserved-growth" break

    def claimed_rows(self, reads: Sequence[str]) -> list[str]:
        """The state rows a claim fetches with the slot: the first distinct ones, as many as
        one request reads with the slot (``StorageLimits.keys_per_read``)."""
        return list(dict.fromkeys(reads))[:self._limits.keys_per_read - 1]

    def load(self, partition: str, reads: Sequence[str] = ()) -> Slot:
        """The partition's slot, and the state rows ``reads`` names (``claimed_rows`` of
        them) fetched in the same request."""
        if not reads:
            try:
                row = self._tables.get(self._table, partition, SLOT_ROW)
            except Missing:
                raise  # no table: not provisioned, not "no slot yet"
            except NotFound:
                return Slot(partition, None, None)
            return Slot(partition, _decode(row), row.etag)
        keys = self.claimed_rows(reads)
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

    def check_commit(self, partition: str, state_ops: Sequence[TableOp],
                     record: OutboxRecord) -> None:
        """Raise now for a commit storage would refuse: RecordTooLarge for a record no slot
        can hold (with room for what it may gain later: the ETags of its outgoing tokens,
        added when they are created before the commit, and the attempt ids one helper pass
        supersedes - ``OutboxRecord.with_fresh_attempts`` - its fresh ids naming a shard each),
        StateError for state changes and a record that one transaction cannot carry together."""
        placeholder = "x" * self._limits.etag_chars
        wide = tuple(e.model_copy(update={"attempt_id": widest(e.attempt_id)})
                     for e in record.outgoing)
        largest = record.placed((placeholder,) * len(record.outgoing)).model_copy(update={
            "outgoing": wide, "superseded": record.model_copy(update={"outgoing": wide}).attempts(),
        }) if self._reserve_growth else record
        slot = self._encode(partition, largest)
        try:
            check_transaction([*state_ops, TableOp("replace", slot)], self._limits)
        except Refused as exc:
            raise StateError(
                f"the state changes and outgoing messages of one handler call are more than "
                f"one transaction holds ({exc})") from exc

    def touch(self, slot: Slot) -> Slot:
        """Rewrite the slot unchanged, by compare-and-swap (create it, empty, when it does not
        exist): a commit prepared against the slot as it was fails its own compare-and-swap.
        Raises ClaimLost when the slot changed since ``slot`` was loaded."""
        if slot.etag is None:
            try:
                etag = self._tables.insert(self._table, self._encode(slot.partition, None))
            except Conflict as exc:
                raise ClaimLost(str(exc)) from exc
            return Slot(slot.partition, None, etag)
        return Slot(slot.partition, slot.record, self._replace(slot, slot.record))

    def touch_with(self, slot: Slot, ops: Sequence[TableOp]) -> Slot:
        """Write ``ops`` (rows of the slot's partition) together with the slot rewritten
        unchanged, by compare-and-swap: a write outside a handler's commit that claims the
        partition like one (an operator's change to a session row). Raises ClaimLost when the
        slot or a row changed since it was read."""
        try:
            etags = self._tables.transact(self._table, [*ops, self._slot_op(slot, slot.record)])
        except Missing:
            raise
        except (Conflict, PreconditionFailed, NotFound) as exc:
            raise ClaimLost(str(exc)) from exc
        return Slot(slot.partition, slot.record, etags[-1])

    def update(self, slot: Slot, record: OutboxRecord) -> Slot:
        return Slot(slot.partition, record, self._replace(slot, record))

    def _replace(self, slot: Slot, record: OutboxRecord | None) -> str:
        try:
            return self._tables.replace(self._table, self._encode(slot.partition, record),
                                        etag=slot.etag)
        except Missing:
            raise
        except (PreconditionFailed, NotFound) as exc:
            raise ClaimLost(str(exc)) from exc

    def _slot_op(self, slot: Slot, record: OutboxRecord | None, cas: bool = True) -> TableOp:
        entity = self._encode(slot.partition, record)
        if not cas:
            return TableOp("replace", entity)
        if slot.etag is None:
            return TableOp("insert", entity)
        return TableOp("replace", entity, slot.etag)

    def _encode(self, partition: str, record: OutboxRecord | None) -> Entity:
        return _encode(partition, record, self._limits)


def _encode(partition: str, record: OutboxRecord | None, limits: StorageLimits) -> Entity:
    """The slot row holding ``record``: its JSON in string properties as large as the table
    allows; RecordTooLarge when the row would be over an entity's limits."""
    text = record.model_dump_json() if record is not None else ""
    chunks = split_text(text, limits.property_bytes)
    properties: dict[str, str | int] = {"chunks": len(chunks)}
    properties.update({f"r{i}": chunk for i, chunk in enumerate(chunks)})
    entity = Entity(partition, SLOT_ROW, properties)
    try:
        check_entity(entity, limits)
    except Refused as exc:
        raise RecordTooLarge(
            f"the outgoing messages of one handler call take {len(text)} characters, more "
            f"than an outbox record holds ({exc}). Send a reference to data you store "
            "yourself instead of the data.") from exc
    return entity


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
