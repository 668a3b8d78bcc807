"""Scenario 1, the raw hop: plain azure-storage-queue send, receive, delete (at-least-once).

The transport's own limit on this machine: what any library built on Storage Queues can at
best reach. Consumers lease up to ``cfg.batch`` messages with one request (the first page of
``receive_messages``: iterating it further would fetch more pages, one request each, until one
comes back empty) and delete each message after "handling" it (reading its sequence number),
as the bus's Worker does with a signal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from azure.storage.queue import QueueClient, QueueServiceClient

from bench.config import BenchConfig
from bench.harness import BenchError, Flow, ScenarioResult, poll_until_stopped, run_load, shares
from bench.wire import counting_requests
from devhost.azurite import azurite

QUEUE = "bench-raw"
LEASE = 600  # seconds, the bus's default lease, so both hold messages the same way


def run(cfg: BenchConfig) -> ScenarioResult:
    with azurite() as connection, counting_requests(connection) as wire:
        # Separate service clients (and so connection pools) for the two sides, like the bus.
        consumer_queue = QueueServiceClient.from_connection_string(
            connection).get_queue_client(QUEUE)
        producer_queue = QueueServiceClient.from_connection_string(
            connection).get_queue_client(QUEUE)
        consumer_queue.create_queue()
        flow = Flow(cfg.messages, cfg.window)
        seen: set[int] = set()
        lock = threading.Lock()

        def producer(seqs: range) -> Callable[[threading.Event], None]:
            def produce(stop: threading.Event) -> None:
                for seq in seqs:
                    if not flow.before_send(1, stop):
                        return
                    producer_queue.send_message(str(seq))
            return produce

        def poll(queue: QueueClient) -> int:
            pages = queue.receive_messages(messages_per_page=cfg.batch,
                                           visibility_timeout=LEASE).by_page()
            messages = list(next(pages, []))
            for message in messages:
                seq = int(message.content)
                queue.delete_message(message)
                with lock:
                    seen.add(seq)
                flow.acked()
            return len(messages)

        def consumer(stop: threading.Event) -> None:
            poll_until_stopped(lambda: poll(consumer_queue), stop, cfg.idle_poll,
                               cfg.idle_max)

        wire.reset()
        used = run_load(flow, [producer(s) for s in shares(cfg.messages, cfg.producers)],
                        [consumer] * cfg.concurrency, cfg.timeout)
        requests = wire.side("consumer")
        client_requests = wire.side("producer")
        if len(seen) != cfg.messages:
            raise BenchError(f"raw: {cfg.messages - len(seen)} messages never arrived")
    # One raw hop = its send + its share of the receives + its delete.
    ops = dict(requests)
    for key, n in client_requests.items():
        ops[key] = ops.get(key, 0) + n
    return ScenarioResult(
        key="raw", title="raw hop: azure-storage-queue send + receive + delete",
        units=cfg.messages, seconds=flow.seconds,
        verified=f"all {cfg.messages} sequence numbers received (at least once)",
        extra={"ops": ops, "requests": ops, "cpu": used})
