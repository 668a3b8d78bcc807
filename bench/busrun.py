"""Running the bus under load on a fresh Azurite, with its storage operations counted.

The consuming side gets its own Bus over a counted storage; the producing side (the client)
gets a separate Bus over its own uncounted storage clients, as it would be a separate process in
production, so the counts are exactly what the endpoints do. Each consumer thread runs
:class:`~bus.hosting.worker.Worker.poll_once` - the code a local host runs - so the benchmark
measures whatever the current protocol and worker do.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from bench.config import BenchConfig
from bench.cpu import CpuUse
from bench.emulator import azurite
from bench.harness import BenchError, Flow, poll_until_stopped, run_load, shares
from bench.partitions import Budget, LoadBook, recording
from bench.wire import WireCounter, counting_requests
from bus import Bus, Endpoint
from bus.adapters.azure import AzureStorage
from bus.hosting.worker import Worker
from bus.observability import Telemetry
from bus.protocol.copies.bundles import parts
from bus.storage import QueueMessage, Queues, Storage
from bus.testing.counting import OpCounter, counting_storage
from bus.testing.transport import ForwardingQueues


class AckProbe(ForwardingQueues):
    """A Queues wrapper that reports each acknowledgement (delete) of a signal of a watched
    queue, on the thread that made it - once the signal's processing finished (alone or,
    with the Worker's batched path, together with the rest of its batch). A bundle is
    reported as its signals, each as a message of its own body (grouped client sends arrive
    in bundles).

    ``settled(body)`` says whether an acknowledged signal's processing is over. Always, but
    for a copy set aside in a session: it is acknowledged before its handler runs, and its
    release sends the same body again, acknowledged once handled - so that acknowledgement
    must not count, nor be taken for a duplicate's."""

    def __init__(self, inner: Queues) -> None:
        super().__init__(inner)
        self.watched: frozenset[str] = frozenset()
        self.on_ack: Callable[[QueueMessage], None] = lambda message: None
        self.settled: Callable[[str], bool] = lambda body: True
        self._lock = threading.Lock()
        self._acked: set[bytes] = set()

    def delete(self, queue: str, message: QueueMessage) -> None:
        try:
            self._inner.delete(queue, message)
        finally:
            # The message's processing is over once its ack was tried: a failed ack leaves a
            # copy that comes back as a duplicate only after its lease (10 minutes). Each
            # signal is reported once, by its body: a redelivered copy, or a second copy a
            # sender's retry put on the queue (at-least-once), has the same body.
            if queue in self.watched:
                for part in parts([message]):
                    if self.settled(part.body) and self._first_ack(part.body):
                        self.on_ack(replace(message, body=part.body))

    def _first_ack(self, body: str) -> bool:
        digest = hashlib.sha1(body.encode()).digest()
        with self._lock:
            if digest in self._acked:
                return False
            self._acked.add(digest)
            return True


@dataclass
class Installation:
    bus: Bus
    """The endpoints' bus, over the counted storage."""
    client: Bus
    """The sender's bus, over separate, uncounted storage clients."""
    plain: AzureStorage
    """Uncounted storage for the checks after the run."""
    counter: OpCounter
    probe: AckProbe
    wire: WireCounter
    """HTTP requests, by the side (thread) that sent them."""
    book: LoadBook
    """What the endpoints' requests drew on Azure's per-partition, per-queue and per-account
    budgets (``bench.partitions``); the client's are left out, as in the counts."""


@contextlib.contextmanager
def installation(endpoints: Sequence[Endpoint], latency_ms: float,
                 telemetry: Telemetry | None = None) -> Iterator[Installation]:
    """A fresh Azurite with ``endpoints`` provisioned; provisioning is not counted.

    ``telemetry`` goes to both buses, the endpoints' and the client's (one process, one
    OpenTelemetry SDK); without it both use the global providers - no-ops unless an SDK was
    installed globally, which the benchmark never does."""
    with azurite(latency_ms) as connection, counting_requests(connection) as wire:
        plain = AzureStorage.from_connection_string(connection)
        book = LoadBook()
        loaded = recording(plain, book)
        probe = AckProbe(loaded.queues)
        storage, counter = counting_storage(Storage(queues=probe, blobs=loaded.blobs,
                                            tables=loaded.tables))
        bus = Bus(storage, endpoints, telemetry=telemetry)
        bus.provision()
        counter.reset()
        client = Bus(AzureStorage.from_connection_string(connection), endpoints,
                     telemetry=telemetry)
        yield Installation(bus, client, plain, counter, probe, wire, book)


