"""The benchmark's scenarios, one module each, in the order they run.

Each module's ``run(cfg)`` starts its own fresh Azurite (Azurite slows down as deleted messages
and queue depth pile up, so no scenario inherits another's leftovers), checks its result, and
returns a :class:`~bench.harness.ScenarioResult` - or raises BenchError and reports nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from bench.config import BenchConfig
from bench.harness import ScenarioResult

# key -> (module, what it measures); the keys are what --only takes.
SCENARIOS: dict[str, tuple[str, str]] = {
    "raw": ("bench.scenarios.raw", "raw hop: azure-storage-queue send + receive + delete"),
    "raw_bundled": ("bench.scenarios.raw_bundled",
                    "raw hop, bundling sends: one send at a time, what waits goes together"),
    "eo_hop": ("bench.scenarios.eo_hop", "exactly-once command hop, storage ops counted"),
    "fanout3": ("bench.scenarios.fanout", "exactly-once event fan-out to 3 subscribers"),
    "kombu": ("bench.scenarios.kombu_peer", "kombu azurestoragequeues publish + consume"),
    "latency": ("bench.scenarios.latency", "command hop latency at a fixed light load"),
    "spark": ("bench.scenarios.spark_publish",
              "Spark tasks publishing rows: bus vs a raw send loop, local[n]"),
    "sessions": ("bench.scenarios.sessions",
                 "ordered sessions hop vs the unordered exactly-once hop, alternating"),
    "functions_hop": ("bench.scenarios.functions_hop",
                      "exactly-once hop through the Functions host and worker, single and "
                      "grouped sends"),
    "tracing": ("bench.scenarios.tracing",
                "exactly-once hop, tracing off vs an OpenTelemetry SDK recording, alternating"),
}


def runner(key: str) -> Callable[[BenchConfig], ScenarioResult]:
    module = importlib.import_module(SCENARIOS[key][0])
    run: Callable[[BenchConfig], ScenarioResult] = module.run
    return run
