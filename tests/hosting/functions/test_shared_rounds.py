"""Concurrent invocations of one endpoint share a claim round (bus.hosting.functions.rounds):
fewer requests than one round each, each invocation settles its own message, each signal's
processing continues its own invocation's trace, and an invocation whose round never settled
it raises (its message is delivered again) - in memory and on Azurite."""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bus import Command, Context, Endpoint, Settings
from bus.adapters.memory import InMemoryStorage
from bus.adapters.memory.faults import Fault, NoFaults
from bus.hosting.functions.rounds import RoundLost, SharedRounds
from bus.hosting.functions.trigger import QueueTrigger
from bus.hosting.settlement import Settlement
from bus.observability import Telemetry
from bus.protocol.delivery import Delivery, Outcome
from bus.seams import Seams
from bus.storage import Storage
from bus.testing.seamed import seamed_bus

INVOCATIONS = 5


class Tick(Command):
    n: int


class Tock(Command):
    n: int


class Counting(NoFaults):
    """The in-memory store's requests, by service and operation."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    def before_call(self, service: str, operation: str) -> Fault | None:
        self.calls[(service, operation)] += 1
        return None


class Hop:
    """``ticks`` handles each Tick in its own partition and sends a Tock to ``tocks``; the
    first Tick's handler waits (``hold``) until the other invocations are in line."""

    def __init__(self, storage: Storage, prefix: str,
                 telemetry: Telemetry | None = None) -> None:
        self.seen: list[int] = []
        self.hold: Callable[[], None] = lambda: None
        ticks, tocks = Endpoint("ticks"), Endpoint("tocks")

        @ticks.handles(Tick, partition=lambda m: str(m.n))
        def tick(message: Tick, ctx: Context) -> None:
            if not self.seen:
                self.hold()
            self.seen.append(message.n)
            ctx.send(Tock(n=message.n))

        @tocks.handles(Tock, partition=lambda m: str(m.n))
        def tock(message: Tock, ctx: Context) -> None:
            return None

        self.bus = seamed_bus(Seams(), storage, [ticks, tocks], prefix=prefix,
                              settings=Settings(group_sends=False), telemetry=telemetry)
        self.bus.provision()
        self.trigger = QueueTrigger(self.bus, "ticks", max_dequeue_count=5,
                                    inline_dispatch_max=None)

    def leased(self, count: int) -> list[bytes]:
        """``count`` Ticks sent, taken off the queue as the host hands them to invocations
        (deleted: what the host does once each function returns)."""
        queues, queue = self.bus.storage.queues, self.bus.names.queue("ticks")
        for n in range(count):
            self.bus.send(Tick(n=n))
        raws: list[bytes] = []
        while len(raws) < count:
            for message in queues.receive(queue, max_messages=32, lease=60):
                queues.delete(queue, message)
                raws.append(base64.b64decode(message.body))
        return raws

    def invoke_together(self, raws: list[bytes],
                        traces: list[dict[str, str] | None] | None = None) -> list[Any]:
        """One invocation per body, each on a thread of its own, the first holding its round
        until the others wait in line; each invocation's Delivery or exception."""
        results: list[Any] = [None] * len(raws)
        contexts = traces or [None] * len(raws)
        self.hold = lambda: _until(lambda: self.trigger.rounds.waiting == len(raws) - 1)

        def invoke(index: int) -> None:
            try:
                results[index] = self.trigger.deliver(raws[index], 1, contexts[index])
            except Exception as exc:
                results[index] = exc

        first = threading.Thread(target=invoke, args=(0,))
        first.start()
        _until(lambda: bool(self.trigger.rounds.rounds))
        others = [threading.Thread(target=invoke, args=(i,)) for i in range(1, len(raws))]
        for thread in others:
            thread.start()
        for thread in [first, *others]:
            thread.join(timeout=60)
        return results


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_invocations_that_arrive_during_a_round_share_the_next(storage: Storage,
                                                               prefix: str) -> None:
    hop = Hop(storage, prefix)
    results = hop.invoke_together(hop.leased(INVOCATIONS))
    assert all(isinstance(r, Delivery) and r.outcome is Outcome.PROCESSED for r in results)
    assert sorted(hop.seen) == list(range(INVOCATIONS))
    rounds = hop.trigger.rounds
    assert (rounds.rounds, rounds.shared) == (2, INVOCATIONS - 1)
    tocks = hop.bus.storage.queues.receive(hop.bus.names.queue("tocks"), max_messages=32,
                                           lease=60)
    assert len(tocks) == 2, "one bundle of Tocks per round"


