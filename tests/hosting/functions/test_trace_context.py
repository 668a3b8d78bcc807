"""Trace context under the local host and Microsoft's worker: the invocation's traceparent
(bus.hosting.local.worker) and who configures Azure Monitor (azure-functions-runtime, then the app's
bus.hosting.functions.telemetry)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bus.errors import ConfigurationError
from bus.hosting.local.worker import Worker, _traceparent
from tests.support.distro import FakeDistro

TELEMETRY_APP = Path(__file__).resolve().parent / "telemetry_app"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def test_the_invocation_traceparent_is_w3c_and_sampled() -> None:
    parents = [_traceparent() for _ in range(20)]
    for parent in parents:
        match = TRACEPARENT.fullmatch(parent)
        assert match, parent
        trace_id, span_id, flags = match.groups()
        assert int(trace_id, 16) and int(span_id, 16)
        assert int(flags, 16) & 1, f"{parent}: not sampled (the host's Activity is, when recorded)"
    assert len({p.split("-")[1] for p in parents}) == len(parents)


def test_a_span_parented_on_the_invocation_is_recorded_by_a_parent_based_sampler() -> None:
    """The SDK's default sampler is ParentBased(ALWAYS_ON): a parent not sampled drops the
    child. With the devhost's old flags (00) no span under an invocation was exported."""
    parent = _traceparent()
    context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    tracer = TracerProvider().get_tracer("test")  # the default sampler, not installed globally
    with tracer.start_as_current_span("process orders", context=context,
                                      kind=trace.SpanKind.CONSUMER) as span:
        assert span.is_recording()
        assert f"{span.get_span_context().trace_id:032x}" == parent.split("-")[1]
        assert span.parent is not None and f"{span.parent.span_id:016x}" == parent.split("-")[2]



@pytest.fixture
def worker_telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDistro]:
    from azure_functions_runtime.otel import otel_manager

    from bus.hosting.functions import telemetry

    distro = FakeDistro()
    monkeypatch.setitem(sys.modules, "azure.monitor.opentelemetry", distro)
    monkeypatch.setattr(telemetry, "_done", {})
    saved = dict(os.environ)
    os.environ.update(AzureWebJobsStorage="UseDevelopmentStorage=true",
                      AzureWebJobsScriptRoot=str(TELEMETRY_APP),
                      APPLICATIONINSIGHTS_CONNECTION_STRING="InstrumentationKey=test",
                      PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY="true")
    os.environ.pop("BUS_TRACE_DIR", None)
    try:
        yield distro
    finally:
        os.environ.clear()
        os.environ.update(saved)
        sys.modules.pop("function_app", None)
        otel_manager.set_azure_monitor_available(False)  # the worker's state is process-wide


def test_the_worker_configures_azure_monitor_before_it_imports_the_app(
        worker_telemetry: FakeDistro) -> None:
    """PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY=true: azure-functions-runtime calls the
    distro in worker_init_request before it indexes (imports) function_app.py, and the app's
    configure_telemetry() leaves it at that - one call, not two."""
    worker = Worker(TELEMETRY_APP)
    try:
        index = asyncio.run(worker.start())
    finally:
        worker.stop()
    assert [f.name for f in index.functions] == ["probe"]
    app = sys.modules["function_app"]
    assert app.DISTRO_CALLS_BEFORE_IMPORT == [
        {"connection_string": "InstrumentationKey=test", "logger_name": ""}]
    assert "configured by the Python worker" in app.CONFIGURED
    assert len(worker_telemetry.calls) == 1


def _import_function_app(monkeypatch: pytest.MonkeyPatch, **settings: str) -> types.ModuleType:
    import importlib

    monkeypatch.setenv("AzureWebJobsStorage", "UseDevelopmentStorage=true")
    monkeypatch.delenv("BUS_PROCESS_SPAN_PARENT", raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop("function_app", None)
    try:
        return importlib.import_module("function_app")
    finally:
        sys.modules.pop("function_app", None)


def test_the_sample_app_takes_the_process_span_parent_from_its_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The app reads no setting itself: BusFunctions reads them all (Settings.from_environment)."""
    def parent(**settings: str) -> str:
        app = _import_function_app(monkeypatch, **settings)
        return str(app.bus_functions.bus.settings.process_span_parent)

    assert parent() == "invocation"
    assert parent(BUS_PROCESS_SPAN_PARENT="message") == "message"
    with pytest.raises(ConfigurationError, match="BUS_PROCESS_SPAN_PARENT='sideways' is invalid"):
        parent(BUS_PROCESS_SPAN_PARENT="sideways")
