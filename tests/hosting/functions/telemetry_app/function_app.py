"""A one-function app that records, when the worker imports it, what telemetry the worker had
configured already and what ``configure_telemetry()`` then did (tests/hosting/functions/
test_trace_context.py)."""

from __future__ import annotations

import sys

import azure.functions as func

from bus.hosting.functions.telemetry import configure_telemetry

_distro = sys.modules.get("azure.monitor.opentelemetry")
DISTRO_CALLS_BEFORE_IMPORT = list(getattr(_distro, "calls", []))
"""The (fake) distro's calls made before this module was imported: the worker's."""
CONFIGURED = configure_telemetry()

app = func.FunctionApp()


@app.function_name("probe")
@app.queue_trigger(arg_name="msg", queue_name="telemetry-probe", connection="AzureWebJobsStorage")
def probe(msg: func.QueueMessage) -> None:
    pass
