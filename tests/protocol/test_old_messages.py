"""No message is dropped for its age: a send scheduled beyond the orphan age, and a message
whose signal waited in a backlog longer than it, are processed when their signal arrives -
the sweeper's orphan rule only poisons a token no signal came for, and a signal that does come
after all revives it (in-memory backend: the clock moves by days)."""

from __future__ import annotations

from datetime import timedelta

from bus import Bus, Command, Context, Endpoint
from bus.adapters.memory import InMemoryStorage
from bus.hosting.worker import Worker
from bus.seams import Seams
from bus.testing.seamed import seamed_bus
from tests.protocol.test_scheduling import _Clock

DAY = 24 * 3600.0


class Remind(Command):
    ref: str


def build(clock: _Clock) -> tuple[Bus, list[str]]:
    desk = Endpoint("desk")
    reminded: list[str] = []

    @desk.handles(Remind, partition=lambda m: m.ref)
    def remind(message: Remind, ctx: Context) -> None:
        reminded.append(message.ref)

    bus = seamed_bus(Seams(clock=clock.now), InMemoryStorage(hooks=clock), [desk], prefix="p")
    bus.provision()
    return bus, reminded


def test_a_send_scheduled_beyond_the_orphan_age_is_processed_when_due() -> None:
    clock = _Clock()
    bus, reminded = build(clock)
    worker = Worker(bus, "desk")
    bus.send(Remind(ref="in-ten-days"), delay=timedelta(days=10))
    for _ in range(10):  # maintenance runs every day meanwhile
        clock.t += DAY
        bus.sweeper().sweep()
        while worker.poll_once():
            pass
    clock.t += 60
    while worker.poll_once():
        pass
    assert reminded == ["in-ten-days"]
    assert bus.poisoned("desk").entries() == []  # never presumed an orphan


def test_a_signal_stuck_longer_than_the_orphan_age_is_still_processed() -> None:
    clock = _Clock()
    bus, reminded = build(clock)
    bus.send(Remind(ref="backlog"))
    clock.t += 8 * DAY  # the endpoint was down for eight days
    report = bus.sweeper().sweep()
    assert report.orphan_tokens_parked == 1  # no signal seen yet: presumed an orphan
    worker = Worker(bus, "desk")
    while worker.poll_once():
        pass
    assert reminded == ["backlog"]  # the signal came after all
    [letter] = bus.poisoned("desk").entries()
    assert not letter.replayable  # its entry is stale now: the message was processed


class Wait(Command):
    ref: str


def test_a_released_deferral_whose_signal_was_lost_is_never_presumed_an_orphan() -> None:
    """A release makes the token live and then sends its signal; a crash between the two
    leaves the signal to the sweeper, which re-sends it from the token. Before, the re-send
    stopped at the orphan age and the token was then poisoned as a presumed orphan: with no
    signal to come, the message was lost (the simulation found it, with a short orphan age)."""
    clock = _Clock()
    desk = Endpoint("desk")
    runs: list[int] = []

    @desk.handles(Wait, partition=lambda m: m.ref)
    def wait(message: Wait, ctx: Context) -> None:
        runs.append(ctx.deferrals)
        if ctx.deferrals == 0:
            ctx.defer()

    bus = seamed_bus(Seams(clock=clock.now), InMemoryStorage(hooks=clock), [desk], prefix="p")
    bus.provision()
    worker = Worker(bus, "desk")
    message_id = bus.send(Wait(ref="w"))
    while worker.poll_once():
        pass
    token = bus.parts.inbox.find("desk", message_id)
    assert token is not None and bus.parts.inbox.release(token, clock.now()) is not None  # no send
    clock.t += 8 * DAY  # nothing came for longer than the orphan age
    report = bus.sweeper().sweep()
    assert (report.orphan_tokens_parked, report.released_signals_resent) == (0, 1)
    while worker.poll_once():
        pass
    assert runs == [0, 1]
    assert bus.poisoned("desk").entries() == []
