"""A message whose handler committed is never poisoned as expired: its time-to-live is checked
once its partition is claimed, after an unfinished record of it is completed - so a copy that
comes back after its time-to-live (its record waited for room at a full queue) finds its
message processed, and an operator's purge has no entry that could lose the record's sends."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from bus import Bus, Command, Context, Endpoint, Settings
from bus.hosting.maintenance import maintenance_pass
from bus.hosting.worker import Worker
from bus.operations.cli import main
from bus.protocol.safeguards import BREAKS, Safeguards
from bus.seams import Seams
from bus.testing import InMemoryStorage, drain
from bus.testing.seamed import seamed_bus
from tests.protocol.test_ttl import Clock

cli_bus: Bus | None = None  # the bus ``python -m bus dlq --app <this module>:cli_bus`` finds


class Relay(Command):
    ref: str


class Notify(Command):
    ref: str


def build(clock: Clock, storage: InMemoryStorage | None = None,
          safeguards: Safeguards | None = None) -> tuple[Bus, list[str]]:
    """The desk relays to a bell whose queue holds one message; on ``storage`` (a new store
    when None: another process of the same app, otherwise)."""
    desk, bell = Endpoint("desk"), Endpoint("bell", max_queue_depth=1)
    rung: list[str] = []

    @desk.handles(Relay, partition=lambda m: m.ref)
    def relay(message: Relay, ctx: Context) -> None:
        ctx.state.put("relayed", {"ref": message.ref})
        ctx.send(Notify(ref=message.ref))

    @bell.handles(Notify, partition=lambda m: m.ref)
    def notify(message: Notify, ctx: Context) -> None:
        rung.append(message.ref)

    bus = seamed_bus(Seams(clock=clock, safeguards=safeguards or Safeguards()),
                     storage or InMemoryStorage(), [desk, bell],
                     settings=Settings(depth_check_seconds=0, crash_retry_delays=()))
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


def moved_by_the_host(bus: Bus, endpoint: str) -> None:
    """What the Functions host does after the last delivery allowed: the signal, unchanged,
    to ``<queue>-poison`` (maintenance then adopts it: its token poisoned)."""
    queue = bus.names.queue(endpoint)
    [message] = bus.storage.queues.receive(queue, max_messages=1, lease=60.0)
    bus.storage.queues.send(bus.names.poison_queue(endpoint), message.body)
    bus.storage.queues.delete(queue, message)


def test_purging_a_committed_message_completes_its_record_or_keeps_the_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A message whose handler committed can still reach the poison queue another way (the
    host moved it after its deliveries ran out while its sends waited for room). Purging its
    entry completes the record first; while that cannot happen (still no room), the entry is
    kept, with why."""
    clock = Clock()
    bus, rung = build(clock)
    bus.send(Notify(ref="first"))  # the bell's queue is full
    bus.send(Relay(ref="r1"))
    assert Worker(bus, "desk", retry_delay=0).poll_once()  # committed, waiting for room
    moved_by_the_host(bus, "desk")
    poisoned = bus.poisoned("desk")
    [entry] = poisoned.entries()  # adopted: token poisoned

    assert poisoned.purge() == []  # no room yet: completing the record fails
    assert "room" in poisoned.refusals[entry.id]
    assert [e.id for e in poisoned.entries()] == [entry.id]
    monkeypatch.setattr(f"{__name__}.cli_bus", bus)  # the CLI says so too
    said = CliRunner().invoke(main, ["dlq", "purge", "desk", "--all", "--yes",
                                     "--app", f"{__name__}:cli_bus"])
    assert said.exit_code == 0 and "0 purged, 1 kept" in said.output
    assert f"{entry.id}  kept: its handler committed and its sends wait for room" in said.output

    drain(bus, endpoints=["bell"])  # room at the bell
    assert poisoned.purge() == [entry.id]  # the record completed, then the entry went
    assert poisoned.refusals == {}
    drain(bus, fail_fast=False)
    assert sorted(rung) == ["first", "r1"]  # the committed handler's Notify was sent


@pytest.mark.parametrize("settle", [True, False], ids=["safeguarded", "purge-unsettled"])
def test_a_purge_never_loses_a_committed_handler_s_sends(settle: bool) -> None:
    """A purge of a committed message's entry while its sends wait for room: completing the
    record first keeps the entry (above), and maintenance sends the Notify once there is
    room. Without it (the break ``purge-unsettled``, which the simulation seldom meets within
    a few seconds) the purge deletes the token, and the Notify is never sent, maintenance or
    not."""
    clock = Clock()
    bus, rung = build(clock, safeguards=None if settle else BREAKS["purge-unsettled"][0])
    bus.send(Notify(ref="first"))  # the bell's queue is full
    bus.send(Relay(ref="r1"))
    assert Worker(bus, "desk", retry_delay=0).poll_once()  # committed, waiting for room
    moved_by_the_host(bus, "desk")
    [entry] = bus.poisoned("desk").entries()
    assert bus.poisoned("desk").purge() == ([] if settle else [entry.id])
    drain(bus, fail_fast=False)  # room at the bell
    clock.t += 600
    assert maintenance_pass(bus, stalled_seconds=300).failed == []
    drain(bus, fail_fast=False)
    assert sorted(rung) == (["first", "r1"] if settle else ["first"])


@pytest.mark.parametrize("recheck", [True, False], ids=["safeguarded", "expire-on-stale-slot"])
def test_a_copy_committed_while_another_reads_its_token_is_not_poisoned_as_expired(
        recheck: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two copies of one message, in two processes whose clocks differ: the late process reads
    the partition's slot (nothing yet), and while it reads the token the other process
    commits the message (its Notify waits for room: the token stays live). Poisoning the late
    copy as expired on the slot it read first would call a committed message expired; it
    reads the slot again and completes the record instead. Without that second read (the
    break ``expire-on-stale-slot``, which the simulation seldom arranges) it does."""
    early, late = Clock(), Clock()
    late.t += 61
    storage = InMemoryStorage()
    first, _ = build(early, storage)
    second, _ = build(late, storage, None if recheck else BREAKS["expire-on-stale-slot"][0])
    first.send(Notify(ref="first"))  # the bell's queue is full
    first.send(Relay(ref="r1"), ttl=60)
    queue = first.names.queue("desk")
    [signal] = storage.queues.receive(queue, max_messages=1, lease=0)
    storage.queues.send(queue, signal.body)  # a second copy of it (a duplicate signal)

    read_many = second.parts.inbox.read_many
    meanwhile = {"done": False}

    def while_the_token_is_read(endpoint: str, keys: list[str], **how: Any) -> object:
        if not meanwhile["done"]:  # the other process, with the other copy, commits it
            meanwhile["done"] = True
            assert Worker(first, "desk", retry_delay=0, batch_size=1).poll_once()
        return read_many(endpoint, keys, **how)

    monkeypatch.setattr(second.parts.inbox, "read_many", while_the_token_is_read)
    Worker(second, "desk", retry_delay=0, batch_size=1).poll_once()
    assert meanwhile["done"] and first.read_state("desk", "r1", "relayed") == {"ref": "r1"}
    reasons = [letter.entry.reason for letter in first.poisoned("desk").entries()]
    if recheck:
        assert reasons == []
    else:  # a committed message called expired: the break's violation
        assert len(reasons) == 1 and "expired" in reasons[0]
