"""A session key whose messages map to several partitions (the session function and the
partition function disagree) has a session row in each: an operator's ``get``, ``skip`` and
``close`` name the partition then, instead of acting on whichever row a query returns first."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bus import Bus, Command, Context, Endpoint
from bus.errors import AmbiguousSession
from bus.operations.cli import main
from bus.testing import InMemoryStorage, drain

cli_bus: Bus | None = None  # the bus ``python -m bus sessions --app <module>:cli_bus`` finds


class Line(Command):
    customer: str
    order: str


def build() -> Bus:
    desk = Endpoint("desk")

    @desk.handles(Line, partition=lambda m: m.order, session=lambda m: m.customer)
    def line(message: Line, ctx: Context) -> None:
        pass

    bus = Bus(InMemoryStorage(), [desk])
    bus.provision()
    bus.send(Line(customer="c1", order="o1"))
    bus.send(Line(customer="c1", order="o2"))
    drain(bus)
    return bus


def test_an_ambiguous_session_is_named_with_its_partition() -> None:
    bus = build()
    sessions = bus.sessions("desk")
    with pytest.raises(AmbiguousSession, match="'o1', 'o2'"):
        sessions.get("c1")
    with pytest.raises(AmbiguousSession):
        sessions.close("c1")
    assert [s.closed for s in sessions.list()] == [False, False]  # nothing done
    info = sessions.get("c1", partition="o2")
    assert info is not None and info.partition == "o2"
    sessions.close("c1", partition="o2")
    closed = {s.partition: s.closed for s in sessions.list()}
    assert closed == {"o1": False, "o2": True}
    assert sessions.get("c1", partition="o9") is None


def test_the_cli_asks_for_the_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    bus = build()
    monkeypatch.setattr(f"{__name__}.cli_bus", bus)
    app = ["--app", f"{__name__}:cli_bus"]
    runner = CliRunner()
    refused = runner.invoke(main, ["sessions", "close", "desk", "c1", "--yes", *app])
    assert refused.exit_code == 2 and "--partition" in refused.output
    done = runner.invoke(main, ["sessions", "close", "desk", "c1", "--partition", "o1",
                                "--yes", *app])
    assert done.exit_code == 0, done.output
    assert {s.partition: s.closed for s in bus.sessions("desk").list()} == {
        "o1": True, "o2": False}

