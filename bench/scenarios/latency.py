"""Scenario 6: latency of the exactly-once command hop at a fixed light load.

One client thread sends ``cfg.latency_rate`` Pings per second for ``cfg.latency_seconds``
(far below the throughput limit, so queues stay nearly empty). Each Ping carries the time its
send started. Two latencies per message, on one clock (one process):

* send -> handler: until ``bench-a``'s handler runs (includes the client's token + signal and
  the consumer's poll delay: an idle consumer polls again after ``cfg.idle_poll`` s, backing
  off to ``cfg.idle_max`` while its queue stays empty);
* send -> ack (the reported p50/p99): until the hop is complete - effect committed, Pong on its
  way, signal deleted.

The first ``cfg.latency_warmup`` seconds are left out (connection set-up).
"""

from __future__ import annotations

import json
import threading
import time

from bench.busrun import drive, installation
from bench.config import BenchConfig
from bench.harness import BenchError, ScenarioResult
from bench.stats import percentile
from bench.workload import (
    HOP_FROM,
    Ping,
    expected_counts,
    hop_endpoints,
    partition_key,
    verify_counts,
)
from bus.envelope import decode_signal
from bus.storage import QueueMessage


class _Stamps:
    """When each Ping's handler ran, and its samples at the ack.

    The ack is matched with its Ping through the signal itself (its envelope carries the
    Ping, with ``seq`` and ``sent_at``), since a batch's acks can follow all of its handlers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handled: dict[int, float] = {}
        self.samples: list[tuple[float, float, float]] = []  # (sent_at, handler, ack)

    def handled(self, message: Ping) -> None:
        now = time.time()
        with self._lock:
            self._handled.setdefault(message.seq, now)  # the first run, if it ran twice

    def acked(self, signal: QueueMessage) -> None:
        now = time.time()
        ping = json.loads(decode_signal(signal.body).inline_payload())
        with self._lock:
            handled = self._handled.get(int(ping["seq"]))
            if handled is not None:
                self.samples.append((float(ping["sent_at"]), handled, now))


def run(cfg: BenchConfig) -> ScenarioResult:
    messages = max(1, round(cfg.latency_rate * cfg.latency_seconds))
    stamps = _Stamps()
    start: list[float] = []

    def pace(seq: int) -> None:
        if not start:
            start.append(time.monotonic())
        delay = start[0] + seq / cfg.latency_rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    with installation(hop_endpoints(observe=stamps.handled), cfg.latency_ms) as inst:

        def send(seq: int) -> None:
            inst.client.send(Ping(seq=seq, key=partition_key(seq, cfg.partitions),
                                  sent_at=time.time()))

        load = drive(inst, cfg, consume=[HOP_FROM], messages=messages, copies=1, send=send,
                     producers=1, pace=pace, on_ack=stamps.acked)
        verify_counts(inst.plain.tables, inst.bus.names.state_table(HOP_FROM),
                      expected_counts(range(messages), cfg.partitions))
    first = min(sent for sent, _, _ in stamps.samples)
    kept = [s for s in stamps.samples if s[0] >= first + cfg.latency_warmup]
    if not kept:
        raise BenchError("latency: no samples after the warm-up")
    to_ack = [(ack - sent) * 1000 for sent, _, ack in kept]
    to_handler = [(handler - sent) * 1000 for sent, handler, _ in kept]
    extra = {
        "samples": len(kept), "rate": cfg.latency_rate,
        "p50_ms": percentile(to_ack, 50), "p99_ms": percentile(to_ack, 99),
        "max_ms": max(to_ack),
        "handler_p50_ms": percentile(to_handler, 50),
        "handler_p99_ms": percentile(to_handler, 99),
        "outcomes": dict(load.outcomes), "cpu": load.cpu,
    }
    return ScenarioResult(
        key="latency", title=f"command hop latency at {cfg.latency_rate:g} msg/s",
        units=messages, seconds=load.flow.seconds,
        verified="every partition's counter equals its Pings (exactly once)", extra=extra)
