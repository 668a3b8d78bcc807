"""Scenario 4: kombu's Azure Storage Queues transport, publish + consume, as a peer.

What a Python user would pick instead. Each thread has its own kombu Connection (they are not
thread-safe) and a SimpleQueue; consumers ``get`` and ``ack``. kombu receives one message per
request and deletes it as soon as it is received, before the consumer runs: at-most-once on
a crash, and 3 queue operations per message (send, receive, delete) plus empty polls.
Its ``polling_interval`` is set to the idle poll interval the other scenarios use.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Callable
from typing import Any

import kombu

from bench.config import BenchConfig
from bench.emulator import azurite
from bench.harness import BenchError, Flow, ScenarioResult, run_load, shares
from bench.wire import counting_requests
from devhost.azurite import ACCOUNT, KEY

QUEUE = "bench-kombu"


def kombu_url(connection_string: str) -> str:
    """``azurestoragequeues://<account key>@<queue endpoint>`` for an Azurite connection string."""
    match = re.search(r"QueueEndpoint=(http://[^;]+)", connection_string)
    if match is None:
        raise ValueError("the connection string has no QueueEndpoint")
    endpoint = match.group(1).rstrip("/")
    if not endpoint.endswith(ACCOUNT):
        raise ValueError(f"unexpected queue endpoint {endpoint}")
    return f"azurestoragequeues://{KEY}@{endpoint}"


def connect(url: str, idle_poll: float) -> Any:
    """A kombu Connection (untyped) polling an empty queue every ``idle_poll`` seconds."""
    return kombu.Connection(url, transport_options={  # type: ignore[attr-defined,no-untyped-call]
        "polling_interval": idle_poll})


def run(cfg: BenchConfig) -> ScenarioResult:
    with azurite(cfg.latency_ms) as connection, counting_requests(connection) as wire:
        url = kombu_url(connection)
        with connect(url, cfg.idle_poll) as setup:
            setup.SimpleQueue(QUEUE).close()  # declare the queue before the clock starts
        flow = Flow(cfg.messages, cfg.window)
        seen: set[int] = set()
        lock = threading.Lock()

        def producer(seqs: range) -> Callable[[threading.Event], None]:
            return lambda stop: produce(seqs, stop)

        def produce(seqs: range, stop: threading.Event) -> None:
            with connect(url, cfg.idle_poll) as conn:
                simple = conn.SimpleQueue(QUEUE)
                for seq in seqs:
                    if not flow.before_send(1, stop):
                        break
                    simple.put({"seq": seq})
                simple.close()

        def consume(stop: threading.Event) -> None:
            with connect(url, cfg.idle_poll) as conn:
                simple = conn.SimpleQueue(QUEUE)
                while not stop.is_set():
                    try:
                        message = simple.get(timeout=1.0)
                    except queue.Empty:
                        continue
                    message.ack()
                    with lock:
                        seen.add(int(message.payload["seq"]))
                    flow.acked()
                simple.close()

        wire.reset()
        used = run_load(flow,
                 [producer(s) for s in shares(cfg.messages, cfg.producers)],
                 [consume for _ in range(cfg.concurrency)], cfg.timeout)
        requests = wire.side("consumer")
        for key, n in wire.side("producer").items():
            requests[key] = requests.get(key, 0) + n
        if len(seen) != cfg.messages:
            raise BenchError(f"kombu: {cfg.messages - len(seen)} messages never arrived")
    return ScenarioResult(
        key="kombu", title="kombu 5 (azurestoragequeues) publish + consume",
        units=cfg.messages, seconds=flow.seconds,
        verified=f"all {cfg.messages} sequence numbers consumed (at most once: deleted on "
                 "receive)", extra={"requests": requests, "cpu": used})
