"""Scenario 3: exactly-once event fan-out to 3 subscribers.

A client publishes ``Pinged`` events (``cfg.messages // 3`` of them, so about as many deliveries
as the other scenarios process messages); each of 3 subscriber endpoints counts it in its own
state table. The rate is deliveries per second: one delivery is one subscriber's exactly-once
processing of one event. Every consumer thread polls the 3 subscribers' queues in turn, so
the same number of threads serves the three.
"""

from __future__ import annotations

import time

from bench.busrun import check_outcomes, drive, installation
from bench.config import BenchConfig
from bench.harness import ScenarioResult
from bench.workload import (
    SUBSCRIBERS,
    Pinged,
    expected_counts,
    fanout_endpoints,
    partition_key,
    verify_counts,
)


def run(cfg: BenchConfig) -> ScenarioResult:
    events = max(1, cfg.messages // len(SUBSCRIBERS))
    with installation(fanout_endpoints(), cfg.latency_ms) as inst:

        def publish(seq: int) -> None:
            inst.client.publish(Pinged(seq=seq, key=partition_key(seq, cfg.partitions),
                                       sent_at=time.time()))

        load = drive(inst, cfg, consume=list(SUBSCRIBERS), messages=events,
                     copies=len(SUBSCRIBERS), send=publish)
        expected = expected_counts(range(events), cfg.partitions)
        for name in SUBSCRIBERS:
            verify_counts(inst.plain.tables, inst.bus.names.state_table(name), expected)
    deliveries = events * len(SUBSCRIBERS)
    check_outcomes("fan-out", load.outcomes)
    return ScenarioResult(
        key="fanout3", title="exactly-once event fan-out to 3 subscribers (deliveries)",
        units=deliveries, seconds=load.flow.seconds,
        verified=(f"{events} events counted exactly once by each of the 3 subscribers; "
                  f"outcomes {dict(load.outcomes)}"),
        extra={"ops": load.ops, "errors": load.errors, "requests": load.requests,
               "client_requests": load.client_requests, "cpu": load.cpu,
               "client_group": load.client_group,
               "outcomes": dict(load.outcomes),
               "events": events})
