"""A message whose handler committed is never poisoned as expired: its time-to-live is checked
once its partition is claimed, after an unfinished record of it is completed - so a copy that
comes back after its time-to-live (its record waited for room at a full queue) finds its
message processed, and an operator's purge has no entry that could lose the record's sends."""

from __future__ import annotations

from bus import Bus, Command, Context, Endpoint, Settings
from bus.hosting.worker import Worker
from bus.seams import Seams
from bus.testing import InMemoryStorage, drain
from bus.testing.seamed import seamed_bus
from tests.protocol.test_ttl import Clock


class Relay(Command):
    ref: str


class Notify(Command):
    ref: str


def build(clock: Clock) -> tuple[Bus, list[str]]:
    desk, bell = Endpoint("desk"), Endpoint("bell", max_queue_depth=1)
    rung: list[str] = []

    @desk.handles(Relay, partition=lambda m: m.ref)
    def relay(message: Relay, ctx: Context) -> None:
        ctx.state.put("relayed", {"ref": message.ref})
        ctx.send(Notify(ref=message.ref))

    @bell.handles(Notify, partition=lambda m: m.ref)
    def notify(message: Notify, ctx: Context) -> None:
        rung.append(message.ref)

    bus = seamed_bus(Seams(clock=clock), InMemoryStorage(), [desk, bell],
                     settings=Settings(depth_check_seconds=0))
    bus.provision()
    return bus, rung


def test_a_committed_message_past_its_ttl_is_completed_not_poisoned() -> None:
    clock = Clock()
    bus, rung = build(clock)
    bus.send(Notify(ref="first"))  # the bell's queue is full
    bus.send(Relay(ref="r1"), ttl=60)
    desk = Worker(bus, "desk", retry_delay=0)
    assert desk.poll_once()  # committed, waiting for room: released
    assert "processed" not in desk.outcomes
    assert bus.read_state("desk", "r1", "relayed") == {"ref": "r1"}

    clock.t += 61  # its next delivery comes after its time-to-live
    assert desk.poll_once()  # the bell is still full: it waits again
    assert "expired" not in desk.outcomes
    assert bus.poisoned("desk").entries() == []  # not "expired": its handler ran
    assert bus.poisoned("desk").purge() == []  # nothing an operator could purge

    drain(bus, fail_fast=False)  # room at the bell: the record's Notify goes out
    assert sorted(rung) == ["first", "r1"]
    assert bus.poisoned("desk").entries() == []
