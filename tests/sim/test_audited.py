"""The simulation checks that every operator action that completed has its audit record
(bus.testing.simulate.audited): a bus that stops recording fails the check, and a run drives
every kind of action."""

from __future__ import annotations

import pytest

from bus.audit import ACTIONS, AuditTrail
from bus.testing.simulate import run_once

pytestmark = pytest.mark.sim


def test_a_run_with_actions_left_unrecorded_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AuditTrail, "record", lambda self, action, endpoint, target: None)
    result = run_once(1)
    assert any("audit record(s) of them" in v for v in result.violations), result.violations


@pytest.mark.sim_long  # in make test: the loop runs these seeds' protocol checks already
def test_the_runs_that_cover_the_surface_take_every_kind_of_action() -> None:
    from bus.testing.simulate import audited

    seen: set[str] = set()
    with audited.completions() as acted:
        for seed in range(1, 6):
            assert run_once(seed).violations == []
            seen |= set(acted)
    assert seen == set(ACTIONS)
