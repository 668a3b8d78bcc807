"""The Functions path's spans, through Microsoft's worker and the Durable SDK (trace_probe.py,
with a global OpenTelemetry SDK, in a process of its own): the queue trigger's process span
parented on the invocation's trace context and linked to the client's send; the Durable
fan-out's activities sending the handed-off record's signals in that trace; the Azure SDK's
own spans under the subscribers' process spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosting.functions.trace_probe import INVOCATION

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.azurite


def test_one_trace_through_the_durable_fan_out(azurite_connection: str, prefix: str) -> None:
    # The Azure SDKs' own tracing on (azure-core's native OpenTelemetry spans).
    environ = {**os.environ, "AZURE_TRACING_ENABLED": "true"}
    done = subprocess.run([sys.executable, "-m", "tests.hosting.functions.trace_probe",
                           azurite_connection, prefix], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False, env=environ)
    assert done.returncode == 0, done.stderr[-3000:]
    spans = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_name: dict[str, list[dict[str, object]]] = {}
    for span in spans:
        by_name.setdefault(str(span["name"]), []).append(span)

    [send] = [s for s in by_name["send orders"] if s["kind"] == "SpanKind.PRODUCER"]
    [process] = by_name["process orders"]
    [create] = by_name["create OrderPlaced"]
    # The trigger's process span: parented on the invocation, linked to the client's send.
    invocation_trace = "0x" + INVOCATION.split("-")[1]
    assert process["context"]["trace_id"] == invocation_trace  # type: ignore[index]
    assert process["parent_id"] == "0x" + INVOCATION.split("-")[2]
    [link] = process["links"]  # type: ignore[misc]
    assert link["context"]["span_id"] == send["context"]["span_id"]  # type: ignore[index]
    assert create["parent_id"] == process["context"]["span_id"]  # type: ignore[index]
    # The activity's send: in the invocation's trace, under the process span, linked to the
    # create span whose context the copies carry.
    [signal] = [s for s in by_name["send"] if s["kind"] == "SpanKind.CLIENT"]
    assert signal["parent_id"] == process["context"]["span_id"]  # type: ignore[index]
    assert [link["context"]["span_id"] for link in signal["links"]] == [  # type: ignore[index]
        create["context"]["span_id"]]  # type: ignore[index]
    # Both subscribers' handlers continue the trace from the create span.
    for subscriber in ("billing", "shipping"):
        [handled] = by_name[f"process {subscriber}"]
        assert handled["parent_id"] == create["context"]["span_id"]  # type: ignore[index]
        assert handled["context"]["trace_id"] == invocation_trace  # type: ignore[index]
        assert handled["attributes"]["eobus.outcome"] == "processed"  # type: ignore[index]
        # The storage requests of its handler run and commit: the SDK's spans, its children.
        children = {s["name"] for s in spans
                    if s["parent_id"] == handled["context"]["span_id"]}  # type: ignore[index]
        assert "POST" in children or "TableClient.submit_transaction" in children, children
