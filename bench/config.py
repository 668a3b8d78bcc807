"""The settings of one benchmark run: the same for every scenario, so they compare fairly."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class BenchConfig:
    messages: int = 2000
    """Messages per throughput scenario (the fan-out publishes messages // 3 events, so it
    also delivers about ``messages`` copies)."""
    latency_ms: float = 5.0
    """Milliseconds added to every storage request's round trip by a loopback proxy
    (``bench.delay``), for every scenario: raw, kombu and the bus alike. Azure Storage answers
    a function in the same region in about 5-10 ms end to end, Azurite on loopback in about
    1 ms; 5 ms more puts a request at 6-9 ms here, inside Azure's range, so requests made
    one after another cost what they would in Azure. 0 runs against Azurite directly."""
    concurrency: int = 8
    """Consumer threads of the raw and kombu scenarios. Kept at most 10: one SDK client keeps
    10 pooled connections per service, and more threads would open and drop connections."""
    loops: int = 1
    """Leasing loops (``Worker``s) per endpoint of the bus scenarios, as a host of the bus runs
    them: one per endpoint per process, each round's requests side by side on the bus's
    lanes (``Settings.round_concurrency``, 8). Eight loops of 16 (the set-up until
    2026-11-28) split a shallow queue into rounds of ~5 signals: 2.9 storage operations per
    hop against 1.7 for one loop of 32, and 72 against 102 hops/s at Azure's latency."""
    producers: int = 8
    """Producer threads, running concurrently with the consumers. As many as consumers: with
    fewer (4 until 2026-11-22) the producers were the bottleneck of the raw hop as well as
    of the exactly-once one (the raw consumers spent much of the run polling an empty
    queue), so the scenarios measured their senders rather than their consumers."""
    batch: int = 32
    """Messages leased per receive call, raw and bus alike (the Worker's default; the most one
    receive returns)."""
    window: int = 256
    """At most this many messages sent but not yet acknowledged: keeps queues shallow,
    because Azurite's receive slows down with queue depth."""
    idle_poll: float = 0.025
    """Seconds a consumer sleeps after an empty receive, doubling while the queue stays
    empty (kombu's fixed polling_interval is set to this)."""
    idle_max: float = 0.2
    """The longest sleep between empty receives."""
    partitions: int = 512
    """State partitions of the bus scenarios, assigned round-robin (see docs/performance.md)."""
    latency_rate: float = 5.0
    """Messages per second of the latency scenario's fixed light load: well below what the
    exactly-once hop sustains here, so the latency is the hop's, not a queue's backlog."""
    latency_seconds: float = 24.0
    latency_warmup: float = 1.0
    """Seconds at the start of the latency run left out of the percentiles (connections)."""
    spark_rows: int = 2000
    """Rows per timed Spark write (the Spark scenario). The raw loop sent 150-830 rows/s here
    (one request per row, 2 cores shared with Azurite and other work), so a raw run takes
    2.5-13 s; a Spark session costs 10-30 s to start and warm up."""
    spark_runs: int = 2
    """Timed runs of each Spark write (raw, bus, publish alternating) per setting."""
    spark_cores: tuple[int, ...] = (1, 2)
    """The Spark settings, ``local[n]``: a SparkSession each (10-30 s to start and warm up;
    the quick run keeps local[2] only, the setting of the JSON line)."""
    sessions: int = 64
    """Sessions of the sessions scenario: Ping *i* belongs to session ``s{i mod sessions}``,
    which is also its state partition. A multiple of ``producers``, so each session's Pings
    come from one producer thread, one after the other, and their order is known."""
    session_rounds: int = 2
    """Rounds of the sessions scenario: each runs the unordered hop, the unordered hop over
    the session hop's partitions and the session hop, each on a fresh Azurite (alternating:
    every other round in reverse order). The quick run keeps one round (three runs of 10-20 s
    with an Azurite start each)."""
    tracing_rounds: int = 3
    """Rounds of the tracing scenario: each runs scenario 2 with tracing off and with an
    OpenTelemetry SDK recording, each on a fresh Azurite (off first, then on first, ...).
    An overhead of a few percent is smaller than the run-to-run noise here, so a full run
    takes three pairs (six runs of 15-30 s); the quick run one."""
    timeout: float = 300.0
    """A scenario that has not finished by then fails instead of hanging."""
    quick: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = BenchConfig()
QUICK = replace(FULL, messages=400, latency_seconds=10.0, spark_rows=1000, spark_cores=(2,),
                session_rounds=1, tracing_rounds=1, timeout=120.0, quick=True)
