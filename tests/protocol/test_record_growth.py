"""An outbox record that fits its slot when its handler commits keeps fitting however many
helper passes issue fresh attempt ids for it (a Durable ``prepare`` always does): a pass
fences what earlier passes superseded and keeps only its own, and the commit check reserves
room for one pass's worth."""

from __future__ import annotations

import base64

import pytest

from bus import Bus, Command, Context, Endpoint
from bus.envelope import Envelope
from bus.hosting.functions.trigger import QueueTrigger
from bus.protocol.delivery import Delivery, HandlerFailed, Outcome
from bus.protocol.tokens.inbox import TokenState
from bus.storage import TransientError
from bus.testing import InMemoryStorage, drain

FAR = "a-destination-with-a-long-name-35ch"
COPIES = 40


class Start(Command):
    size: int


class Note(Command):
    text: str


def build() -> Bus:
    hub, far = Endpoint("hub"), Endpoint(FAR)

    @hub.handles(Start, partition=lambda m: "p")
    def start(message: Start, ctx: Context) -> None:
        for i in range(COPIES):
            ctx.send(Note(text=f"{i:02d}" + "x" * message.size))

    @far.handles(Note, partition=lambda m: m.text[:2])
    def note(message: Note, ctx: Context) -> None:
        ctx.state.put("seen", {"n": 1})

    bus = Bus(InMemoryStorage(), [hub, far])
    bus.provision()
    return bus


def commit(size: int) -> tuple[Bus, Delivery]:
    """The hub's handler committed with a record left to an orchestration (as the Functions
    trigger does for a fan-out above ``BUS_INLINE_DISPATCH_MAX``)."""
    bus = build()
    bus.send(Start(size=size))
    [signal] = bus.storage.queues.receive(bus.names.queue("hub"), max_messages=1, lease=60.0)
    trigger = QueueTrigger(bus, "hub", max_dequeue_count=5, inline_dispatch_max=1)
    return bus, trigger.deliver(base64.b64decode(signal.body), 1)


def largest_committed() -> int:
    """The largest per-copy size whose record the commit accepts (the rest are refused up
    front, the handler's fault)."""
    low, high = 0, 64 * 1024
    while low < high:
        middle = (low + high + 1) // 2
        try:
            _, delivery = commit(middle)
        except HandlerFailed as refused:  # redelivered, poisoned at the last delivery
            assert "RecordTooLarge" in str(refused)
            high = middle - 1
        else:
            assert delivery.outcome is Outcome.PROCESSED
            low = middle
    return low


def test_a_record_at_the_commit_limit_survives_repeated_helper_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    size = largest_committed()
    assert size > 1000  # the record is large: the check is near the slot's limit
    bus, delivery = commit(size)
    [handoff] = delivery.handoffs
    driver = bus.parts.outbox_driver("hub")
    courier = bus.parts.courier
    place, lost = courier.place, [2]

    def flaky(envelope: Envelope) -> None:  # the first two passes stop after their new ids
        if lost[0]:
            lost[0] -= 1
            raise TransientError("the placement's request was lost")
        place(envelope)

    monkeypatch.setattr(courier, "place", flaky)
    for _ in range(2):  # an activity retried: each run issues fresh ids again
        with pytest.raises(TransientError):
            driver.prepare(handoff.key)
    assert driver.prepare(handoff.key) == COPIES
    driver.signal(handoff.key, range(COPIES))
    assert driver.finish(handoff.key)
    assert drain(bus).total() == {"processed": COPIES}
    fenced = [t for t in bus.parts.inbox.all(FAR) if t.state is TokenState.FENCED]
    assert len(fenced) == 3 * COPIES  # every superseded attempt id is a tombstone
