"""The tracing scenario: the exactly-once hop with OpenTelemetry off, and with an SDK recording.

Scenario 2 (``eo_hop``: the same workload, checks and settings, each run on a fresh Azurite) in
``cfg.tracing_rounds`` rounds of two runs, the order swapped every other round (off, on; on,
off; ...) so that neither always runs on a machine whose load drifts the same way:

* **off**: ``Telemetry()``, the default - the global providers, which are the API's no-ops
  because the benchmark installs no SDK (checked before the run: a global SDK provider would
  make "off" record). This is what a user without an SDK gets.
* **on**: ``Telemetry(tracer_provider=..., meter_provider=...)`` with the SDK: a
  ``TracerProvider`` whose ``BatchSpanProcessor`` exports to an ``InMemorySpanExporter``, and a
  ``MeterProvider`` with an ``InMemoryMetricReader``. Every span and every measurement is
  recorded by the SDK (the default sampler samples everything). A ``BatchSpanProcessor`` is
  what production uses: a span's end only queues it, a background thread exports batches (of
  512, or every 5 s). The in-memory exporter keeps the figure to the bus's and the SDK's own
  cost - an OTLP exporter would add its serialization and network on that thread. Both buses,
  the endpoints' and the client's, get the same providers (one process, one SDK).
* **sampled**: the settings docs/observability.md recommends for production - the same SDK with
  ``ParentBased(TraceIdRatioBased(SAMPLED_RATIO))`` (``OTEL_TRACES_SAMPLER=
  parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.1``) and exemplars off
  (``OTEL_METRICS_EXEMPLAR_FILTER=always_off``); every metric is still recorded.

The rounds run the three variants (off, on, sampled; then sampled, on, off; ...).

Reported: each run's msgs/s and Python CPU per message, the ratio on/off per round and its
median, the spans recorded per message (by name), the metric measurements per message, spans
the processor dropped (ended but never exported), and the Pongs that carry a trace context
(``traceparent``): all of them when on, none when off - with no recording span the bus writes
no trace headers, the check that "off" recorded nothing.
"""

from __future__ import annotations

import gc
import itertools
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from bench.config import BenchConfig
from bench.cpu import CpuUse
from bench.harness import BenchError, ScenarioResult, alternating
from bench.report import IDLE, per_unit
from bench.scenarios import eo_hop
from bus.observability import Telemetry

KEY = "tracing"
TITLE = "exactly-once hop with tracing off vs an SDK recording every span and metric"
VARIANTS = ("off", "on", "sampled")
SAMPLED_RATIO = 0.1
NAMES = {"off": "tracing off (no SDK: the API's no-ops)",
         "on": "tracing on (SDK: BatchSpanProcessor + in-memory exporter, metrics reader)",
         "sampled": f"tracing on, recommended settings (parent-based {SAMPLED_RATIO:g} "
                    "sampling, exemplars off)"}
PROCESSOR = ("BatchSpanProcessor(InMemorySpanExporter()), the SDK's defaults (queue 2,048, "
             "batches of 512, every 5 s); MeterProvider(metric_readers=[InMemoryMetricReader()])")


class CountingBatchProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the spans it was given, so that spans it dropped (a
    full queue) show as ended but not exported. ``next`` on an ``itertools.count`` is atomic
    under the GIL: no lock on the spans' hot path."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        super().__init__(exporter)
        self._ends = itertools.count()

    def on_end(self, span: ReadableSpan) -> None:
        next(self._ends)
        super().on_end(span)

    @property
    def ended(self) -> int:
        return next(self._ends)  # the calls so far (this read moves the counter on)


