"""Storage's size limits, counted as the service counts them, meet a message before anything is
committed: what cannot be stored is poisoned with a reason, and a poison entry too large for a
queue message is kept in a blob and replayed from there - on the in-memory backend (which
enforces Azure's limits) and Azurite."""

from __future__ import annotations

import base64
import json

import pytest

from bus import Bus, Command, Context, Endpoint
from bus.retry import Reject, RetryPolicy
from bus.storage import Storage
from bus.testing import MessagesPoisoned, drain


class Note(Command):
    key: str
    text: str = ""


class Forward(Command):
    key: str
    size: int


def build(storage: Storage, prefix: str, *, reject: bool = False) -> tuple[Bus, list[str]]:
    notes = Endpoint("notes", retry=RetryPolicy(delays=(0.0,)))  # redelivered at once
    seen: list[str] = []

    @notes.handles(Note, partition=lambda m: m.key)
    def note(message: Note, ctx: Context) -> None:
        if reject and not seen:
            seen.append("rejected")
            raise Reject("not today")
        seen.append(message.key)
        if message.text:
            ctx.state.put("last", {"text": message.text})

    @notes.handles(Forward, partition=lambda m: m.key)
    def forward(message: Forward, ctx: Context) -> None:
        seen.append(message.key)
        for i in range(3):
            ctx.send(Note(key=f"{message.key}-{i}", text="é" * message.size), to="notes")

    bus = Bus(storage, [notes], prefix=prefix)
    bus.provision()
    return bus, seen


def test_a_large_message_poisoned_fits_the_poison_queue_and_replays_once(
        storage: Storage, prefix: str) -> None:
    """Its entry is about three times the signal: over a queue message, so it is kept in a
    blob. Before, the poisoning itself failed on every delivery."""
    bus, seen = build(storage, prefix, reject=True)
    text = "n" * 30_000  # inline: the envelope stays under a queue message's 48 KiB
    bus.send(Note(key="k", text=text))
    with pytest.raises(MessagesPoisoned) as poisoned:
        drain(bus)
    [letter] = poisoned.value.letters
    assert letter.entry.reason == "rejected: not today"
    assert letter.entry.envelope is not None and letter.replayable
    assert seen == ["rejected"]
    poison = bus.names.poison_queue("notes")
    [entry] = bus.storage.queues.receive(poison, max_messages=1, lease=30)
    bus.storage.queues.extend(poison, entry, lease=0)
    assert len(entry.body) <= bus.storage.queues.limits.queue_message_chars
    dead = bus.poisoned("notes")
    assert list(dead.replay().values()) == ["replayed"]
    drain(bus)
    assert seen == ["rejected", "k"]
    assert bus.read_state("notes", "k", "last") == {"text": text}
    assert dead.entries() == []
    assert bus.storage.blobs.list(bus.names.payload_container) == []  # the kept entry is gone


def test_a_state_row_over_the_property_limit_in_utf16_is_poisoned_with_the_reason(
        storage: Storage, prefix: str) -> None:
    """40,000 characters of "é" are 80,000 bytes in UTF-16: over a property's 64 KiB,
    though fewer characters than the old check's count."""
    bus, _ = build(storage, prefix)
    bus.send(Note(key="k", text="é" * 40_000))
    with pytest.raises(MessagesPoisoned) as poisoned:
        drain(bus)
    [letter] = poisoned.value.letters
    assert "StateError: state row 'last' cannot be stored: property 'text'" in (
        letter.entry.exception or "")
    assert bus.read_state("notes", "k", "last") is None


def test_outgoing_messages_over_an_entity_in_utf16_are_poisoned_before_any_token(
        storage: Storage, prefix: str) -> None:
    """Three sends of 200,000 "é" each: 600,000 characters, which the old check let through
    (it allowed 900,000), but 1.2 MB in UTF-16, which no outbox record holds: every commit
    then failed. Now the handler's call is refused before any token exists."""
    bus, seen = build(storage, prefix)
    bus.send(Forward(key="f", size=200_000))
    with pytest.raises(MessagesPoisoned) as poisoned:
        drain(bus)
    [letter] = poisoned.value.letters
    assert "RecordTooLarge" in (letter.entry.exception or "")
    assert "more than an outbox record holds" in (letter.entry.exception or "")
    tokens = bus.parts.inbox.all("notes")  # every shard's
    assert [t.attempt_id for t in tokens] == [letter.entry.envelope.attempt_id
                                           if letter.entry.envelope else ""]
    assert seen == ["f"] * 5  # every delivery ran the handler; none committed


def test_a_poison_entry_pointing_outside_its_place_is_never_followed(
        storage: Storage, prefix: str) -> None:
    """A forged version 2 entry naming another blob: listed with the reason, and purging it
    leaves that blob alone."""
    bus, _ = build(storage, prefix)
    container = bus.names.topic_container
    bus.storage.blobs.write(container, "orders.json", b'["notes"]')
    entry = {"v": 2, "reason": "r", "dequeue_count": 1, "endpoint": "notes",
             "poisoned_at": "2026-11-24T00:00:00Z", "original_body": "",
             "entry_ref": {"container": container, "blob": "orders.json"}}
    body = base64.b64encode(json.dumps(entry).encode()).decode()
    bus.storage.queues.send(bus.names.poison_queue("notes"), body)
    dead = bus.poisoned("notes")
    [letter] = dead.entries()
    assert "where this bus keeps no poison entries: not read" in letter.entry.reason
    assert dead.purge() == [letter.id]
    assert bus.storage.blobs.read(container, "orders.json").data == b'["notes"]'
