"""Sessions that skip gaps (bus.protocol.sessions.order, session_admin): a copy that waited for its
turn and was then poisoned does not hold its session up for good, and a skip that skips
nothing records no gap - on the in-memory backend and Azurite."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from bus import Bus, Command, Context, Endpoint, Settings
from bus.envelope import Envelope, decode_signal
from bus.protocol.delivery import Outcome
from bus.protocol.sessions.order import (
    Gaps,
    Handle,
    SessionRow,
    SetAside,
    Waiting,
    plan,
    skip_requested,
)
from bus.retry import Reject
from bus.seams import Seams
from bus.storage import Storage
from bus.testing.seamed import seamed_bus

WINDOW = 5.0


class Step(Command):
    flow: str
    n: int


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def build(storage: Storage, prefix: str, clock: Clock) -> tuple[Bus, list[int]]:
    flows = Endpoint("flows", reorder_window=WINDOW, skip_gaps=True)
    handled: list[int] = []

    @flows.handles(Step, partition=lambda m: m.flow, session=lambda m: m.flow)
    def step(message: Step, ctx: Context) -> None:
        if message.n == 2:
            raise Reject("step 2 can never succeed")
        handled.append(message.n)

    bus = seamed_bus(Seams(clock=clock), storage, [flows], prefix=prefix,
                     settings=Settings(signal_bundles=False, group_sends=False))
    bus.provision()
    return bus, handled


def deliver(bus: Bus, sequence: int) -> Outcome | None:
    """Handle the queued copy with ``sequence`` (the others are left on the queue)."""
    queue = bus.names.queue("flows")
    found = None
    for message in bus.storage.queues.receive(queue, max_messages=32, lease=30):
        if found is None and decode_signal(message.body).sequence == sequence:
            found = bus.parts.receiver("flows").handle(message.body, message.dequeue_count)
            bus.storage.queues.delete(queue, message)
        else:
            bus.storage.queues.extend(queue, message, lease=0)
    return found


@pytest.mark.parametrize("purged", [False, True])
def test_a_copy_poisoned_after_it_waited_does_not_hold_up_its_session(
        storage: Storage, prefix: str, purged: bool) -> None:
    """Also when an operator purges step 2's entry before maintenance runs: the purge takes
    it out of the session's waiting list (its token is gone, so nothing else could tell it
    will never come)."""
    clock = Clock()
    bus, handled = build(storage, prefix, clock)
    for n in (1, 2, 3):
        bus.send(Step(flow="f", n=n))
    assert deliver(bus, 2) is Outcome.DEFERRED  # ahead of its turn: set aside
    assert deliver(bus, 3) is Outcome.DEFERRED
    assert deliver(bus, 1) is Outcome.PROCESSED  # its commit releases 2
    assert deliver(bus, 2) is Outcome.POISONED  # its turn, and its handler rejects it
    if purged:
        [entry] = bus.poisoned("flows").entries()
        assert bus.poisoned("flows").purge() == [entry.id]
    clock.now += WINDOW + 1
    # 2 waits no more: maintenance drops it from the session and releases 3, which skips it.
    assert bus.sessions("flows").release_overdue() == 1
    assert deliver(bus, 3) is Outcome.PROCESSED
    assert handled == [1, 3]
    info = bus.sessions("flows").get("f")
    assert info is not None and not info.waiting
    assert [(g.first, g.last) for g in info.row.gaps] == [(2, 2)]


def test_a_skip_to_the_copy_released_in_its_turn_records_no_gap() -> None:
    # 2 waited long, then 1 came and released it; 3 arrives before 2 does.
    row = SessionRow(streams={"s": 2}, waiting=(
        Waiting(stream="s", sequence=2, message_id="m2", generation=0, since=0.0),))
    planned = plan(row, "f", _copy(3), 0, 100.0, gaps=Gaps(window=WINDOW, skip=True),
                   endpoint="flows")
    assert isinstance(planned, SetAside) and planned.row.gaps == ()
    assert planned.row.expected("s") == 2
    second = plan(planned.row, "f", _copy(2), 1, 101.0, gaps=Gaps(window=WINDOW, skip=True),
                  endpoint="flows")
    assert isinstance(second, Handle) and second.row.expected("s") == 3


def _copy(sequence: int) -> Envelope:
    return Envelope(message_id=f"m{sequence}", attempt_id=f"a{sequence}", kind="command",
                    message_type="Step", source="client", destination="flows",
                    correlation_id="c", sent_at=datetime.fromtimestamp(0, tz=timezone.utc),
                    payload="{}", session="f", stream="s", sequence=sequence)


def _copy_of(stream: str, sequence: int) -> Envelope:
    return _copy(sequence).model_copy(update={"stream": stream,
                                              "message_id": f"{stream}{sequence}",
                                              "attempt_id": f"a-{stream}{sequence}"})


def test_an_operators_skip_is_for_the_gaps_it_saw() -> None:
    """The operator skips stream s's gap while t has a copy waiting too; once s moved on, a
    new ordinary reorder in stream u is not skipped: u's copy waits for its turn."""
    blocking = Gaps(window=WINDOW, skip=False)
    row = SessionRow(streams={"s": 1, "t": 1}, waiting=(
        Waiting(stream="s", sequence=3, message_id="s3", generation=0, since=0.0),
        Waiting(stream="t", sequence=2, message_id="t2", generation=0, since=0.0)))
    asked = skip_requested(row)
    moved = plan(asked, "f", _copy_of("s", 3), 1, 10.0, gaps=blocking, endpoint="flows")
    assert isinstance(moved, Handle) and moved.row.expected("s") == 4
    early = plan(moved.row, "f", _copy_of("u", 2), 0, 11.0, gaps=blocking, endpoint="flows")
    assert isinstance(early, SetAside) and early.row.expected("u") == 1  # waits for u1
    [gap] = early.row.gaps
    assert (gap.stream, gap.first, gap.last, gap.by) == ("s", 1, 2, "operator")
    t_moves = plan(early.row, "f", _copy_of("t", 2), 1, 12.0, gaps=blocking, endpoint="flows")
    assert isinstance(t_moves, Handle)  # t's gap was there when the operator asked
