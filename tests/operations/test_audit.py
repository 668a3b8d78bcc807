"""The audit trail (bus.audit): every operator action writes who, what, on which messages and
when before it runs - from the Python API, ``python -m bus audit`` reads it back - and an
action whose record cannot be written does not run. On the in-memory backend and Azurite."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.adapters.memory import Fault, InMemoryStorage, NoFaults
from bus.audit import ACTIONS, MAX_IDS, MAX_TEXT, AuditTrail, acting_as, who
from bus.operations.cli import main
from bus.seams import Seams
from bus.storage import Entity, Storage, StorageError
from bus.testing import drain, seamed_bus

FAILING = {"on": True}


class Charge(Command):
    order: str
    n: int


class Hold(Command):
    order: str


def build(storage: Storage, prefix: str) -> Bus:
    payments = Endpoint("payments", retry=RetryPolicy(delays=(0.0,)))

    @payments.handles(Charge, partition=lambda m: m.order, session=lambda m: m.order)
    def charge(message: Charge, ctx: Context) -> None:
        if FAILING["on"] and message.n == 1:
            raise RuntimeError("gateway down")

    @payments.handles(Hold, partition=lambda m: m.order)
    def hold(message: Hold, ctx: Context) -> None:
        ctx.defer()

    bus = seamed_bus(Seams(clock=Ticking()), storage, [payments], prefix=prefix,
                     settings=Settings(max_delivery_count=2))
    bus.provision()
    return bus


class Ticking:
    """A clock a millisecond later at each reading: the records' order is the actions'."""

    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


@pytest.fixture(autouse=True)
def _failing() -> Iterator[None]:
    FAILING["on"] = True
    yield
    FAILING["on"] = True


def test_every_operator_action_is_recorded_before_it_runs(storage: Storage,
                                                          prefix: str) -> None:
    bus = build(storage, prefix)
    for n in (1, 2):
        bus.send(Charge(order="o", n=n))
    bus.send(Hold(order="h"))
    drain(bus, fail_fast=False)
    [letter] = bus.poisoned("payments").entries()
    assert letter.entry.envelope is not None
    [held] = [d for d in bus.deferred("payments").list() if d.message_type == "Hold"]
    with acting_as("alice@example.com"):
        bus.pause("payments", 30, reason="deploying")
        bus.resume("payments")
        bus.deferred("payments").release(held.message_id, deferrals=held.deferrals)
        bus.sessions("payments").skip("o")
    FAILING["on"] = False
    bus.poisoned("payments").replay({letter.id}, drop_expiry=True)
    bus.poisoned("payments").purge()
    bus.sessions("payments").close("o", partition="o")
    trail = bus.audit_trail()
    assert [r.action for r in trail] == ["close", "purge", "replay", "skip", "release",
                                         "resume", "pause"]  # newest first
    assert {r.action for r in trail} == set(ACTIONS)
    assert {r.who for r in trail[3:]} == {"alice@example.com"}
    assert {r.who for r in trail[:3]} == {who()}  # the process's user and host
    assert all(r.endpoint == "payments" for r in trail)
    close, purge, replay, skip, release, resume, pause = (r.target for r in trail)
    assert pause == {"seconds": 30, "reason": "deploying"} and resume == {}
    assert release == {"message_id": held.message_id, "deferrals": held.deferrals}
    assert skip == {"session": "o"} and close == {"session": "o", "partition": "o"}
    assert replay == {"asked": [letter.id], "entries": [letter.id], "drop_expiry": True,
                      "messages": [letter.entry.envelope.message_id]}
    assert purge == {"all": True, "entries": [], "messages": []}  # nothing left to purge
    assert bus.audit_trail(limit=2) == trail[:2]


class _InsertFails(NoFaults):
    """Refuses the next table insert while armed: the audit record's."""

    armed = False

    def before_call(self, service: str, operation: str) -> Fault | None:
        if self.armed and (service, operation) == ("table", "insert"):
            self.armed = False
            return Fault.FAIL_BEFORE
        return None


def test_an_action_whose_record_cannot_be_written_does_not_run() -> None:
    hooks = _InsertFails()
    bus = build(InMemoryStorage(hooks=hooks), "t")
    hooks.armed = True
    with pytest.raises(StorageError):
        bus.pause("payments", 30)
    assert bus.paused("payments") is None and bus.audit_trail() == []
    bus.pause("payments", 30)  # run again, it is recorded and done
    assert bus.paused("payments") is not None and len(bus.audit_trail()) == 1


def test_a_record_keeps_at_most_max_ids_and_max_text_whatever_it_was_asked() -> None:
    storage = InMemoryStorage()
    storage.tables.create_table("audit")
    trail = AuditTrail(storage.tables, "audit", clock=lambda: 1_900_000_000.0)
    trail.record("purge", "payments", {"asked": {f"m{i:04d}" for i in range(MAX_IDS + 5)}})
    trail.record("pause", "payments", {"seconds": 5, "reason": "x" * 100_000})
    [pause, purge] = trail.recent()  # the same instant: either order
    if pause.action != "pause":
        pause, purge = purge, pause
    assert len(purge.target["asked"]) == MAX_IDS and purge.target["asked_count"] == MAX_IDS + 5
    assert pause.target == {"seconds": 5, "reason": "x" * MAX_TEXT}


def test_the_command_line_prints_the_trail(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support import memory_app

    memory_app.bus.pause("desk", 5, reason="deploying")
    runner = CliRunner()
    result = runner.invoke(main, ["audit", "--json", "--limit", "1", "--app",
                                  "tests.support.memory_app"])
    assert result.exit_code == 0, result.output
    [line] = result.output.splitlines()
    record = json.loads(line)
    assert (record["action"], record["endpoint"], record["who"]) == ("pause", "desk", who())
    assert record["target"] == {"seconds": 5, "reason": "deploying"}
    plain = runner.invoke(main, ["audit", "--app", "tests.support.memory_app"])
    assert plain.exit_code == 0 and " pause desk " in plain.output


def test_a_row_the_trail_did_not_write_is_left_out() -> None:
    """Anyone who may write the table could add a row of their own: it is not shown as a
    record (and breaks nothing)."""
    storage = InMemoryStorage()
    storage.tables.create_table("audit")
    trail = AuditTrail(storage.tables, "audit", clock=lambda: 1_900_000_000.0)
    trail.record("resume", "payments", {})
    [real] = trail.recent()
    for i, properties in enumerate(({}, {"target": "not json", "at": 1.0}, {"target": "[]"},
                                    {"target": "{}", "at": "yesterday"})):
        storage.tables.insert("audit", Entity("2030-03-17", f"0~{i}", properties))
    assert trail.recent() == [real]
