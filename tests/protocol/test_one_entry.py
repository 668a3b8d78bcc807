"""One message, one poison entry: two copies of a message rejected one after the other leave
one entry (the second finds the token poisoned), and two that raced (each wrote its entry
before the token was poisoned) are tidied to one by the poison-queue tools."""

from __future__ import annotations

from bus import Bus, Command, Context, Endpoint
from bus.envelope import decode_signal
from bus.protocol.delivery import Outcome
from bus.protocol.poison.queue import PoisonEntry
from bus.retry import Reject
from bus.testing import InMemoryStorage


class Charge(Command):
    ref: str


def build() -> Bus:
    desk = Endpoint("desk")

    @desk.handles(Charge, partition=lambda m: m.ref)
    def charge(message: Charge, ctx: Context) -> None:
        raise Reject("card declined")

    bus = Bus(InMemoryStorage(), [desk])
    bus.provision()
    return bus


def queued(bus: Bus) -> str:
    [message] = bus.storage.queues.receive(bus.names.queue("desk"), max_messages=1, lease=60)
    return message.body


def test_a_second_rejected_copy_finds_the_message_poisoned() -> None:
    bus = build()
    bus.send(Charge(ref="c1"))
    body = queued(bus)
    envelope = decode_signal(body)
    poisoning = bus.parts.poisoning("desk")
    first = poisoning.failed(body, envelope, Reject("card declined"), 1, lambda: None)
    second = poisoning.failed(body, envelope, Reject("card declined"), 1, lambda: None)
    assert (first, second) == (Outcome.POISONED, Outcome.ALREADY_POISONED)
    assert len(bus.poisoned("desk").entries()) == 1


def test_poisonings_that_raced_leave_one_entry() -> None:
    """Both copies read the token live and wrote their entry; one poisoned the token."""
    bus = build()
    bus.send(Charge(ref="c2"))
    body = queued(bus)
    envelope = decode_signal(body)
    token = bus.parts.inbox.read("desk", envelope.attempt_id)
    assert token is not None
    entries = bus.parts.poison_queue("desk")
    for when in (1.0, 2.0):
        entries.put(body, reason="rejected: card declined", dequeue_count=1, now=when,
                    envelope=envelope)
    assert bus.parts.inbox.poison(token, 3.0)
    [kept] = bus.poisoned("desk").entries()
    assert kept.entry.poisoned_at.timestamp() == 1.0  # the oldest
    assert bus.storage.queues.depth(bus.names.poison_queue("desk")) == 1


def test_entries_of_a_message_processed_since_are_tidied_to_one() -> None:
    """Two raced poisonings, then the message was processed (a replay of one entry): the other
    entries are stale; the tools keep one to say so."""
    bus = build()
    bus.send(Charge(ref="c3"))
    body = queued(bus)
    envelope = decode_signal(body)
    entries = bus.parts.poison_queue("desk")
    for when in (1.0, 2.0, 3.0):
        entries.put(body, reason="rejected: card declined", dequeue_count=1, now=when,
                    envelope=envelope)
    bus.parts.inbox.consume("desk", envelope.attempt_id)
    [kept] = bus.poisoned("desk").entries()
    assert kept.token is None and kept.entry.poisoned_at.timestamp() == 1.0
    assert bus.storage.queues.depth(bus.names.poison_queue("desk")) == 1


def test_an_entry_kept_in_a_blob_and_sent_twice_is_one_entry() -> None:
    """The same pointer to a whole entry in a blob, sent twice (a send retried after its answer
    was lost): listed once, and purging it leaves no pointer to a blob that is gone."""
    bus = build()
    queue = bus.names.poison_queue("desk")
    bus.parts.poison_queue("desk").put("x" * 70_000, reason="body is not a message",
                                       dequeue_count=1, now=1.0)
    [body] = bus.storage.queues.bodies(queue)  # type: ignore[attr-defined]
    bus.storage.queues.send(queue, body)
    [kept] = bus.poisoned("desk").entries()
    assert kept.entry.entry_ref is not None
    assert bus.poisoned("desk").purge({kept.id}) == [kept.id]
    assert bus.poisoned("desk").entries() == []


def test_a_pointer_to_a_whole_entry_that_is_gone_is_tidied() -> None:
    """Its twin was replayed or purged (deleting the blob) while another reader's lease hid
    this one: nothing is left to replay, and the pointer goes at the next listing."""
    bus = build()
    queue = bus.names.poison_queue("desk")
    bus.parts.poison_queue("desk").put("x" * 70_000, reason="body is not a message",
                                       dequeue_count=1, now=1.0)
    [body] = bus.storage.queues.bodies(queue)  # type: ignore[attr-defined]
    ref = PoisonEntry.decode(body).entry_ref
    assert ref is not None
    bus.storage.blobs.delete(ref.container, ref.blob)
    assert bus.poisoned("desk").entries() == []
    assert bus.storage.queues.depth(queue) == 0
