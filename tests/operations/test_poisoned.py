"""Poisoned messages: list, replay exactly once, purge - on the in-memory backend and Azurite,
and the ``python -m bus dlq`` commands against Azurite."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from bus import Bus
from bus.adapters.memory import Fault, InMemoryStorage, NoFaults
from bus.operations.cli import main
from bus.protocol.poison.poisoned import ReplayResult
from bus.protocol.poison.queue import PoisonQueue
from bus.protocol.safeguards import Safeguards
from bus.protocol.tokens.inbox import TokenState
from bus.seams import Seams
from bus.storage import NotFound, QueueMessage, Storage, StorageError
from bus.testing import drain, seamed_bus
from tests.support import dlq_app
from tests.support.dlq_app import Charge


@pytest.fixture(autouse=True)
def _failing() -> Iterator[None]:
    dlq_app.FAILING["on"] = True
    yield
    dlq_app.FAILING["on"] = True


def charged(bus: Bus, order_id: str) -> int:
    try:
        row = bus.storage.tables.get(bus.names.state_table("payments"), order_id, "charge")
    except NotFound:
        return 0
    return int(row.properties["times"])  # type: ignore[arg-type]


def poisoned(bus: Bus, order_id: str) -> str:
    bus.send(Charge(order_id=order_id, amount=7))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    [letter] = bus.poisoned("payments").entries()
    assert letter.token is TokenState.POISONED and letter.replayable
    assert letter.entry.exception == f"RuntimeError: gateway down for {order_id}"
    assert letter.entry.dequeue_count == 2 and "max delivery count" in letter.entry.reason
    return letter.id


def test_replay_processes_a_poisoned_message_exactly_once(storage: Storage, prefix: str) -> None:
    bus = dlq_app.build(storage, prefix)
    entry = poisoned(bus, "o1")
    dlq_app.FAILING["on"] = False  # the gateway is back
    letters = bus.poisoned("payments")
    assert letters.replay({entry}) == {entry: ReplayResult.REPLAYED}
    assert letters.replay() == {}  # the entry is gone: a second replay finds nothing
    assert drain(bus).total() == {"processed": 1}
    assert charged(bus, "o1") == 1


@pytest.mark.parametrize("swap", [True, False], ids=["swapped", "break-resend-without-swap"])
def test_a_replay_between_a_poisonings_entry_and_its_park_loses_nothing(
        storage: Storage, prefix: str, swap: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poisoning writes its entry, then poisons the token by the ETag it read before; a replay
    that runs in between finds the token live, sends a copy and removes the entry. It rewrites
    the token live first (a new ETag), so poisoning the token fails and the copy is processed:
    once. Without that (the "resend-without-swap" break) the token is poisoned, the copy is
    dropped and the entry is gone: the message is lost."""
    app = dlq_app.build(storage, prefix)
    bus = seamed_bus(Seams(safeguards=Safeguards(swap_before_resend=swap)), storage,
                     list(app.topology.endpoints.values()), prefix=prefix,
                     settings=app.settings)
    written = PoisonQueue.put
    replays: list[dict[str, ReplayResult]] = []

    def put_then_replay(queue: PoisonQueue, *args: Any, **kwargs: Any) -> None:
        written(queue, *args, **kwargs)
        if not replays:  # the operator replays between the entry and the token write
            dlq_app.FAILING["on"] = False
            replays.append(bus.poisoned("payments").replay())

    monkeypatch.setattr(PoisonQueue, "put", put_then_replay)
    bus.send(Charge(order_id="o9", amount=7))
    drain(bus, fail_fast=False)
    assert list(replays[0].values()) == [ReplayResult.RESENT]
    assert bus.poisoned("payments").entries() == []
    if swap:
        assert charged(bus, "o9") == 1
        assert bus.parts.inbox.all("payments") == []
    else:  # the break: poisoned for good, nothing left to replay
        assert charged(bus, "o9") == 0
        assert [t.state for t in bus.parts.inbox.all("payments")] == [TokenState.POISONED]


@pytest.mark.parametrize("first", [True, False], ids=["poisoned-first",
                                                     "break-purge-around-poisoning"])