@dataclass
class Recording:
    """An SDK that records every span and measurement, in memory."""

    exporter: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    reader: InMemoryMetricReader = field(default_factory=InMemoryMetricReader)
    recommended: bool = False
    """The recommended production settings: parent-based ratio sampling, exemplars off."""

    def __post_init__(self) -> None:
        self.processor = CountingBatchProcessor(self.exporter)
        self.tracer_provider = (
            TracerProvider(sampler=ParentBased(TraceIdRatioBased(SAMPLED_RATIO)))
            if self.recommended else TracerProvider())
        self.tracer_provider.add_span_processor(self.processor)
        self.meter_provider = MeterProvider(
            metric_readers=[self.reader],
            exemplar_filter=AlwaysOffExemplarFilter() if self.recommended else None)
        self.telemetry = Telemetry(tracer_provider=self.tracer_provider,
                                   meter_provider=self.meter_provider)

    def finish(self) -> tuple[int, dict[str, int], dict[str, int]]:
        """(spans ended, spans exported by name and kind, measurements by instrument), after
        flushing; shuts the providers down."""
        ended = self.processor.ended
        self.tracer_provider.force_flush()
        spans = Counter(f"{s.name} ({s.kind.name})" for s in self.exporter.get_finished_spans())
        gc.collect()  # the run's workers are gone: the depth gauge reads no queue (Azurite is)
        measured: Counter[str] = Counter()
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        if isinstance(point, HistogramDataPoint):
                            measured[metric.name] += point.count
                        elif isinstance(point, NumberDataPoint):
                            measured[metric.name] += int(point.value) \
                                if metric.name.endswith(".messages") else 1
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        return ended, dict(spans), dict(measured)


@dataclass
class TracingRun:
    """One timed run of the hop, tracing off or on."""

    variant: str
    index: int
    messages: int
    seconds: float
    cpu: CpuUse
    ops: dict[tuple[str, str], int]
    pongs: int
    traced_pongs: int
    spans_ended: int = 0
    spans: dict[str, int] = field(default_factory=dict)
    """Exported spans by ``name (KIND)``."""
    measurements: dict[str, int] = field(default_factory=dict)
    """Measurements the metric reader saw, by instrument (counters: their sum; histograms:
    their count; the gauge: its points)."""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def spans_exported(self) -> int:
        return sum(self.spans.values())

    @property
    def python_ms(self) -> float:
        return self.cpu.per_unit_ms(self.messages)[0]


def global_sdk() -> str | None:
    """The name of a global SDK provider, if one is installed (then "off" would record)."""
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    if isinstance(otel_trace.get_tracer_provider(), SdkTracerProvider):
        return "tracer provider"
    if isinstance(otel_metrics.get_meter_provider(), SdkMeterProvider):
        return "meter provider"
    return None


def _from(result: ScenarioResult, variant: str, index: int) -> TracingRun:
    x = result.extra
    return TracingRun(variant, index, result.units, result.seconds, x["cpu"], x["ops"],
                      x["pong_signals"], x["traced_pongs"])


def off_run(cfg: BenchConfig, index: int) -> TracingRun:
    """Scenario 2 as it runs by default: ``Telemetry()`` over the API's no-op providers."""
    found = global_sdk()
    if found is not None:
        raise BenchError(f"tracing: a global OpenTelemetry SDK {found} is installed, so the "
                         "'off' run would record")
    done = _from(eo_hop.run(cfg, Telemetry()), "off", index)
    if done.traced_pongs:
        raise BenchError(f"tracing: {done.traced_pongs} Pongs carry a trace context with "
                         "tracing off")
    return done


def on_run(cfg: BenchConfig, index: int) -> TracingRun:
    """Scenario 2 with the SDK recording every span and measurement."""
    recording = Recording()
    done = _from(eo_hop.run(cfg, recording.telemetry), "on", index)
    done.spans_ended, done.spans, done.measurements = recording.finish()
    if not done.spans_ended or done.traced_pongs != done.pongs:
        raise BenchError(f"tracing: with the SDK on, {done.spans_ended} spans recorded and "
                         f"{done.traced_pongs} of {done.pongs} Pongs carry a trace context")
    return done


