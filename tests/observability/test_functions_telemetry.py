"""bus.hosting.functions.telemetry: where a Functions app's OpenTelemetry goes, by its settings.

The paths that install global providers run in a fresh interpreter each (OpenTelemetry lets a
process set its providers once); the decisions run here with a stand-in for the Azure Monitor
distro. tests/hosting/functions/test_trace_context.py runs the module under Microsoft's worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")  # the app's pins (requirements.txt), not the bus's
pytest.importorskip("opentelemetry.exporter.otlp.json.file")  # requirements-dev.txt

from bus.hosting.functions import telemetry
from bus.hosting.functions.telemetry import configure_telemetry
from tests.support.distro import FakeDistro

ROOT = Path(__file__).resolve().parents[2]



@pytest.fixture
def distro(monkeypatch: pytest.MonkeyPatch) -> FakeDistro:
    fake = FakeDistro()
    monkeypatch.setitem(sys.modules, "azure.monitor.opentelemetry", fake)
    monkeypatch.setattr(telemetry, "_done", {})
    monkeypatch.delitem(sys.modules, "azure_functions_runtime.otel", raising=False)
    return fake


def test_nothing_set_configures_nothing(distro: FakeDistro) -> None:
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    assert configure_telemetry({}) == "OpenTelemetry: no exporter (the API's no-op)"
    assert configure_telemetry({"APPLICATIONINSIGHTS_CONNECTION_STRING": "  ",
                                "BUS_TRACE_DIR": ""}).startswith("OpenTelemetry: no exporter")
    assert distro.calls == [] and trace.get_tracer_provider() is before


def test_a_connection_string_configures_azure_monitor_once(distro: FakeDistro) -> None:
    env = {"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=k"}
    assert configure_telemetry(env) == "Application Insights: configure_azure_monitor()"
    assert "already" in configure_telemetry(env)
    assert distro.calls == [{"connection_string": "InstrumentationKey=k"}]


@pytest.mark.parametrize("value", ["true", "True", "1", " yes "])
def test_the_worker_configures_azure_monitor_when_it_imports_the_app(
        distro: FakeDistro, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setitem(sys.modules, "azure_functions_runtime.otel", types.ModuleType("otel"))
    env = {"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=k",
           "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY": value}
    assert "configured by the Python worker" in configure_telemetry(env)
    assert distro.calls == []


def test_the_worker_setting_alone_configures_nothing_outside_the_worker(
        distro: FakeDistro) -> None:
    """A script importing function_app.py (the demo's client, provisioning) is no worker."""
    env = {"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=k",
           "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY": "true"}
    configure_telemetry(env)
    assert distro.calls == [{"connection_string": "InstrumentationKey=k"}]


def test_the_worker_setting_false_leaves_azure_monitor_to_the_app(
        distro: FakeDistro, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "azure_functions_runtime.otel", types.ModuleType("otel"))
    configure_telemetry({"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=k",
                         "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY": "false"})
    assert len(distro.calls) == 1


def test_a_trace_dir_without_the_file_exporter_says_what_is_missing(
        distro: FakeDistro, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.json.file", None)
    with pytest.raises(RuntimeError, match="opentelemetry-exporter-otlp-json-file"):
        configure_telemetry({"BUS_TRACE_DIR": str(tmp_path)})


def run(script: str, **env: str) -> str:
    """``script`` in a fresh interpreter (its own global providers); its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


SPANS = """
    import os
    from bus.hosting.functions.telemetry import configure_telemetry
    print(configure_telemetry())
    print(configure_telemetry())  # again, as the demo does (its client, then the app)
    from opentelemetry import metrics, trace
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("send orders", kind=trace.SpanKind.PRODUCER,
                                      attributes={"messaging.destination.name": "orders"}):
        with tracer.start_as_current_span("create billing", kind=trace.SpanKind.PRODUCER) as c:
            created = c.get_span_context()
    link = trace.Link(created, {"why": "test"})
    with tracer.start_as_current_span("process billing", kind=trace.SpanKind.CONSUMER,
                                      links=[link]) as span:
        span.set_status(trace.StatusCode.ERROR, "boom")
    metrics.get_meter("test").create_counter("messaging.client.sent.messages").add(2)
    print(os.getpid())
"""


def spans_of(path: Path) -> list[dict[str, Any]]:
    """Every span of an OTLP JSON lines file, with its resource's service.name."""
    spans = []
    for line in path.read_text().splitlines():
        for resource_spans in json.loads(line)["resourceSpans"]:
            resource = {a["key"]: a["value"] for a in resource_spans["resource"]["attributes"]}
            for scope in resource_spans["scopeSpans"]:
                for span in scope["spans"]:
                    spans.append({**span, "service": resource["service.name"]["stringValue"]})
    return spans


def test_a_trace_dir_gets_this_process_s_spans_and_metrics_as_otlp_json_lines(
        tmp_path: Path) -> None:
    out = run(SPANS, BUS_TRACE_DIR=str(tmp_path), OTEL_SERVICE_NAME="orders-app").splitlines()
    pid = out[-1]
    assert out[0] == (f"spans to {tmp_path}/spans-{pid}.jsonl (service.name orders-app), "
                      f"metrics to {tmp_path}/metrics-{pid}.jsonl")
    assert out[1].endswith("(already, in this process)")
    spans = {s["name"]: s for s in spans_of(tmp_path / f"spans-{pid}.jsonl")}
    assert sorted(spans) == ["create billing", "process billing", "send orders"]  # each once
    send, create, process = spans["send orders"], spans["create billing"], spans[
        "process billing"]
    assert create["parentSpanId"] == send["spanId"] and create["traceId"] == send["traceId"]
    assert "parentSpanId" not in send and process["traceId"] != send["traceId"]
    assert process["links"] == [{"traceId": create["traceId"], "spanId": create["spanId"],
                                 "attributes": [{"key": "why", "value": {"stringValue": "test"}}],
                                 "flags": 256}]
    assert (send["kind"], process["kind"]) == (4, 5)  # PRODUCER, CONSUMER (OTLP's numbers)
    assert process["status"] == {"code": 2, "message": "boom"}
    assert int(send["startTimeUnixNano"]) <= int(create["startTimeUnixNano"]) <= int(
        create["endTimeUnixNano"]) <= int(send["endTimeUnixNano"])
    assert {s["service"] for s in spans.values()} == {"orders-app"}
    metrics = (tmp_path / f"metrics-{pid}.jsonl").read_text()
    assert "messaging.client.sent.messages" in metrics


def test_with_azure_monitor_the_file_exporter_joins_its_tracer_provider(tmp_path: Path) -> None:
    """The distro installs its providers first; the trace dir adds to its TracerProvider
    (its MeterProvider takes no new readers)."""
    fake_distro = """
        import sys, types
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        distro = types.ModuleType("azure.monitor.opentelemetry")
        def configure_azure_monitor(**kwargs):
            trace.set_tracer_provider(TracerProvider())
            metrics.set_meter_provider(MeterProvider())
        distro.configure_azure_monitor = configure_azure_monitor
        sys.modules[distro.__name__] = distro
    """
    out = run(textwrap.dedent(fake_distro) + textwrap.dedent(SPANS), BUS_TRACE_DIR=str(tmp_path),
              APPLICATIONINSIGHTS_CONNECTION_STRING="InstrumentationKey=k").splitlines()
    pid = out[-1]
    assert out[0] == ("Application Insights: configure_azure_monitor(); spans to "
                      f"{tmp_path}/spans-{pid}.jsonl (added to the installed TracerProvider), "
                      "metrics: the installed MeterProvider's exporters only")
    assert len(spans_of(tmp_path / f"spans-{pid}.jsonl")) == 3
    assert not (tmp_path / f"metrics-{pid}.jsonl").exists()