def test_a_purge_between_a_poisonings_entry_and_its_park_leaves_nothing(
        storage: Storage, prefix: str, first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A purge that runs between a poisoning's entry and its token write finds the token
    live: it poisons it itself (a new ETag), so the poisoning's own fails, and purges token,
    entry and payload together. Without that (the "purge-around-poisoning" break) the
    poisoning then poisons a token whose entry is gone: nothing can replay or purge it, and
    its payload stays for good. (The simulation found this at seed 513.)"""
    app = dlq_app.build(storage, prefix)
    bus = seamed_bus(Seams(safeguards=Safeguards(poison_before_purge=first)), storage,
                     list(app.topology.endpoints.values()), prefix=prefix,
                     settings=app.settings)
    written = PoisonQueue.put
    purges: list[list[str]] = []

    def put_then_purge(queue: PoisonQueue, *args: Any, **kwargs: Any) -> None:
        written(queue, *args, **kwargs)
        if not purges:  # the operator purges between the entry and the token write
            purges.append(bus.poisoned("payments").purge())

    monkeypatch.setattr(PoisonQueue, "put", put_then_purge)
    bus.send(Charge(order_id="o8", amount=7, note="x" * 70_000))  # its payload: a blob
    drain(bus, fail_fast=False)
    assert len(purges[0]) == 1 and bus.poisoned("payments").entries() == []
    assert charged(bus, "o8") == 0
    if first:
        assert bus.parts.inbox.all("payments") == [] and bus.parts.payloads.refs() == []
    else:  # the break: poisoned for good, with nothing left to purge it by
        assert [t.state for t in bus.parts.inbox.all("payments")] == [TokenState.POISONED]
        assert len(bus.parts.payloads.refs()) == 1


def test_an_interrupted_replay_resends_and_a_stale_entry_is_dropped(storage: Storage,
                                                                    prefix: str) -> None:
    bus = dlq_app.build(storage, prefix)
    entry = poisoned(bus, "o2")
    dlq_app.FAILING["on"] = False
    # A replay that died after reviving the token: the entry is still there, the token live.
    [letter] = bus.poisoned("payments").entries()
    assert letter.entry.envelope is not None
    token = bus.parts.inbox.read("payments", letter.entry.envelope.attempt_id)
    assert token is not None and bus.parts.inbox.revive(token, 0.0, letter.entry.original_body)
    assert bus.poisoned("payments").replay() == {entry: ReplayResult.RESENT}
    bus.storage.queues.send(bus.names.queue("payments"), letter.entry.original_body)  # a copy
    assert drain(bus).total() == {"processed": 1, "duplicate": 1}
    assert charged(bus, "o2") == 1
    # An entry whose message was processed since is stale: replaying removes it, sends nothing.
    bus.parts.poison_queue("payments").put(letter.entry.original_body, reason="again",
                           dequeue_count=1, now=0.0, envelope=letter.entry.envelope)
    [again] = bus.poisoned("payments").entries()
    assert bus.poisoned("payments").replay() == {again.id: ReplayResult.STALE}
    assert bus.storage.queues.depth(bus.names.queue("payments")) == 0


class _FailsOnce(NoFaults):
    """The next call of ``operation`` fails once armed (every call until disarmed, when
    ``lasting``) - refused before it takes effect, or with ``fault``."""

    def __init__(self, service: str, operation: str, *, fault: Fault = Fault.FAIL_BEFORE,
                 lasting: bool = False) -> None:
        self.call = (service, operation)
        self.fault = fault
        self.lasting = lasting
        self.armed = False

    def before_call(self, service: str, operation: str) -> Fault | None:
        if self.armed and (service, operation) == self.call:
            self.armed = self.lasting
            return self.fault
        return None


def test_a_replay_stopped_before_its_signal_is_finished_by_the_sweeper(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that made the token live and then could not send the signal (a send that
    failed, a process that died), with nobody replaying again: the token carries the signal,
    and the sweeper sends it once it has waited ``release_resend_seconds``, as for a release -
    it is never a live token that nothing will ever signal."""
    hooks = _FailsOnce("queue", "send")
    bus = dlq_app.build(InMemoryStorage(hooks=hooks), "t")
    entry = poisoned(bus, "o7")
    dlq_app.FAILING["on"] = False
    hooks.armed = True
    with pytest.raises(StorageError):
        bus.poisoned("payments").replay({entry})
    assert drain(bus).total() == {}  # no signal went out
    assert bus.sweeper().sweep().released_signals_resent == 0  # not yet: it may still come
    later = time.time() + bus.settings.release_resend_seconds + 1
    monkeypatch.setattr(bus.parts, "clock", lambda: later)
    assert bus.sweeper().sweep().released_signals_resent == 1
    assert drain(bus).total() == {"processed": 1}
    assert charged(bus, "o7") == 1


def test_a_signal_the_host_moved_is_adopted_and_replayed(storage: Storage,
                                                         prefix: str) -> None:
    bus = dlq_app.build(storage, prefix, crash_retry_delays=())  # no automatic retry
    host_moves(bus, "o3")
    [letter] = bus.poisoned("payments").entries()  # adopted: an entry of the bus's own
    assert "by the host" in letter.entry.reason and letter.token is TokenState.POISONED
    assert bus.poisoned("payments").replay() == {letter.id: ReplayResult.REPLAYED}
    assert drain(bus).total() == {"processed": 1}
    assert charged(bus, "o3") == 1


def test_a_signal_the_host_moved_is_retried_automatically(storage: Storage,
                                                           prefix: str) -> None:
    """What the host moved is a crash (the bus poisons a handler's failure itself): adopted,
    it is sent again after its retry's wait, audited, and handled once."""
    bus = dlq_app.build(storage, prefix, crash_retry_delays=(0.0,))
    message = host_moves(bus, "o4")
    assert bus.poisoned("payments").entries() == []  # adopted: retried, not an entry
    [record] = bus.audit_trail()
    assert (record.action, record.target["messages"], record.target["retry"]) == (
        "retry", [message_id_of(message.body)], 1)
    assert drain(bus).total() == {"processed": 1}
    assert charged(bus, "o4") == 1
    assert drain(bus).total() == {}


def host_moves(bus: Bus, order: str) -> QueueMessage:
    """Send a Charge, then do what the Functions host does with a message whose deliveries
    ran out: copy it to <queue>-poison unchanged and delete it; the message it moved."""
    dlq_app.FAILING["on"] = False
    bus.send(Charge(order_id=order, amount=3))
    [message] = bus.storage.queues.receive(bus.names.queue("payments"), max_messages=1,
                                           lease=30)
    bus.storage.queues.send(bus.names.poison_queue("payments"), message.body)
    bus.storage.queues.delete(bus.names.queue("payments"), message)
    return message


def message_id_of(body: str) -> str:
    from bus.envelope import decode_signal

    return decode_signal(body).message_id


def test_what_an_adoption_that_failed_left_is_shown_again_at_once() -> None:
    """An adoption that fails half-way (storage trouble) makes the host's messages it had
    leased visible again at once, as it does the bus's own entries: hidden for the peek
    lease, no other reader could adopt them, and each expires after 7 days unless adopted."""
    hooks = _FailsOnce("table", "get")
    bus = dlq_app.build(InMemoryStorage(hooks=hooks), "t")
    dlq_app.FAILING["on"] = False
    queue, poison = bus.names.queue("payments"), bus.names.poison_queue("payments")
    bus.send_many([Charge(order_id="o8", amount=8), Charge(order_id="o9", amount=9)])
    for message in bus.storage.queues.receive(queue, max_messages=2, lease=30):
        bus.storage.queues.send(poison, message.body)  # the host gave up on both
        bus.storage.queues.delete(queue, message)
    hooks.armed = True  # the first one's token read fails
    with pytest.raises(StorageError):
        bus.poisoned("payments").adopt()
    assert len(bus.storage.queues.receive(poison, max_messages=32, lease=30)) == 2


def test_an_adoption_with_nothing_to_adopt_hides_no_entry() -> None:
    """Maintenance adopts on every pass. With nothing to adopt it only peeks: a receive
    whose answer is lost leases what it returned for the peek lease, and passes every few
    seconds whose receives lost their answers kept an entry hidden from the operator's
    purge for as long as they ran."""
    hooks = _FailsOnce("queue", "receive", fault=Fault.FAIL_AFTER, lasting=True)
    bus = dlq_app.build(InMemoryStorage(hooks=hooks), "t")
    entry = poisoned(bus, "o10")
    hooks.armed = True  # every receive takes effect and loses its answer
    assert bus.poisoned("payments").adopt() == 0
    hooks.armed = False
    assert bus.poisoned("payments").purge({entry}) == [entry]


def test_purge_removes_the_entry_and_its_parked_token(storage: Storage, prefix: str) -> None:
    bus = dlq_app.build(storage, prefix)
    entry = poisoned(bus, "o4")
    [letter] = bus.poisoned("payments").entries()
    assert bus.poisoned("payments").purge({entry}) == [entry]
    assert bus.poisoned("payments").entries() == []
    dlq_app.FAILING["on"] = False
    bus.storage.queues.send(bus.names.queue("payments"), letter.entry.original_body)
    assert drain(bus).total() == {"duplicate": 1}  # a late copy of a purged message does nothing
    assert charged(bus, "o4") == 0


def test_purge_removes_a_token_poisoned_as_a_presumed_orphan(storage: Storage,
                                                              prefix: str) -> None:
    # A replay revived the token but its signal was never sent; the sweeper then poisoned the
    # live token as a presumed orphan. Purging the entry must take that token too: left, it
    # stays a presumed orphan for good, with nothing left to replay.
    bus = dlq_app.build(storage, prefix)
    entry = poisoned(bus, "o5")
    [letter] = bus.poisoned("payments").entries()
    assert letter.entry.envelope is not None
    token = bus.parts.inbox.read("payments", letter.entry.envelope.attempt_id)
    assert token is not None and bus.parts.inbox.revive(token, 1.0, letter.entry.original_body)
    token = bus.parts.inbox.read("payments", letter.entry.envelope.attempt_id)
    assert token is not None and bus.parts.inbox.poison(token, 2.0, orphan=True)
    assert bus.poisoned("payments").purge({entry}) == [entry]
    assert bus.parts.inbox.read("payments", letter.entry.envelope.attempt_id) is None


class _ReleaseFails(NoFaults):
    """The next ``times`` releases of leased entries (extends) fail once armed."""

    def __init__(self) -> None:
        self.times = 0

    def before_call(self, service: str, operation: str) -> Fault | None:
        if self.times and (service, operation) == ("queue", "extend"):
            self.times -= 1
            return Fault.FAIL_BEFORE
        return None


def test_a_release_that_fails_is_tried_again() -> None:
    """Reading the poison queue leases its entries and releases them after; a release that
    fails is tried again (up to 3 times): one transient error does not hide an entry from
    every other reader - the dashboard, ``dlq``, maintenance - for the peek lease."""
    hooks = _ReleaseFails()
    bus = dlq_app.build(InMemoryStorage(hooks=hooks), "t")
    bus.send(Charge(order_id="o5", amount=5))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    hooks.times = 2
    assert len(bus.poisoned("payments").entries()) == 1
    assert hooks.times == 0
    assert len(bus.poisoned("payments").entries()) == 1


def test_a_release_that_keeps_failing_hides_only_its_own_entry() -> None:
    """A release that fails every attempt leaves that entry hidden until its lease runs out,
    and neither fails the read nor keeps the other entries hidden."""
    hooks = _ReleaseFails()
    bus = dlq_app.build(InMemoryStorage(hooks=hooks), "t")
    bus.send(Charge(order_id="o5", amount=5))
    bus.send(Charge(order_id="o6", amount=6))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 2}
    hooks.times = 3  # the first entry's three releases (adoption had nothing to lease)
    assert len(bus.poisoned("payments").entries()) == 2
    assert hooks.times == 0
    assert len(bus.poisoned("payments").entries()) == 1
    assert len(bus.poisoned("payments").entries()) == 1  # the other one is shown again


