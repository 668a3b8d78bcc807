"""The tracing scenario: the recording SDK records and counts, the ratios pair each round's
runs, the JSON keys and the markdown from made-up runs; one tiny run on Azurite. Nothing here
checks a speed: the machine is shared and noisy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report
from bench.__main__ import main
from bench.config import FULL, QUICK
from bench.cpu import CpuUse
from bench.harness import ScenarioResult
from bench.scenarios import SCENARIOS, tracing
from bench.scenarios.tracing import Recording, TracingRun
from bench.workload import HOP_FROM, Ping, hop_endpoints
from bus import Bus
from bus.testing import InMemoryStorage, drain


def test_the_scenario_is_declared_with_alternating_rounds() -> None:
    assert "tracing" in SCENARIOS
    assert FULL.tracing_rounds >= 2 and QUICK.tracing_rounds >= 1


def test_the_recording_sdk_sees_every_span_and_measurement() -> None:
    recording = Recording()
    bus = Bus(InMemoryStorage(), hop_endpoints(), telemetry=recording.telemetry)
    bus.provision()
    for seq in range(3):
        bus.send(Ping(seq=seq, key=f"p{seq}", sent_at=0.0))
    drain(bus, [HOP_FROM])
    ended, spans, measured = recording.finish()
    assert ended == sum(spans.values()) > 0  # none dropped
    assert spans["send bench-a (PRODUCER)"] == spans["process bench-a (CONSUMER)"] == 3
    assert spans["create bench-b (PRODUCER)"] == 3
    assert measured["messaging.process.duration"] == 3
    assert measured["messaging.client.consumed.messages"] == 3


def _run(variant: str, index: int, seconds: float, python_s: float, *,
         spans: int = 0) -> TracingRun:
    run = TracingRun(variant, index, 100, seconds, CpuUse(python_s, 0.5, seconds),
                     {("table", "transact"): 250, ("queue", "receive_empty"): 9}, 100,
                     100 if variant == "on" else 0)
    if variant == "on":
        run.spans_ended, run.spans = spans, {"process bench-a (CONSUMER)": spans}
        run.measurements = {"messaging.process.duration": 100}
    return run


def _runs() -> list[TracingRun]:
    return [_run("off", 0, 1.0, 1.0), _run("on", 0, 1.25, 1.2, spans=400),
            _run("on", 1, 1.0, 1.1, spans=390), _run("off", 1, 0.9, 1.0)]


def test_ratios_pair_the_runs_of_each_round() -> None:
    summary = tracing.summarize(_runs())
    assert summary["ratios"] == pytest.approx([0.8, 0.9])  # 80/100, 100/111.1
    assert summary["ratio"] == pytest.approx(0.85)
    assert summary["cpu_ratios"] == pytest.approx([1.2, 1.1])
    assert summary["off"]["msgs_per_s"] == pytest.approx((100 + 100 / 0.9) / 2)
    assert summary["on"]["ops_per_msg"] == pytest.approx(2.5)  # empty receives left out
    assert summary["spans_per_msg"] == pytest.approx(3.95)
    assert summary["spans_dropped"] == 0
    assert (summary["on"]["traced_pongs"], summary["off"]["traced_pongs"]) == (200, 0)


def test_the_recommended_settings_pair_with_the_off_run_of_their_round() -> None:
    sampled = [_run("sampled", 0, 1.05, 1.0), _run("sampled", 1, 0.95, 1.0)]
    sampled[0].spans_ended = 40
    summary = tracing.summarize(_runs() + sampled)
    assert summary["sampled_ratios"] == pytest.approx([1.0 / 1.05, 0.9 / 0.95])
    assert summary["sampled_spans_per_msg"] == pytest.approx(0.2)
    assert summary["ratios"] == pytest.approx([0.8, 0.9])  # the full SDK's, unchanged
    keys = report._tracing_keys(ScenarioResult(
        tracing.KEY, tracing.TITLE, 400, 4.25, "checked",
        extra={"tracing_summary": summary}))
    assert keys["tracing_recommended_to_off_ratio"] == round(
        (1.0 / 1.05 + 0.9 / 0.95) / 2, 3)


def test_the_json_keys_and_the_markdown_section() -> None:
    result = ScenarioResult(tracing.KEY, tracing.TITLE, 200, 2.25, "checked",
                            extra={"tracing_runs": _runs(),
                                   "tracing_summary": tracing.summarize(_runs()),
                                   "variants": tracing.NAMES, "processor": tracing.PROCESSOR,
                                   "rounds": 2})
    keys = report._tracing_keys(result)
    assert set(keys) == set(report.TRACING_KEYS)
    assert keys["tracing_on_to_off_ratio"] == 0.85
    assert keys["tracing_on_to_off_ratios"] == [0.8, 0.9]
    assert keys["tracing_spans_per_msg"] == 3.95 and keys["tracing_off_traced_pongs"] == 0
    assert report._tracing_keys(None) == dict.fromkeys(report.TRACING_KEYS)
    text = "\n".join(report._tracing_section(result))
    assert "| 1 | on | 100 | 1.2 | **80.0** | 12.0 | 5.0 | 2.50 | 4.00 | 100 of 100 |" in text
    assert "**Ratio on/off 0.850** (per round: 0.800, 0.900)" in text


@pytest.mark.azurite
def test_a_tiny_run_records_spans_only_when_on(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.md"
    code = main(["--quick", "--only", "tracing", "--latency-ms", "0", "--messages", "24",
                 "--concurrency", "2",
                 "--producers", "1", "--out", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0, lines
    data = json.loads(lines[-1])
    assert set(report.TRACING_KEYS) <= set(data)
    assert data["tracing_messages"] == 24  # the quick run's one round
    assert data["tracing_off_msgs_per_s"] > 0 and data["tracing_on_msgs_per_s"] > 0
    assert data["tracing_on_to_off_ratio"] > 0 and len(data["tracing_on_to_off_ratios"]) == 1
    # The recommended settings (sampling, exemplars off) run in the same round.
    assert data["tracing_recommended_msgs_per_s"] > 0
    assert len(data["tracing_recommended_to_off_ratios"]) == 1
    # On: a send, a process and a create span per message at least, none dropped. Off: no
    # recording span anywhere, so no Pong carries a trace context.
    assert data["tracing_spans_per_msg"] >= 3
    assert data["tracing_spans_dropped"] == 0
    assert data["tracing_off_traced_pongs"] == 0
    assert data["eo_hop_msgs_per_s"] is None  # not run: null
    assert "## Tracing: the hop with tracing off and with an SDK recording" in out.read_text()
