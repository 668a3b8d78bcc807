"""The simulation drives every public operation: the list comes from the code
(``bus.testing.simulate.surface``), so an operation added without a workload that drives it
fails here."""

from __future__ import annotations

import json
from collections import Counter

import click
import pytest

from bus.operations.dlq import dlq
from bus.operator import Operator
from bus.testing.simulate import surface
from bus.testing.simulate.__main__ import main
from bus.testing.simulate.run import run_once

pytestmark = pytest.mark.sim

SURFACE_SEED = 1089
SURFACE_RUNS = 40
"""Runs from ``SURFACE_SEED`` that drive every operation (``--surface`` prints the counts;
docs/testing.md says how to find a new range when the workload changes)."""


def test_the_list_covers_each_way_in() -> None:
    pytest.importorskip("fastapi")
    listed = surface.operations()
    for expected in ("Bus.send(ttl=)", "Bus.send_once_many(origin=)", "Context.defer",
                     "Context.release_deferred(deferrals=)", "PartitionState.delete",
                     "SessionView.close", "Endpoint(skip_gaps=)", "Endpoint.handles(session=)",
                     "PoisonedMessages.purge(ids=)", "PoisonedMessages.replay(drop_expiry=)",
                     "Sessions.skip(partition=)", "Sweeper.sweep", "maintenance_pass",
                     "python -m bus dlq replay --drop-expiry",
                     "python -m bus sessions close --partition",
                     "dashboard POST /api/poisoned/{endpoint}/replay drop_expiry=",
                     "dashboard POST /api/sessions/{endpoint}/{session}/skip partition="):
        assert expected in listed, expected


def test_every_exemption_names_something_public() -> None:
    """An exemption for a name that is gone (renamed, removed) would hide its successor."""
    pytest.importorskip("fastapi")
    public = set(surface.public())
    assert sorted(set(surface.EXEMPT) - public) == []


def test_a_new_method_or_option_is_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    def rewind(self: Operator, endpoint: str, *, hard: bool = False) -> None:
        """An operation nobody simulates."""

    monkeypatch.setattr(Operator, "rewind", rewind, raising=False)
    listed = surface.operations(dashboard=False)
    assert {"Bus.rewind", "Bus.rewind(hard=)"} <= set(listed)


def test_a_new_command_or_flag_is_listed() -> None:
    @click.command("rewind")
    @click.argument("endpoint")
    @click.option("--hard", is_flag=True)
    def rewind(endpoint: str, hard: bool) -> None:
        """A command nobody simulates."""

    dlq.add_command(rewind)
    try:
        listed = surface.operations(dashboard=False)
    finally:
        dlq.commands.pop("rewind")
    assert {"python -m bus dlq rewind", "python -m bus dlq rewind --hard"} <= set(listed)


def test_counting_counts_calls_and_options_and_puts_everything_back() -> None:
    from bus import Bus, Endpoint
    from bus.adapters.memory import InMemoryStorage

    bus = Bus(InMemoryStorage(), [Endpoint("a")])
    bus.provision()
    original = Operator.paused
    counts: Counter[str] = Counter()
    with surface.counting(counts):
        bus.paused("a")
        bus.pause("a", 5.0)
        bus.pause("a", 5.0, reason="deploying")
        bus.pause("a", 5.0, reason="")  # the default given: not the option exercised
    assert (counts["Bus.paused"], counts["Bus.pause"], counts["Bus.pause(reason=)"]) == (1, 3, 1)
    assert Operator.paused is original


@pytest.mark.sim_long
def test_the_simulation_drives_every_public_operation() -> None:
    pytest.importorskip("fastapi")
    counts: Counter[str] = Counter()
    with surface.counting(counts):
        for seed in range(SURFACE_SEED, SURFACE_SEED + SURFACE_RUNS):
            assert run_once(seed, routes=counts).violations == [], seed
    undriven = [operation for operation in surface.operations() if not counts[operation]]
    assert undriven == [], (
        f"public operations no run from {SURFACE_SEED} to {SURFACE_SEED + SURFACE_RUNS - 1} "
        "drove: add them to the simulation's workload (bus/testing/simulate)")


def test_command_line_prints_the_surface(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    assert main(["--surface", "--runs", "1", "--seed", str(SURFACE_SEED)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary["surface"]) == set(surface.operations())
    assert summary["undriven"] == sorted(
        name for name, count in summary["surface"].items() if count == 0)
    assert sum(summary["surface"].values()) > 0
