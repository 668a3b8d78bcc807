"""What a copy ahead of its turn may claim of a session (bus.protocol.sessions.order): a number
far beyond its stream's next is refused without moving the session (``MAX_AHEAD``), and one
sender's copies cannot take the whole session row's waiting room
(``MAX_WAITING_PER_SOURCE``), so the other senders' copies still wait for their turn."""

from __future__ import annotations

import base64
import json

import pytest

from bus import Bus, Context, Endpoint, Settings
from bus.adapters.memory import InMemoryStorage
from bus.envelope import Envelope, encode_signal
from bus.protocol.delivery import Outcome
from bus.protocol.sessions.order import MAX_AHEAD, MAX_WAITING_PER_SOURCE
from bus.seams import Seams
from bus.storage import Storage
from bus.testing.seamed import seamed_bus
from tests.protocol.test_session_gaps import WINDOW, Clock, Step


def build(storage: Storage, prefix: str, clock: Clock, *,
          skip_gaps: bool) -> tuple[Bus, list[int]]:
    flows = Endpoint("flows", reorder_window=WINDOW, skip_gaps=skip_gaps)
    handled: list[int] = []

    @flows.handles(Step, partition=lambda m: m.flow, session=lambda m: m.flow)
    def step(message: Step, ctx: Context) -> None:
        handled.append(message.n)

    bus = seamed_bus(Seams(clock=clock), storage, [flows], prefix=prefix,
                     settings=Settings(signal_bundles=False, group_sends=False))
    bus.provision()
    return bus, handled


def take_all(bus: Bus) -> list[Envelope]:
    """The copies queued for ``flows``, taken off the queue in the order they were sent."""
    queue, taken = bus.names.queue("flows"), []
    while messages := bus.storage.queues.receive(queue, max_messages=32, lease=60):
        for message in messages:
            taken.append(Envelope.model_validate(json.loads(base64.b64decode(message.body))))
            bus.storage.queues.delete(queue, message)
    return sorted(taken, key=lambda e: e.sequence or 0)


def deliver(bus: Bus, envelope: Envelope) -> Outcome:
    """One delivery of ``envelope``'s copy, as a worker would make it."""
    return bus.parts.receiver("flows").handle(encode_signal(envelope), 1)


def another(bus: Bus, like: Envelope, name: str, **update: object) -> Envelope:
    """A copy of another message, built the way a producer without this package builds one
    (docs/envelope.md), its token inserted as the producer role may."""
    copy = like.model_copy(update={"message_id": f"m-{name}", "attempt_id": f"a-{name}",
                                   **update})
    bus.parts.inbox.create("flows", copy.attempt_id, copy.message_id, bus.parts.clock())
    return copy


def test_a_number_far_ahead_is_refused_without_moving_the_session(
        storage: Storage, prefix: str) -> None:
    """At an endpoint that skips gaps, a copy numbered far ahead in its sender's own stream
    (a sender's bug, or a producer's copy) used to wait, be skipped to once the window had
    passed, and have every real copy of the stream refused as behind it, for good."""
    clock = Clock()
    bus, handled = build(storage, prefix, clock, skip_gaps=True)
    for n in (1, 2, 3):
        bus.send(Step(flow="f", n=n))
    first, second, third = take_all(bus)
    far = another(bus, first, "far", sequence=first.sequence + MAX_AHEAD + 1,
                  payload=json.dumps({"flow": "f", "n": 99}))
    assert deliver(bus, far) is Outcome.POISONED
    clock.now += WINDOW + 1
    assert bus.sessions("flows").release_overdue() == 0  # nothing waits to be skipped to
    assert [deliver(bus, e) for e in (first, second, third)] == [Outcome.PROCESSED] * 3
    assert handled == [1, 2, 3]
    [letter] = bus.poisoned("flows").entries()
    assert letter.entry.envelope is not None and letter.entry.envelope.message_id == "m-far"
    assert f"more than the {MAX_AHEAD} a session waits for" in letter.entry.reason
    info = bus.sessions("flows").get("f")
    assert info is not None and info.row.gaps == () and info.row.expected(first.stream) == 4


def test_one_sender_cannot_take_a_sessions_whole_waiting_room() -> None:
    """A producer's copies ahead of their turn, in streams of the longest name, used to fill
    the session row until no one else's copy could wait in it: the app's own copy that came
    ahead of its turn was then poisoned. In memory only: the store holds a row to Azure's
    1 MiB, as Azurite does, and 500 copies take Azurite a while."""
    clock = Clock()
    bus, handled = build(InMemoryStorage(), "t", clock, skip_gaps=False)
    bus.send(Step(flow="f", n=1))
    bus.send(Step(flow="f", n=2))
    first, second = take_all(bus)
    # Streams of the longest name first (a partition key of 1,000 characters), then short
    # ones to fill what room is left.
    streams = ["legacy-shop/" + "p" * 1_000] * 500 + ["legacy-shop/q"] * 300
    flood = [another(bus, first, f"flood{n}", source="legacy-shop", stream=stream,
                     sequence=n, payload=json.dumps({"flow": "f", "n": -n}))
             for n, stream in enumerate(streams, start=2)]
    outcomes = [deliver(bus, copy) for copy in flood]
    assert deliver(bus, second) is Outcome.DEFERRED  # the app's copy still waits its turn
    assert deliver(bus, first) is Outcome.PROCESSED
    assert deliver(bus, second) is Outcome.PROCESSED
    assert handled == [1, 2]
    assert outcomes == ([Outcome.DEFERRED] * MAX_WAITING_PER_SOURCE
                        + [Outcome.POISONED] * (len(flood) - MAX_WAITING_PER_SOURCE))
    reasons = {letter.entry.reason.split(": ", 1)[1]
               for letter in bus.poisoned("flows").entries()}
    assert reasons == {f"{MAX_WAITING_PER_SOURCE} copies from 'legacy-shop' already wait in "
                       f"the session for earlier numbers (at most {MAX_WAITING_PER_SOURCE}); "
                       f"replay it once the session has moved on"}


@pytest.mark.parametrize("ahead", [MAX_AHEAD, MAX_AHEAD + 1])
def test_the_limit_ahead_is_exactly_max_ahead(ahead: int) -> None:
    bus, _ = build(InMemoryStorage(), "t", Clock(), skip_gaps=False)
    bus.send(Step(flow="f", n=1))
    [first] = take_all(bus)
    copy = another(bus, first, "ahead", sequence=1 + ahead)
    expected = Outcome.DEFERRED if ahead <= MAX_AHEAD else Outcome.POISONED
    assert deliver(bus, copy) is expected
