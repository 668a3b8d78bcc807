"""Lease renewal and abandon, on the in-memory backend and Azurite; a worker's poll when
storage cannot be reached."""

from __future__ import annotations

import threading
import time

from bus import Abandon, Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.hosting.worker import Worker
from bus.storage import QueueMessage, Storage, TransientError
from bus.testing import InMemoryStorage
from bus.testing.transport import ForwardingQueues


class Slow(Command):
    ref: str
    seconds: float = 0.0
    abandon: bool = False


def build(storage: Storage, prefix: str, calls: list[tuple[str, int]]) -> Bus:
    lab = Endpoint("lab", retry=RetryPolicy(delays=(5.0,)))  # abandon must not wait for this

    @lab.handles(Slow, partition=lambda m: m.ref)
    def slow(message: Slow, ctx: Context) -> None:
        calls.append((message.ref, ctx.dequeue_count))
        if message.abandon and ctx.dequeue_count == 1:
            raise Abandon("not now")
        time.sleep(message.seconds)
        ctx.state.put("done", {"at": time.time()})

    bus = Bus(storage, [lab], prefix=prefix, settings=Settings(lease_seconds=2.0))
    bus.provision()
    return bus


def test_a_slow_handler_keeps_its_message(storage: Storage, prefix: str) -> None:
    calls: list[tuple[str, int]] = []
    bus = build(storage, prefix, calls)
    bus.send(Slow(ref="s1", seconds=4.5))  # more than twice the 2 s lease
    first, second = Worker(bus, "lab"), Worker(bus, "lab")
    worker = threading.Thread(target=first.poll_once)
    worker.start()
    while not calls:  # the first worker has the message and its handler is running
        time.sleep(0.05)
    stolen = 0
    while worker.is_alive():  # meanwhile, another worker keeps asking for it
        stolen += second.poll_once()
        time.sleep(0.2)
    worker.join()
    assert stolen == 0 and calls == [("s1", 1)]  # one delivery, never visible to anyone else
    assert first._keeper is not None and first._keeper.renewals >= 2
    assert first.outcomes == {"processed": 1}
    assert bus.storage.queues.depth(bus.names.queue("lab")) == 0  # acked with a renewed receipt


def test_abandon_redelivers_at_once(storage: Storage, prefix: str) -> None:
    calls: list[tuple[str, int]] = []
    bus = build(storage, prefix, calls)
    bus.send(Slow(ref="a1", abandon=True))
    worker = Worker(bus, "lab")
    assert worker.poll_once() == 1
    time.sleep(1.1)  # the queue's delay has a 1-second granularity on Azure
    assert worker.poll_once() == 1
    assert calls == [("a1", 1), ("a1", 2)]


def test_a_receive_that_fails_is_an_empty_poll_not_a_crash() -> None:
    """A local worker loop keeps going when storage cannot be reached for a moment (a pooled
    connection the server had closed): poll_once returns 0 and the next poll works."""

    class Flaky(ForwardingQueues):
        failures = 1

        def receive(self, queue: str, *, max_messages: int,
                    lease: float) -> list[QueueMessage]:
            if self.failures:
                self.failures -= 1
                raise TransientError("Remote end closed connection without response")
            return super().receive(queue, max_messages=max_messages, lease=lease)

    inner = InMemoryStorage()
    storage = Storage(queues=Flaky(inner.queues), blobs=inner.blobs, tables=inner.tables)
    bus = build(storage, "t", [])
    bus.send(Slow(ref="r"))
    worker = Worker(bus, "lab", retry_delay=0)
    assert worker.poll_once() == 0
    assert worker.poll_once() == 1 and worker.outcomes == {"processed": 1}
