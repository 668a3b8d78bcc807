"""Scenarios 2 and 5: the exactly-once command hop, and its storage operations counted.

A client sends ``Ping`` commands to endpoint ``bench-a``; its handler reads and increments a
counter row of the message's state partition and sends one ``Pong`` command to ``bench-b``. A
hop is complete when ``bench-a`` acknowledged the Ping: received, effect committed exactly
once, Pong on its way, signal deleted. ``bench-b`` is not run: its queue just collects the Pongs,
which are counted at the end.

Operations per hop are everything ``bench-a``'s side did to storage during the run, divided by
the hops: its share of the receives, the claim, the commit, the token and signal of the
outgoing Pong, the ack. Not included: provisioning, the client's token and signal of the
incoming Ping (the previous hop's send, which would count it twice in a chain of hops), the
empty receives of idle polling (reported apart) and the benchmark's own checks.

``run(cfg, telemetry=...)`` runs the same hop with other OpenTelemetry providers (the tracing
scenario); the Pongs that carry a trace context (a ``traceparent`` header: a recording span was
current when the handler made them) are counted either way.
"""

from __future__ import annotations

import time

from bench.busrun import check_outcomes, count_signals, drive, installation
from bench.config import BenchConfig
from bench.harness import BenchError, ScenarioResult
from bench.partitions import EndpointBudgets, ceiling, in_chain
from bench.workload import (
    HOP_FROM,
    HOP_TO,
    Ping,
    expected_counts,
    hop_endpoints,
    partition_key,
    verify_counts,
)
from bus.envelope import decode_signal
from bus.observability import Telemetry
from bus.observability.propagation import TRACEPARENT
from bus.protocol.tokens.shards import endpoint_of


def run(cfg: BenchConfig, telemetry: Telemetry | None = None) -> ScenarioResult:
    with installation(hop_endpoints(), cfg.latency_ms, telemetry) as inst:

        def send(seq: int) -> None:
            inst.client.send(Ping(seq=seq, key=partition_key(seq, cfg.partitions),
                                  sent_at=time.time()))

        load = drive(inst, cfg, consume=[HOP_FROM], messages=cfg.messages, copies=1,
                     send=send)
        names = inst.bus.names
        verify_counts(inst.plain.tables, names.state_table(HOP_FROM),
                      expected_counts(range(cfg.messages), cfg.partitions))
        traced = 0

        def look(body: str) -> None:
            nonlocal traced
            traced += TRACEPARENT in decode_signal(body).headers

        pong_messages, pongs = count_signals(inst.plain.queues, names.queue(HOP_TO), look)
        slots = inst.bus.parts.receiver(HOP_FROM).slots
        budgets = {name: EndpointBudgets(names.queue(name), names.tokens_table, name,
                                         names.state_table(name))
                   for name in (HOP_FROM, HOP_TO)}
        chained = in_chain(load.draws, budgets[HOP_FROM], budgets[HOP_TO])
        limit = ceiling(chained, cfg.messages)
        if pongs < cfg.messages:
            raise BenchError(f"eo hop: only {pongs} Pong signals for {cfg.messages} hops")
    check_outcomes("eo hop", load.outcomes)
    return ScenarioResult(
        key="eo_hop", title="exactly-once command hop (state update + 1 send)",
        units=cfg.messages, seconds=load.flow.seconds,
        verified=(f"every partition's counter equals its Pings (exactly once); "
                  f"{pongs} Pong signals queued for {cfg.messages} hops (in {pong_messages} "
                  f"queue messages: bundles); outcomes {dict(load.outcomes)}"),
        extra={"ops": load.ops, "errors": load.errors, "requests": load.requests,
               "client_requests": load.client_requests, "cpu": load.cpu,
               "client_group": load.client_group,
               "outcomes": dict(load.outcomes),
               "pong_signals": pongs, "pong_messages": pong_messages,
               "traced_pongs": traced,
               "slot_cache": {"hits": slots.hits, "stale": slots.stale},
               "ceiling": limit, "chained": chained,
               "token_shards": sum(1 for budget in load.draws
                                   if budget[:2] == ("table", names.tokens_table)
                                   and endpoint_of(budget[2]) == HOP_FROM)})
