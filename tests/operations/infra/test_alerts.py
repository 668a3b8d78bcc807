"""The Azure Monitor alert rules (infra/app/alerts.bicep): one per alert condition of
``bus.hosting.alerts``, each querying the metric the bus emits under the names Microsoft's
exporter gives it. The exporter's own conversion (azure-monitor-opentelemetry-exporter, the
app's pinned version) turns a recorded ``eobus.alerts`` point into the telemetry item
Application Insights stores as a ``customMetrics`` row: its name, and its attributes as
``customDimensions``. The query itself is not run here (no Azure Monitor); its field names are
checked against that item."""

from __future__ import annotations

import re

import pytest

from bus.hosting.alerts import CONDITIONS
from bus.observability import Telemetry
from bus.observability.conventions import ALERT, DESTINATION
from tests.operations.infra.bicep import INFRA, MAIN, modules, parse

ALERTS = INFRA / "app" / "alerts.bicep"


def rules() -> dict[str, object]:
    return parse(ALERTS)["resources"]["rules"]["config"]  # type: ignore[no-any-return]


def test_there_is_a_rule_for_each_condition_the_bus_checks() -> None:
    conditions = parse(ALERTS)["variables"]["conditions"]["value"]
    assert [c["name"] for c in conditions] == list(CONDITIONS)
    assert all(1 <= c["severity"] <= 3 and c["description"] for c in conditions)
    loop = rules()["loop_type"]["detail"]  # type: ignore[index]
    assert (loop["item_name"], loop["array_name"]) == ("condition", "conditions")


def test_each_rule_counts_its_condition_per_endpoint_and_resolves_itself() -> None:
    body = rules()["config"]  # type: ignore[index]
    assert body["kind"] == "LogAlert"
    properties = body["properties"]
    assert properties["autoMitigate"] is True and properties["enabled"] is True
    assert (properties["evaluationFrequency"], properties["windowSize"]) == ("PT5M", "PT15M")
    [criterion] = properties["criteria"]["allOf"]
    query = criterion["query"]
    assert 'where name == "eobus.alerts"' in query
    assert f'customDimensions["{ALERT}"]) == "${{condition.name}}"' in query
    assert f'customDimensions["{DESTINATION}"]' in query
    assert re.search(r"summarize counted = sum\(value\) by endpoint$", query)
    assert criterion["metricMeasureColumn"] == "counted"
    assert [d["name"] for d in criterion["dimensions"]] == ["endpoint"]
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)


def test_the_app_deploys_the_rules_with_optional_receivers() -> None:
    _, params = modules(MAIN)["alerts"]
    assert {"applicationInsightsName", "alertEmail", "alertWebhookUrl"} <= set(params)
    declared = parse(MAIN)["parameters"]
    assert any(d["type"] == "secure" for d in declared["alertWebhookUrl"]["decorators"])
    assert declared["alertEmail"]["default"] == "" and declared["alertWebhookUrl"]["default"] == ""


def test_the_exporter_stores_the_metric_under_the_names_the_rules_query() -> None:
    pytest.importorskip("azure.monitor.opentelemetry.exporter")
    from azure.monitor.opentelemetry.exporter.export.metrics._exporter import (
        APPLICATION_INSIGHTS_METRIC_TEMPORALITIES,
        _convert_point_to_envelope,
    )
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader(preferred_temporality=APPLICATION_INSIGHTS_METRIC_TEMPORALITIES)
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    telemetry.alerted("poisoned", "payments")
    telemetry.alerted("poisoned", "payments")
    data = reader.get_metrics_data()
    assert data is not None
    [metric] = [m for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics
                if m.name == "eobus.alerts"]
    [point] = metric.data.data_points
    envelope = _convert_point_to_envelope(point, metric.name)
    stored = envelope.data.base_data  # type: ignore[union-attr]
    assert stored.metrics[0].name == "eobus.alerts"  # customMetrics.name
    assert stored.metrics[0].value == 2  # a delta: the passes that counted it
    assert stored.properties[ALERT] == "poisoned"  # customDimensions
    assert stored.properties[DESTINATION] == "payments"
