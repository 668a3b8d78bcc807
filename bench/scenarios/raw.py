"""Scenario 1, the raw hop: plain azure-storage-queue send, receive, delete (at-least-once).

The transport's own limit on this machine: what any library built on Storage Queues can at
best reach. Consumers lease up to ``cfg.batch`` messages with one request (the first page of
``receive_messages``: iterating it further would fetch more pages, one request each, until one
comes back empty) and delete each message after "handling" it (reading its sequence numbers),
as the bus's Worker does with a signal.

Two loops: the naive one sends one queue message per sequence number (one request each);
the bundling one (``raw_bundled``) sends what the process's producers have waiting as one
queue message, one send at a time per process - the group commit the bus's client does
(``bus.protocol.send.group``), without the exactly-once work - so the bus's ratio to it says
what exactly-once costs, not what bundling saves.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from azure.storage.queue import QueueClient, QueueServiceClient

from bench.config import BenchConfig
from bench.emulator import azurite
from bench.harness import BenchError, Flow, ScenarioResult, poll_until_stopped, run_load, shares
from bench.wire import counting_requests
from bus.protocol.copies.bundles import MAX_PARTS

QUEUE = "bench-raw"
LEASE = 600  # seconds, the bus's default lease, so both hold messages the same way
TITLE = "raw hop: azure-storage-queue send + receive + delete"
BUNDLED_TITLE = "raw hop, bundling sends: the waiting sequence numbers in one message"

Send = Callable[[int], None]


class Bundler:
    """Group commit for a raw producer process: a caller whose number is waiting either leads
    the next send (everything waiting, up to ``MAX_PARTS``) or waits for the send that carries
    its number; one send in flight at a time, no timer."""

    def __init__(self, queue: QueueClient) -> None:
        self._queue = queue
        self._cond = threading.Condition()
        self._waiting: list[int] = []
        self._sent: set[int] = set()
        self._sending = False
        self.sends = 0

    def send(self, seq: int) -> None:
        with self._cond:
            self._waiting.append(seq)
            while seq not in self._sent:
                if self._sending:
                    self._cond.wait()
                    continue
                self._sending = True
                batch, self._waiting = self._waiting[:MAX_PARTS], self._waiting[MAX_PARTS:]
                self._cond.release()
                try:
                    self._queue.send_message(json.dumps(batch))
                finally:
                    self._cond.acquire()
                    self._sending = False
                    self._sent.update(batch)
                    self.sends += 1
                    self._cond.notify_all()
            self._sent.discard(seq)


def run(cfg: BenchConfig) -> ScenarioResult:
    return _hop(cfg, bundled=False)


def run_bundled(cfg: BenchConfig) -> ScenarioResult:
    return _hop(cfg, bundled=True)


def _hop(cfg: BenchConfig, *, bundled: bool) -> ScenarioResult:
    with azurite(cfg.latency_ms) as connection, counting_requests(connection) as wire:
        # Separate service clients (and so connection pools) for the two sides, like the bus.
        consumer_queue = QueueServiceClient.from_connection_string(
            connection).get_queue_client(QUEUE)
        producer_queue = QueueServiceClient.from_connection_string(
            connection).get_queue_client(QUEUE)
        consumer_queue.create_queue()
        flow = Flow(cfg.messages, cfg.window)
        seen: set[int] = set()
        lock = threading.Lock()
        bundler = Bundler(producer_queue)

        def send_one(seq: int) -> None:
            producer_queue.send_message(json.dumps([seq]))

        send: Send = bundler.send if bundled else send_one

        def producer(seqs: range) -> Callable[[threading.Event], None]:
            def produce(stop: threading.Event) -> None:
                for seq in seqs:
                    if not flow.before_send(1, stop):
                        return
                    send(seq)
            return produce

        def poll(queue: QueueClient) -> int:
            pages = queue.receive_messages(messages_per_page=cfg.batch,
                                           visibility_timeout=LEASE).by_page()
            messages = list(next(pages, []))
            for message in messages:
                seqs = json.loads(message.content)
                queue.delete_message(message)
                with lock:
                    seen.update(seqs)
                flow.acked(len(seqs))
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
    checked = f"all {cfg.messages} sequence numbers received (at least once)"
    if bundled:
        checked += f", sent in {bundler.sends} queue messages"
    return ScenarioResult(
        key="raw_bundled" if bundled else "raw", title=BUNDLED_TITLE if bundled else TITLE,
        units=cfg.messages, seconds=flow.seconds, verified=checked,
        extra={"ops": ops, "requests": ops, "cpu": used,
               "sends": bundler.sends if bundled else cfg.messages})