@pytest.mark.azurite
def test_dlq_commands(azurite_connection: str, prefix: str,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The commands import the app module as `--app` names it; this one builds its bus from
    # the environment at import, as a Functions app does.
    monkeypatch.setenv("DLQ_APP_STORAGE", azurite_connection)
    monkeypatch.setenv("DLQ_APP_PREFIX", prefix)
    importlib.reload(dlq_app)
    try:
        assert dlq_app.bus is not None
        _run_dlq_commands(dlq_app.bus)
    finally:
        monkeypatch.delenv("DLQ_APP_STORAGE")
        importlib.reload(dlq_app)


def _run_dlq_commands(bus: Bus) -> None:
    entry = poisoned(bus, "o5")
    runner = CliRunner()
    app = ["--app", "tests.support.dlq_app"]
    listed = runner.invoke(main, ["dlq", "list", "payments", "--json", *app])
    assert listed.exit_code == 0, listed.output
    [row] = [json.loads(line) for line in listed.output.splitlines()]
    assert row["id"] == entry and row["token"] == "poisoned" and row["message_type"] == "Charge"
    shown = runner.invoke(main, ["dlq", "show", "payments", entry, *app])
    assert shown.exit_code == 0 and "gateway down for o5" in shown.output
    assert runner.invoke(main, ["dlq", "replay", "payments", *app]).exit_code == 2  # no ids
    dlq_app.FAILING["on"] = False
    replayed = runner.invoke(main, ["dlq", "replay", "payments", "--all", *app])
    assert replayed.exit_code == 0 and f"{entry}  replayed" in replayed.output
    assert drain(bus).total() == {"processed": 1} and charged(bus, "o5") == 1
    missing = runner.invoke(main, ["dlq", "replay", "payments", "nope", *app])
    assert missing.exit_code == 1 and "nope  not found" in missing.output
    assert "held entries show again within 60 s" in missing.output  # the peek lease
    dlq_app.FAILING["on"] = True
    poisoned(bus, "o6")
    purged = runner.invoke(main, ["dlq", "purge", "payments", "--all", "--yes", *app])
    assert purged.exit_code == 0 and "1 purged" in purged.output
    assert bus.poisoned("payments").entries() == []