@dataclass
class LoadOutcome:
    flow: Flow
    outcomes: Counter[str]
    ops: dict[tuple[str, str], int]
    errors: dict[tuple[str, str, str], int]
    requests: dict[tuple[str, str], int]
    """HTTP requests of the consumer threads (the endpoints)."""
    client_requests: dict[tuple[str, str], int]
    """HTTP requests of the producer threads (the client's sends)."""
    cpu: CpuUse
    client_group: dict[str, int]
    """The client's send group: flushes, and the copies that shared one with others."""
    draws: dict[Budget, int]
    """The endpoints' draws on Azure's budgets (``bench.partitions``)."""


def drive(inst: Installation, cfg: BenchConfig, *, consume: Sequence[str], messages: int,
          copies: int, send: Callable[[int], None], producers: int | None = None,
          pace: Callable[[int], None] | None = None,
          on_ack: Callable[[QueueMessage], None] | None = None,
          settled: Callable[[str], bool] | None = None) -> LoadOutcome:
    """Send ``messages`` (each delivered as ``copies`` signals to the ``consume`` endpoints)
    with the producers while ``cfg.loops`` leasing loops per consumed endpoint process them.

    Each consumer thread owns one Worker per consumed endpoint and polls them in turn. The
    run ends at the last acknowledgement; the operation counts are taken right then.
    ``pace(seq)``, if given, is called before each send (a fixed-rate load); ``on_ack(message)``
    after each acknowledgement, on the consumer thread that made it; ``settled(body)``, if
    given, whether an acknowledged signal counts (``AckProbe.settled``).
    """
    flow = Flow(messages * copies, cfg.window)
    inst.probe.watched = frozenset(inst.bus.names.queue(name) for name in consume)

    def acked(message: QueueMessage) -> None:
        if on_ack is not None:
            on_ack(message)
        flow.acked()

    inst.probe.on_ack = acked
    inst.probe.settled = settled or (lambda body: True)
    crews = [[Worker(inst.bus, name, batch_size=cfg.batch) for name in consume]
             for _ in range(cfg.loops)]

    def consumer(workers: list[Worker]) -> Callable[[threading.Event], None]:
        return lambda stop: poll_until_stopped(
            lambda: sum(worker.poll_once() for worker in workers), stop, cfg.idle_poll,
            cfg.idle_max)

    def producer(seqs: range) -> Callable[[threading.Event], None]:
        def run(stop: threading.Event) -> None:
            for seq in seqs:
                if pace is not None:
                    pace(seq)
                if not flow.before_send(copies, stop):
                    return
                send(seq)
        return run

    inst.counter.reset()
    inst.wire.reset()
    inst.book.reset()
    used = run_load(flow, [producer(s) for s in shares(messages, producers or cfg.producers)],
             [consumer(crew) for crew in crews], cfg.timeout)
    ops, errors = inst.counter.snapshot(), inst.counter.errors()
    draws = inst.book.snapshot()
    outcomes: Counter[str] = Counter()
    for crew in crews:
        for worker in crew:
            outcomes.update(worker.outcomes)
    group = inst.client.parts.sender.group
    return LoadOutcome(flow, outcomes, ops, errors, inst.wire.side("consumer"),
                       inst.wire.side("producer"), used,
                       {"flushes": group.flushes if group else 0,
                        "grouped": group.grouped if group else 0}, draws)


def check_outcomes(scenario: str, outcomes: Counter[str],
                   allowed: tuple[str, ...] = ("processed", "duplicate")) -> None:
    """No message of a benchmark may end in the poison queue. Duplicates are allowed: signals
    are at-least-once (a sender's retry can put a second copy on the queue) and the
    protocol drops them; the state check is what proves each effect happened once. A
    scenario with sessions also allows ``deferred``: copies set aside until their turn."""
    bad = {k: n for k, n in outcomes.items() if k not in allowed}
    if bad:
        raise BenchError(f"{scenario}: unexpected outcomes {bad} (all: {dict(outcomes)})")


def count_signals(queues: Queues, queue: str,
                  each: Callable[[str], None] | None = None) -> tuple[int, int]:
    """(queue messages, signals) waiting in ``queue``, a bundle counting as its signals. Leases
    everything it counts (the benchmark's queues are thrown away afterwards). ``each(body)``,
    if given, is called with every signal's body."""
    messages = signals = 0
    while batch := queues.receive(queue, max_messages=32, lease=600):
        messages += len(batch)
        found = parts(batch)
        signals += len(found)
        if each is not None:
            for part in found:
                each(part.body)
    return messages, signals
