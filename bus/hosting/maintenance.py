"""One maintenance pass: what every deployment runs on a timer (the Functions app every five
minutes, a program of its own on a schedule of its own; docs/operating.md, "Maintenance").

Each part runs on its own, so one that fails (storage trouble, a record it cannot finish now)
never keeps the others from running; what it could not do waits for the next pass. Adoption
comes first: what the Functions host moved to a poison queue itself expires with the queue's
time-to-live (7 days) unless adopted, and the other parts can wait.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from bus.bus import Bus
from bus.hosting import alerts
from bus.observability import heartbeat, stats
from bus.observability.heartbeat import EndpointHealth
from bus.protocol.upkeep.sweeper import SweepReport

log = logging.getLogger("bus.maintenance")


@dataclass
class MaintenanceReport:
    adopted: dict[str, int] = field(default_factory=dict)
    """Per endpoint: signals the host had poisoned itself, now entries of the bus's own."""
    recovered: dict[str, int] = field(default_factory=dict)
    """Per endpoint: stalled outbox records finished."""
    sweep: SweepReport | None = None
    ledger_forgotten: int = 0
    """Send-ledger rows older than ``Settings.ledger_retention_seconds`` removed."""
    stats_forgotten: int = 0
    """Rows of per-minute statistics older than ``Settings.stats_retention_days`` removed."""
    instances_forgotten: int = 0
    """Heartbeat rows of instances last seen over a day ago removed (``heartbeat``)."""
    alerts: list[alerts.Alert] = field(default_factory=list)
    """The alert conditions that hold (``bus.hosting.alerts``), each counted in the
    ``eobus.alerts`` metric and logged; with a webhook, their changes sent."""
    sessions_released: dict[str, int] = field(default_factory=dict)
    """Per endpoint that skips gaps: first waiting copies of sessions whose gap outlasted the
    reorder window, released to move their session on."""
    failed: list[str] = field(default_factory=list)
    """The parts that failed this pass (each logged with its exception)."""


def maintenance_pass(bus: Bus, stalled_seconds: float = 300.0) -> MaintenanceReport:
    """Adopt host-poisoned signals, sweep (send marks past their retention included), finish
    stalled outbox records, move sessions on past gaps older than their endpoint's reorder
    window (``skip_gaps``; reported otherwise), forget old send-ledger rows, old statistics
    and instances not seen for a day, and check the alert conditions
    (``bus.hosting.alerts``), each part on its own. Safe at any time and from
    several processes at once."""
    report = MaintenanceReport()
    endpoints = list(bus.topology.endpoints)
    for name in endpoints:
        try:
            report.adopted[name] = bus.poisoned(name).adopt()
        except Exception:
            _failed(report, f"adopting at {name}")
    try:
        report.sweep = bus.sweeper().sweep()
    except Exception:
        _failed(report, "the sweep")
    for name in endpoints:
        try:
            report.recovered[name] = bus.parts.outbox_driver(name).recover(stalled_seconds)
        except Exception:
            _failed(report, f"recovering at {name}")
    for name in endpoints:
        if not bus.topology.endpoints[name].has_sessions:
            continue
        try:
            report.sessions_released[name] = bus.sessions(name).release_overdue()
        except Exception:
            _failed(report, f"moving sessions on at {name}")
    try:
        report.ledger_forgotten = bus.parts.ledger.forget(bus.settings.ledger_retention_seconds)
    except Exception:
        _failed(report, "forgetting old send-ledger rows")
    for name in endpoints:  # also when this app writes none now: old days still go
        try:
            report.stats_forgotten += stats.forget(
                bus.storage.tables, bus.names.state_table(name), bus.parts.clock(),
                bus.settings.stats_retention_days)
        except Exception:
            _failed(report, f"forgetting old statistics at {name}")
    try:
        now = bus.parts.clock()
        health = bus.health(now)
        _record_depths(bus, health, now)
        report.alerts = alerts.evaluate(bus, now, health)
        alerts.report(bus, report.alerts)
    except Exception:
        _failed(report, "checking the alert conditions")
    try:
        report.instances_forgotten = heartbeat.forget(
            bus.storage.tables, bus.names.instances_table, bus.parts.clock())
    except Exception:
        _failed(report, "forgetting instances not seen for a day")
    return report


def _record_depths(bus: Bus, health: list[EndpointHealth], now: float) -> None:
    """Each endpoint's queue length, in its statistics (the dashboard's queue-length chart and
    time to drain); not while statistics are off."""
    if bus.settings.stats_flush_seconds is None:
        return
    for item in health:
        if item.depth is not None and not item.reader:
            stats.record_depth(bus.storage.tables, bus.names.state_table(item.endpoint), now,
                               item.depth)


def _failed(report: MaintenanceReport, part: str) -> None:
    log.exception("bus maintenance: %s failed; the next pass tries again", part)
    report.failed.append(part)
