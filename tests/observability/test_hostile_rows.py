"""Rows the bus's readers did not write - instances, per-minute statistics, alert states -
with any property values a table can hold: the status, the health, the statistics and the
alerts' webhook pass read them as nothing (or as what they can tell) and never raise."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import Bus, Endpoint, Settings
from bus.hosting import alerts
from bus.observability import heartbeat, stats
from bus.operations.overview import endpoint_stats
from bus.storage import Entity
from bus.testing import InMemoryStorage

NOW = 1_900_000_020.0
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                   st.floats(allow_nan=False), st.text(max_size=200))
NAMES = st.sampled_from(["kind", "host", "pid", "version", "endpoints", "started_at",
                         "last_seen", "every", "stopped", "processed", "failed", "total_ms",
                         "time_hist", "critical_hist", "types", "depth", "firing", "since",
                         "notified", "value", "message"])
PROPERTIES = st.dictionaries(NAMES, VALUES, max_size=8)


def _bus() -> Bus:
    bus = Bus(InMemoryStorage(), [Endpoint("desk")],
              settings=Settings(alert_webhook="http://127.0.0.1:9/hook"))
    bus.provision()
    return bus


KEYS = st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/\\#?"),
               min_size=1, max_size=20)  # what a row key may hold


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(KEYS, PROPERTIES), max_size=4))
def test_hostile_rows_are_read_as_nothing_and_nothing_raises(
        rows: list[tuple[str, dict[str, Any]]]) -> None:
    bus = _bus()
    tables = bus.storage.tables
    day = stats.day_partition(NOW)
    for key, props in rows:
        clean = {k: v for k, v in props.items() if v is not None}
        tables.replace(bus.names.instances_table, Entity(heartbeat.PARTITION, key, clean))
        tables.replace(bus.names.instances_table, Entity(alerts.PARTITION, key, clean))
        tables.replace(bus.names.state_table("desk"), Entity(day, f"{int(NOW):010d}~{key}",
                                                             clean))
    for instance in bus.instances():
        assert isinstance(instance.live(NOW), bool)
    bus.health(NOW)
    endpoint_stats(bus, "desk", NOW - 60, NOW + 60)
    alerts.report(bus, [], NOW)  # reads every alert state; the webhook does not answer
