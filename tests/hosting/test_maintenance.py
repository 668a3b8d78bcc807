"""One maintenance pass: adoption first, each part on its own (a part that fails is reported
and logged, the others still run)."""

from __future__ import annotations

from bus import Bus, Settings
from bus.adapters.memory import Fault, NoFaults
from bus.hosting.maintenance import maintenance_pass
from bus.observability import stats
from bus.storage import Entity
from bus.testing import InMemoryStorage
from tests.hosting.test_host_poisoned import build, host_moves_a_bundle


class _TablesDown(NoFaults):
    """Every table query fails (the sweep's and the recovery's scans), queues answer."""

    def __init__(self) -> None:
        self.down = False

    def before_call(self, service: str, operation: str) -> Fault | None:
        if self.down and (service, operation) == ("table", "query"):
            return Fault.FAIL_BEFORE
        return None


def test_adoption_runs_though_the_sweep_and_the_recovery_fail() -> None:
    hooks = _TablesDown()
    bus, _ = build(InMemoryStorage(hooks=hooks), "m")
    host_moves_a_bundle(bus, 3)
    hooks.down = True
    report = maintenance_pass(bus, stalled_seconds=0.0)
    assert report.adopted == {"ticks": 3}
    assert report.sweep is None and report.recovered == {}
    assert report.failed == ["the sweep", "recovering at ticks",
                             "forgetting old send-ledger rows",
                             "forgetting old statistics at ticks",
                             "checking the alert conditions",
                             "forgetting instances not seen for a day"]


def test_a_pass_over_a_healthy_bus_reports_every_part() -> None:
    bus, _ = build(InMemoryStorage(), "m")
    report = maintenance_pass(bus)
    assert report.adopted == {"ticks": 0} and report.recovered == {"ticks": 0}
    assert report.sweep is not None and report.failed == []


def test_old_statistics_go_also_once_statistics_are_turned_off() -> None:
    bus, _ = build(InMemoryStorage(), "m")
    bus = Bus(bus.storage, list(bus.topology.endpoints.values()), prefix="m",
              settings=Settings(stats_flush_seconds=None))
    table = bus.names.state_table("ticks")
    old_day = stats.day_partition(bus.parts.clock() - 8 * 86_400)
    bus.storage.tables.replace(table, Entity(old_day, "0000000000~p", {"processed": 1}))
    assert maintenance_pass(bus).stats_forgotten == 1
    assert list(bus.storage.tables.query(table, old_day)) == []
