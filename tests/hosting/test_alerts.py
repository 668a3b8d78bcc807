"""Each alert condition fires on Azurite - poisoned, unserved, critical time, queue depth, stuck
session - through a maintenance pass: counted in ``eobus.alerts``, logged, and sent to a
webhook when it starts and when it stops to hold (once, however many passes run)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.adapters.azure import AzureStorage
from bus.hosting import alerts
from bus.hosting.maintenance import maintenance_pass
from bus.observability import Telemetry
from bus.observability.heartbeat import Heartbeat
from bus.storage import Storage
from bus.testing import drain

pytestmark = pytest.mark.azurite

FAILING = {"on": True}


class Charge(Command):
    order: str
    n: int


class Webhook:
    """A local HTTP endpoint that keeps what is POSTed to it; ``status`` is its answer."""

    def __init__(self) -> None:
        self.posted: list[dict[str, object]] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                hook.posted.append(json.loads(self.rfile.read(length)))
                self.send_response(hook.status)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.server.shutdown()


def build(storage: Storage, prefix: str, reader: InMemoryMetricReader,
          **settings: object) -> Bus:
    payments = Endpoint("payments", retry=RetryPolicy(delays=(0.0,)), reorder_window=0.5)

    @payments.handles(Charge, partition=lambda m: m.order, session=lambda m: m.order)
    def charge(message: Charge, ctx: Context) -> None:
        if FAILING["on"] and message.n == 1:
            raise RuntimeError("gateway down")

    bus = Bus(storage, [payments], prefix=prefix,
              settings=Settings(max_delivery_count=2, **settings),  # type: ignore[arg-type]
              telemetry=Telemetry(meter_provider=MeterProvider(metric_readers=[reader])))
    bus.provision()
    return bus


def counted(reader: InMemoryMetricReader) -> dict[tuple[str, str], int]:
    """``eobus.alerts`` by (condition, endpoint), summed since the start."""
    found: dict[tuple[str, str], int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "eobus.alerts":
                    continue
                for point in metric.data.data_points:
                    key = (str(point.attributes["eobus.alert.condition"]),
                           str(point.attributes["messaging.destination.name"]))
                    found[key] = int(point.value)
    return found


@pytest.fixture(autouse=True)
def _failing() -> Iterator[None]:
    FAILING["on"] = True
    yield
    FAILING["on"] = True


def test_each_condition_fires_and_is_told_once_per_change(
        azurite_connection: str, prefix: str, webhook: Webhook,
        caplog: pytest.LogCaptureFixture) -> None:
    reader = InMemoryMetricReader()
    bus = build(AzureStorage.from_connection_string(azurite_connection), prefix, reader,
                alert_critical_seconds=1.0, alert_queue_depth=1, alert_webhook=webhook.url)
    assert alerts.evaluate(bus) == []  # a quiet bus
    for n in (1, 2, 3):  # 1 is poisoned; 2 and 3 wait in its session behind the gap
        bus.send(Charge(order="o", n=n))
    drain(bus, fail_fast=False)
    bus.send(Charge(order="p", n=2))  # two messages wait, nobody serves the endpoint
    bus.send(Charge(order="q", n=2))
    time.sleep(1.2)  # past the critical time and the reorder window
    report = maintenance_pass(bus)
    found = {alert.condition: alert for alert in report.alerts}
    assert set(found) == {"poisoned", "unserved", "critical_time", "queue_depth",
                          "stuck_session"}
    assert (found["poisoned"].value, found["unserved"].value, found["queue_depth"].value,
            found["stuck_session"].value) == (1, 2, 2, 1)
    assert found["critical_time"].value > 1.0
    assert counted(reader) == {(condition, "payments"): 1 for condition in found}
    assert all(f"bus alert {condition} at payments" in caplog.text for condition in found)
    assert sorted((p["condition"], p["state"]) for p in webhook.posted) == sorted(
        (condition, "firing") for condition in found)
    maintenance_pass(bus)  # the same conditions: counted and logged again, not sent again
    assert counted(reader) == {(condition, "payments"): 2 for condition in found}
    assert len(webhook.posted) == 5
    # A worker serves the endpoint now, and the poison entry is purged: two stop holding.
    beat = Heartbeat(bus.storage.tables, bus.names.instances_table, "worker", 10.0,
                     time.time, instance="w1")
    beat._endpoints["payments"] = 1
    beat.beat()
    bus.poisoned("payments").purge()
    report = maintenance_pass(bus)
    assert {a.condition for a in report.alerts} >= {"critical_time", "queue_depth"}
    assert {"poisoned", "unserved"} & {a.condition for a in report.alerts} == set()
    assert sorted((p["condition"], p["state"]) for p in webhook.posted[5:]) == [
        ("poisoned", "resolved"), ("unserved", "resolved")]
    assert webhook.url not in caplog.text  # the URL is a secret


def test_a_webhook_that_refuses_is_tried_again_next_pass(
        azurite_connection: str, prefix: str, webhook: Webhook,
        caplog: pytest.LogCaptureFixture) -> None:
    bus = build(AzureStorage.from_connection_string(azurite_connection), prefix,
                InMemoryMetricReader(), alert_queue_depth=1, alert_webhook=webhook.url,
                heartbeat_seconds=None, alert_critical_seconds=None)
    bus.send(Charge(order="p", n=2))
    bus.send(Charge(order="q", n=2))
    webhook.status = 503
    assert [a.condition for a in maintenance_pass(bus).alerts] == ["queue_depth"]
    assert "webhook refused firing queue_depth~payments" in caplog.text
    webhook.status = 200
    maintenance_pass(bus)
    maintenance_pass(bus)
    assert [(p["condition"], p["state"]) for p in webhook.posted] == [
        ("queue_depth", "firing")] * 2  # refused once, then sent once


def test_an_unserved_endpoint_is_not_flagged_without_heartbeats(
        azurite_connection: str, prefix: str) -> None:
    bus = build(AzureStorage.from_connection_string(azurite_connection), prefix,
                InMemoryMetricReader(), heartbeat_seconds=None)
    bus.send(Charge(order="p", n=2))
    assert [a.condition for a in alerts.evaluate(bus)] == []
