"""Versions of what the bus reads back later: an envelope or a stored outbox record of a
version this bus does not read is poisoned with a reason that names it, never an exception out
of a host loop; documents written before versions were checked read as version 1 - on the
in-memory backend and Azurite."""

from __future__ import annotations

import base64
import json

import pytest

from bus import Bus, Command, Context, Endpoint
from bus.errors import UnreadableVersion
from bus.protocol.outbox.slot import SLOT_ROW
from bus.storage import Entity, Storage
from bus.testing import MessagesPoisoned, drain
from bus.versions import Format


class Count(Command):
    key: str


def build(storage: Storage, prefix: str) -> tuple[Bus, list[str]]:
    counter = Endpoint("counter")
    seen: list[str] = []

    @counter.handles(Count, partition=lambda m: m.key)
    def count(message: Count, ctx: Context) -> None:
        seen.append(message.key)

    bus = Bus(storage, [counter], prefix=prefix)
    bus.provision()
    return bus, seen


def put_slot(bus: Bus, partition: str, record: dict[str, object]) -> None:
    text = json.dumps(record)
    bus.storage.tables.insert(bus.names.state_table("counter"),
                              Entity(partition, SLOT_ROW, {"chunks": 1, "r0": text}))


def record(**fields: object) -> dict[str, object]:
    return {"endpoint": "counter", "message_id": "old", "attempt_id": "old-a",
            "phase": "sending", **fields}


def test_an_envelope_of_a_newer_version_is_poisoned_with_the_version(
        storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    envelope = {"bus": 3, "message_id": "m1", "attempt_id": "a1", "kind": "command",
                "message_type": "Count", "source": "x", "destination": "counter",
                "correlation_id": "m1", "sent_at": "2026-11-23T00:00:00Z",
                "payload": '{"key": "k"}'}
    body = base64.b64encode(json.dumps(envelope).encode()).decode()
    bus.storage.queues.send(bus.names.queue("counter"), body)
    with pytest.raises(MessagesPoisoned) as poisoned:
        drain(bus)
    [letter] = poisoned.value.letters
    assert letter.entry.reason == ("envelope version 3 is newer than this bus reads (1, 2): "
                                   "upgrade the bus package where it is read")
    assert letter.entry.original_body == body and seen == []


def test_a_record_this_bus_cannot_read_poisons_its_partition_only(
        storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    put_slot(bus, "p1", record(v=2))
    bus.send(Count(key="p1"))
    bus.send(Count(key="p2"))
    with pytest.raises(MessagesPoisoned) as poisoned:
        drain(bus)
    [letter] = poisoned.value.letters
    assert letter.entry.reason.startswith(
        "the outbox slot of partition 'p1' holds a record this bus cannot read (outbox "
        "record version 2 is newer than this bus reads (1)")
    assert letter.entry.envelope is not None  # replayable once the bus reads it
    assert seen == ["p2"]
    assert bus.parts.outbox_driver("counter").recover(0) == 0  # maintenance skips it, goes on


def test_a_damaged_record_is_unreadable_too(storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    put_slot(bus, "p1", {"endpoint": "counter"})  # no message id: not a record
    bus.send(Count(key="p1"))
    with pytest.raises(MessagesPoisoned, match="holds a record this bus cannot read"):
        drain(bus)
    assert seen == []


def test_a_record_written_before_versions_reads_as_version_1(
        storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    put_slot(bus, "p1", record())  # no "v", as every record written before versions
    bus.send(Count(key="p1"))
    drain(bus)
    assert seen == ["p1"]


def test_a_format_reads_the_version_before_its_own_and_upgrades_it() -> None:
    thing = Format("thing", "v", 2, {1: lambda d: {**d, "b": d["a"] * 2}})
    assert thing.read({"a": 1}) == {"a": 1, "b": 2, "v": 2}  # no version: version 1
    assert thing.read({"a": 1, "v": 1}) == {"a": 1, "b": 2, "v": 2}
    assert thing.read({"a": 1, "b": 5, "v": 2}) == {"a": 1, "b": 5, "v": 2}
    with pytest.raises(UnreadableVersion, match=r"version 3 is newer than this bus reads "
                                                r"\(1, 2\)"):
        thing.read({"v": 3})
    with pytest.raises(UnreadableVersion, match=r"version 0 is older"):
        thing.read({"v": 0})
    with pytest.raises(UnreadableVersion, match="not a number"):
        thing.read({"v": True})


def test_a_poison_entry_of_a_newer_version_is_listed_with_the_reason(
        storage: Storage, prefix: str) -> None:
    bus, _ = build(storage, prefix)
    entry = {"v": 3, "reason": "r", "dequeue_count": 1, "endpoint": "counter",
             "poisoned_at": "2026-11-23T00:00:00Z", "original_body": "eA=="}
    body = base64.b64encode(json.dumps(entry).encode()).decode()
    bus.storage.queues.send(bus.names.poison_queue("counter"), body)
    [letter] = bus.poisoned("counter").entries()
    assert letter.entry.reason == ("a poison entry this bus cannot read: poison entry version "
                                   "3 is newer than this bus reads (1, 2): upgrade the bus "
                                   "package where it is read")
    assert letter.entry.original_body == body