def _requests(together: bool) -> Counter[tuple[str, str]]:
    counting = Counting()
    hop = Hop(InMemoryStorage(hooks=counting), "t")
    raws = hop.leased(INVOCATIONS)
    counting.calls.clear()
    if together:
        hop.invoke_together(raws)
    else:
        for raw in raws:
            hop.trigger.deliver(raw, 1)
    assert sorted(hop.seen) == list(range(INVOCATIONS))
    return counting.calls


def test_a_shared_round_makes_fewer_requests_than_a_round_each() -> None:
    alone, shared = _requests(together=False), _requests(together=True)
    assert sum(shared.values()) < sum(alone.values()) - INVOCATIONS, (alone, shared)
    assert shared[("queue", "send")] == 2 and alone[("queue", "send")] == INVOCATIONS


def test_each_signal_is_processed_in_its_own_invocation_s_trace() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hop = Hop(InMemoryStorage(), "t", telemetry=Telemetry(tracer_provider=provider))
    tracer = provider.get_tracer("host")
    traces: list[dict[str, str] | None] = []
    parents: list[int] = []
    for n in range(3):
        with tracer.start_as_current_span(f"invocation {n}") as span:
            parents.append(span.get_span_context().span_id)
            context = span.get_span_context()
            traces.append({"traceparent": f"00-{context.trace_id:032x}-"
                                          f"{context.span_id:016x}-01"})
    results = hop.invoke_together(hop.leased(3), traces)
    assert all(isinstance(r, Delivery) for r in results), results
    processed = [s for s in exporter.get_finished_spans()
                 if s.name == "process ticks" and s.kind is trace.SpanKind.CONSUMER]
    assert sorted(s.parent.span_id for s in processed if s.parent) == sorted(parents)


class _Settlement:
    """A settlement that fails the way a bug or a dying thread would."""

    def __init__(self, failure: BaseException, started: threading.Event,
                 go: threading.Event) -> None:
        self.failure, self.started, self.go = failure, started, go

    def settle(self, messages: list[Any]) -> list[Any]:
        self.started.set()
        self.go.wait(30)
        raise self.failure


class _Dying(BaseException):
    """What ends a thread half-way without being an error a host handles."""


@pytest.mark.parametrize(("failure", "members_raise"), [
    (RuntimeError("a bug"), RuntimeError), (_Dying(), RoundLost)])
def test_a_round_that_fails_or_dies_leaves_every_member_raising(
        failure: BaseException, members_raise: type[Exception]) -> None:
    started, go = threading.Event(), threading.Event()
    rounds: SharedRounds[Any] = SharedRounds(cast(Settlement[Any], _Settlement(failure, started,
                                                                               go)))
    raised: dict[int, BaseException] = {}

    def invoke(index: int) -> None:
        try:
            rounds.settle(index)
        except BaseException as exc:  # the leader's _Dying too
            raised[index] = exc

    leader = threading.Thread(target=invoke, args=(0,))
    leader.start()
    started.wait(30)
    members = [threading.Thread(target=invoke, args=(i,)) for i in (1, 2)]
    for thread in members:
        thread.start()
    _until(lambda: rounds.waiting == 2)
    go.set()  # the leader's round fails; the members' round (led by member 1) fails too
    for thread in [leader, *members]:
        thread.join(timeout=30)
    assert type(raised[0]) is type(failure)
    if isinstance(failure, _Dying):  # the next round is led by a member: it dies the same way
        assert sorted(type(raised[i]).__name__ for i in (1, 2)) == ["RoundLost", "_Dying"]
    else:
        assert all(isinstance(raised[i], members_raise) for i in (1, 2))
    assert rounds.waiting == 0 and not rounds.busy