def sampled_run(cfg: BenchConfig, index: int) -> TracingRun:
    """Scenario 2 with the SDK at the recommended settings."""
    recording = Recording(recommended=True)
    done = _from(eo_hop.run(cfg, recording.telemetry), "sampled", index)
    done.spans_ended, done.spans, done.measurements = recording.finish()
    if done.traced_pongs > done.pongs or not done.measurements:
        raise BenchError(f"tracing: sampled, {done.traced_pongs} of {done.pongs} Pongs carry "
                         f"a trace context and {len(done.measurements)} instruments measured")
    return done


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def ratios(runs: Sequence[TracingRun], attr: str = "rate", variant: str = "on") -> list[float]:
    """Per round: the ``variant`` run's ``attr`` over the off run's."""
    off = {r.index: r for r in runs if r.variant == "off"}
    return [getattr(r, attr) / getattr(off[r.index], attr) for r in runs
            if r.variant == variant and r.index in off and getattr(off[r.index], attr)]


def summarize(runs: Sequence[TracingRun]) -> dict[str, Any]:
    """Medians of each variant's msgs/s and Python CPU per message, the rounds' ratios (on
    over off) and their median, spans and measurements per message over the on runs."""
    by = {v: [r for r in runs if r.variant == v] for v in VARIANTS}
    out: dict[str, Any] = {}
    for variant, mine in by.items():
        messages = sum(r.messages for r in mine)
        ops = per_unit(_total(r.ops for r in mine), messages) if messages else {}
        out[variant] = {
            "msgs_per_s": _median([r.rate for r in mine]),
            "python_ms_per_msg": _median([r.python_ms for r in mine]),
            "messages": messages,
            "ops_per_msg": sum(v for k, v in ops.items() if k != IDLE) if messages else None,
            "pongs": sum(r.pongs for r in mine),
            "traced_pongs": sum(r.traced_pongs for r in mine)}
    out["ratios"] = ratios(runs)
    out["ratio"] = _median(out["ratios"])
    out["cpu_ratios"] = ratios(runs, "python_ms")
    out["cpu_ratio"] = _median(out["cpu_ratios"])
    out["sampled_ratios"] = ratios(runs, variant="sampled")
    out["sampled_ratio"] = _median(out["sampled_ratios"])
    sampled = by["sampled"]
    sampled_messages = sum(r.messages for r in sampled)
    out["sampled_spans_per_msg"] = (sum(r.spans_ended for r in sampled) / sampled_messages
                                    if sampled_messages else None)
    on = by["on"]
    messages = sum(r.messages for r in on)
    spans = _total(r.spans for r in on)
    measured = _total(r.measurements for r in on)
    out["spans_per_msg"] = sum(r.spans_ended for r in on) / messages if messages else None
    out["spans_by_name_per_msg"] = {k: n / messages for k, n in sorted(spans.items())}
    out["spans_dropped"] = sum(r.spans_ended - r.spans_exported for r in on)
    out["measurements_per_msg"] = {k: n / messages for k, n in sorted(measured.items())}
    return out


def _total(counts: Any) -> dict[Any, int]:
    total: Counter[Any] = Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def run(cfg: BenchConfig) -> ScenarioResult:
    runners = {"off": off_run, "on": on_run, "sampled": sampled_run}
    runs = alternating(
        cfg.tracing_rounds, VARIANTS, lambda variant, index: runners[variant](cfg, index),
        lambda done: (f"{done.rate:.1f} msgs/s ({done.messages} in {done.seconds:.1f} s; "
                      f"Python CPU {done.python_ms:.1f} ms/msg; spans {done.spans_ended})"))
    summary = summarize(runs)
    timed = [r for r in runs if r.variant != "off"]
    return ScenarioResult(
        key=KEY, title=TITLE, units=sum(r.messages for r in timed),
        seconds=sum(r.seconds for r in timed),
        verified=(f"scenario 2's checks in every run (each partition's counter equals its "
                  f"Pings, a Pong per Ping, nothing poisoned); with tracing on "
                  f"{summary['on']['traced_pongs']} of {summary['on']['pongs']} Pongs carry "
                  f"a trace context, off {summary['off']['traced_pongs']} of "
                  f"{summary['off']['pongs']}; spans dropped {summary['spans_dropped']}"),
        extra={"tracing_runs": runs, "tracing_summary": summary, "variants": NAMES,
               "processor": PROCESSOR, "rounds": cfg.tracing_rounds})
