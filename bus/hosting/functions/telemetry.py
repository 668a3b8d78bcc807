"""Where a Functions app's OpenTelemetry goes: the app calls ``configure_telemetry()`` at
import, before it builds its Bus.

- ``BUS_TRACE_DIR`` set: spans and metrics written as OTLP JSON lines to
  ``<dir>/spans-<pid>.jsonl`` and ``<dir>/metrics-<pid>.jsonl`` (OpenTelemetry's own file
  exporter, ``opentelemetry-exporter-otlp-json-file``: one line per export batch, the
  ``ExportTraceServiceRequest`` of the OTLP JSON encoding). For the local host and the demo
  (``make demo DEMO_TRACES=dir``); ``python -m devhost.trace_picture dir`` draws a trace.
- ``APPLICATIONINSIGHTS_CONNECTION_STRING`` set: Application Insights through the Azure
  Monitor distro (``configure_azure_monitor()``), unless the Python worker does it. With
  ``PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY`` true, azure-functions-runtime calls
  ``configure_azure_monitor()`` in its ``worker_init_request`` (and
  ``function_environment_reload_request``) *before* it imports function_app.py
  (``otel.initialize_azure_monitor``); a second call would install a second set of
  exporters, so the app leaves it to the worker whenever the worker is the one importing it.
- neither: nothing; the OpenTelemetry API stays a no-op.

Both can be on: the file exporter is added to the Azure Monitor distro's TracerProvider.
The SDK and the exporters are imported only when used: the ``bus`` package itself needs only
``opentelemetry-api``; the app pins the SDK and the distro (requirements.txt), the file
exporter is a development tool (requirements-dev.txt).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TRACE_DIR = "BUS_TRACE_DIR"
CONNECTION_STRING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
WORKER_TELEMETRY = "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY"
DEFAULT_SERVICE_NAME = "eobus-functions"
METRIC_EXPORT_MILLIS = 5_000
"""How often metrics are written to the file (the SDK's default is 60 s: a demo is shorter)."""

_done: dict[str, str] = {}
"""What this process configured already, by what (``azure-monitor``, ``files:<dir>``): the
demo configures its client and then imports function_app.py, which configures again; a
second file exporter on the same file would write every span twice."""


def _true(value: str | None) -> bool:
    """An app setting's truth, as the Python worker reads it (``is_true_like``)."""
    return (value or "").strip().lower() in {"1", "true", "t", "yes", "y"}


def worker_configures_azure_monitor(environ: Mapping[str, str]) -> bool:
    """Whether the Python worker that imports this app calls ``configure_azure_monitor()``
    itself: the setting is true and the code importing the app is azure-functions-runtime
    (its ``otel`` module is loaded: it is imported with the worker's request handlers, and
    runs the distro before it loads the app). Outside the worker (a script or test importing
    function_app.py) the setting alone configures nothing."""
    return _true(environ.get(WORKER_TELEMETRY)) and "azure_functions_runtime.otel" in sys.modules


def service_name(environ: Mapping[str, str]) -> str:
    """``OTEL_SERVICE_NAME``, else the Functions app's name (``WEBSITE_SITE_NAME``), else
    ``eobus-functions``."""
    return (environ.get("OTEL_SERVICE_NAME") or environ.get("WEBSITE_SITE_NAME")
            or DEFAULT_SERVICE_NAME)


def configure_telemetry(environ: Mapping[str, str] | None = None) -> str:
    """Install what the settings ask for (module docstring); returns what it did, in a line
    for the caller's log. Idempotent enough for an app imported twice: a provider already installed
    by someone else is extended or left alone, never replaced."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    done: list[str] = []
    connection = env.get(CONNECTION_STRING, "").strip()
    if connection:
        if worker_configures_azure_monitor(env):
            done.append("Application Insights: configured by the Python worker "
                        f"({WORKER_TELEMETRY})")
        else:
            done.append(_once("azure-monitor", lambda: _azure_monitor(connection, env)))
    trace_dir = env.get(TRACE_DIR, "").strip()
    if trace_dir:
        directory = Path(trace_dir).resolve()
        done.append(_once(f"files:{directory}", lambda: _files(directory, service_name(env))))
    return "; ".join(done) or "OpenTelemetry: no exporter (the API's no-op)"


def _once(key: str, configure: Callable[[], str]) -> str:
    if key not in _done:
        _done[key] = configure()
        return _done[key]
    return f"{_done[key]} (already, in this process)"


def _azure_monitor(connection: str, env: Mapping[str, str]) -> str:
    from azure.monitor.opentelemetry import configure_azure_monitor

    # The worker does the same before it calls the distro (otel.initialize_azure_monitor):
    # the Functions resource detector names the cloud role after the app.
    if "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS" not in env:
        os.environ.setdefault("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "azure_functions")
    configure_azure_monitor(connection_string=connection)
    return "Application Insights: configure_azure_monitor()"


def _files(directory: Path, name: str) -> str:
    """Spans and metrics of this process to ``directory``, as OTLP JSON lines."""
    try:
        from opentelemetry.exporter.otlp.json.file import FileMetricExporter, FileSpanExporter
    except ImportError as error:  # a development tool: requirements-dev.txt pins it
        raise RuntimeError(f"{TRACE_DIR} is set but the OTLP JSON file exporter is not "
                           "installed (pip install opentelemetry-exporter-otlp-json-file; "
                           "requirements-dev.txt pins it)") from error
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    spans = directory / f"spans-{pid}.jsonl"
    resource = Resource.create({SERVICE_NAME: name})
    done = []

    current: Any = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # the Azure Monitor distro's, or ours again
        provider = current
        done.append(f"spans to {spans} (added to the installed TracerProvider)")
    else:
        provider = TracerProvider(resource=resource)
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is not provider:
            return f"{TRACE_DIR}: another TracerProvider is installed; no spans written"
        done.append(f"spans to {spans} (service.name {name})")
    provider.add_span_processor(BatchSpanProcessor(FileSpanExporter(spans)))

    # A MeterProvider takes its readers when built: an installed one keeps its own.
    current_meters: Any = metrics.get_meter_provider()
    if isinstance(current_meters, MeterProvider):
        done.append("metrics: the installed MeterProvider's exporters only")
    else:
        metric_file = directory / f"metrics-{pid}.jsonl"
        reader = PeriodicExportingMetricReader(FileMetricExporter(metric_file),
                                               export_interval_millis=METRIC_EXPORT_MILLIS)
        meters = MeterProvider(resource=resource, metric_readers=[reader])
        metrics.set_meter_provider(meters)
        if metrics.get_meter_provider() is meters:
            done.append(f"metrics to {metric_file}")
        else:
            done.append("metrics: another MeterProvider is installed; none written")
    return ", ".join(done)
