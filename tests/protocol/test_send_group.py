"""Group commit of concurrent sends (``bus.protocol.send.group``): sends that arrive while
another is on the wire share one token transaction and one bundle, and what a shared flush
leaves undone each caller finishes alone. In-memory and Azurite, with real threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bus import Bus, Command, Context, Endpoint, Settings
from bus.protocol.send.group import Gate
from bus.protocol.tokens.shards import endpoint_of
from bus.seams import Seams
from bus.storage import Storage, TableOp, TransientError
from bus.testing import drain
from bus.testing.counting import counting_storage
from bus.testing.seamed import seamed_bus
from bus.testing.transport import ForwardingQueues
from tests.support.orderflow import state


class Add(Command):
    key: str


def build(storage: Storage, prefix: str, *, group: bool = True,
          gate: Callable[[], Gate] = threading.Event, max_depth: int | None = None) -> Bus:
    counter = Endpoint("counter", max_queue_depth=max_depth)

    @counter.handles(Add, partition=lambda m: m.key)
    def add(message: Add, ctx: Context) -> None:
        row = ctx.state.get("n") or {"n": 0}
        ctx.state.put("n", {"n": int(row["n"] or 0) + 1})

    bus = seamed_bus(Seams(gate=gate), storage, [counter], prefix=prefix,
                     settings=Settings(group_sends=group, depth_check_seconds=0))
    bus.provision()
    return bus


def counts(bus: Bus, keys: Sequence[str]) -> list[int]:
    return [int((state(bus, "counter", key, "n") or {"n": 0})["n"]) for key in keys]


def send_interrupted(bus: Bus, key: str, interrupted: list[BaseException]) -> None:
    """Send ``key``, noting a KeyboardInterrupt instead of raising it."""
    try:
        bus.send(Add(key=key))
    except KeyboardInterrupt as exc:
        interrupted.append(exc)


def in_threads(calls: Sequence[Callable[[], Any]]) -> None:
    errors: list[BaseException] = []

    def run(call: Callable[[], Any]) -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors


class HeldQueues(ForwardingQueues):
    """Holds the first queue send until ``release`` is set: the sends that arrive meanwhile
    queue up behind that flush, so the next flush is a group, deterministically."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.release = threading.Event()
        self.holding = threading.Event()
        self.bodies: list[str] = []
        self._first = True
        self.fail_next = 0
        self.fail_depth = 0

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        if self._first:
            self._first = False
            self.holding.set()
            assert self.release.wait(30)
        if self.fail_next:
            self.fail_next -= 1
            raise TransientError("injected: queue send failed before effect")
        self.bodies.append(body)
        self._inner.send(queue, body, delay=delay)

    def depth(self, queue: str) -> int:
        if self.fail_depth and self.release.is_set():  # the group's look: all wait in it
            self.fail_depth -= 1
            raise TransientError("injected: queue properties failed")
        return self._inner.depth(queue)


class FailingTables:
    """Forwards every call; the next ``fail_after`` transactions take effect and then raise
    (the response is lost: the outcome is unknown to the caller)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.fail_after = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def transact(self, table: str, ops: Sequence[TableOp]) -> list[str]:
        etags: list[str] = self._inner.transact(table, ops)
        if self.fail_after and any(endpoint_of(op.entity.partition_key) == "counter"
                                  for op in ops):
            self.fail_after -= 1
            raise TransientError("injected: transaction response lost after effect")
        return etags


def grouped_sends(bus: Bus, held: HeldQueues, keys: Sequence[str]) -> None:
    """Send ``keys[0]`` (held on the wire), then the others while it is held; release it once
    they all wait in the group."""
    group = bus.parts.sender.group
    assert group is not None

    def release_when_waiting() -> None:
        deadline = time.monotonic() + 30
        while group.waiting < len(keys) - 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        held.release.set()

    in_threads([lambda k=key: bus.send(Add(key=k)) for key in keys]  # type: ignore[misc]
               + [release_when_waiting])


def test_concurrent_sends_share_one_transaction_and_one_bundle(storage: Storage,
                                                               prefix: str) -> None:
    held = HeldQueues(storage.queues)
    counted, counter = counting_storage(Storage(held, storage.blobs, storage.tables))
    bus = build(counted, prefix)
    counter.reset()
    keys = [f"k{i}" for i in range(6)]
    grouped_sends(bus, held, keys)
    ops = counter.snapshot()
    # The first send alone (one insert, one signal), the five others together.
    assert ops[("table", "insert")] == 1 and ops[("table", "transact")] == 1
    assert ops[("queue", "send")] == 2 and len(held.bodies) == 2
    assert bus.parts.sender.group is not None and bus.parts.sender.group.grouped == 5
    assert drain(bus).signals == 6 and counts(bus, keys) == [1] * 6
    assert bus.parts.inbox.all() == []


def test_a_lone_send_makes_two_requests_and_never_waits(storage: Storage, prefix: str) -> None:
    counted, counter = counting_storage(storage)
    bus = build(counted, prefix)
    counter.reset()
    bus.send(Add(key="a"))
    assert counter.snapshot() == {("table", "insert"): 1, ("queue", "send"): 1}
    assert drain(bus).signals == 1 and counts(bus, ["a"]) == [1]


def test_a_group_whose_token_transaction_failed_is_fenced_and_sent_alone(
        storage: Storage, prefix: str) -> None:
    held = HeldQueues(storage.queues)
    tables = FailingTables(storage.tables)
    bus = build(Storage(held, storage.blobs, tables), prefix)  # type: ignore[arg-type]
    tables.fail_after = 1  # the group's transaction lands, but its caller never hears so
    keys = [f"k{i}" for i in range(4)]
    grouped_sends(bus, held, keys)
    # The group's tokens exist (the transaction took effect) but each caller fenced its
    # attempt id and sent again with a fresh one: its fenced token can never be processed.
    tokens = bus.parts.inbox.all()
    assert len([t for t in tokens if not t.processable]) == 3
    assert drain(bus).signals == 4 and counts(bus, keys) == [1] * 4
    assert len(held.bodies) == 1 + 3  # the first signal, then three alone


def test_a_group_whose_bundle_failed_sends_each_signal_again(storage: Storage,
                                                             prefix: str) -> None:
    held = HeldQueues(storage.queues)
    bus = build(Storage(held, storage.blobs, storage.tables), prefix)
    held.fail_next = 2  # the next two signal requests fail before their effect
    keys = [f"k{i}" for i in range(4)]
    grouped_sends(bus, held, keys)
    assert drain(bus).signals == 4 and counts(bus, keys) == [1] * 4
    assert bus.parts.inbox.all() == []


def test_a_group_whose_depth_read_failed_sends_each_signal_alone(storage: Storage,
                                                                 prefix: str) -> None:
    # The tokens are written before the group looks at the destination's depth: a failed look
    # must not fail the callers' sends (they would send again, leaving orphan tokens), but
    # leave each caller to signal its own copy.
    held = HeldQueues(storage.queues)
    bus = build(Storage(held, storage.blobs, storage.tables), prefix, max_depth=1000)
    held.fail_depth = 1
    keys = [f"k{i}" for i in range(4)]
    grouped_sends(bus, held, keys)
    assert held.fail_depth == 0
    assert drain(bus).signals == 4 and counts(bus, keys) == [1] * 4
    assert bus.parts.inbox.all() == []


def test_without_grouping_every_send_makes_its_own_requests(storage: Storage,
                                                            prefix: str) -> None:
    counted, counter = counting_storage(storage)
    bus = build(counted, prefix, group=False)
    counter.reset()
    keys = [f"k{i}" for i in range(8)]
    bus.send_many([Add(key=k) for k in keys], max_in_flight=8)
    assert counter.snapshot() == {("table", "insert"): 8, ("queue", "send"): 8}
    assert bus.parts.sender.group is None
    assert drain(bus).signals == 8 and counts(bus, keys) == [1] * 8


def test_a_leader_that_dies_mid_flush_does_not_strand_the_others(storage: Storage,
                                                                 prefix: str) -> None:
    class Dying(ForwardingQueues):
        def __init__(self, inner: Any) -> None:
            super().__init__(inner)
            self.release = threading.Event()
            self.holding = threading.Event()
            self.died = False

        def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
            if not self.died:
                self.died = True
                self.holding.set()
                assert self.release.wait(30)
                raise KeyboardInterrupt  # not a storage error: the leader's thread ends here
            self._inner.send(queue, body, delay=delay)

    dying = Dying(storage.queues)
    bus = build(Storage(dying, storage.blobs, storage.tables), prefix)
    group = bus.parts.sender.group
    assert group is not None
    interrupted: list[BaseException] = []

    def release_when_waiting() -> None:
        while group.waiting < 2:
            time.sleep(0.005)
        dying.release.set()

    leader = threading.Thread(target=send_interrupted, args=(bus, "k0", interrupted))
    leader.start()
    assert dying.holding.wait(30)  # k0 leads and is on the wire: the others must wait
    in_threads([lambda: bus.send(Add(key="k1")), lambda: bus.send(Add(key="k2")),
                release_when_waiting])
    leader.join(30)
    assert len(interrupted) == 1
    assert drain(bus).signals == 2 and counts(bus, ["k1", "k2"]) == [1, 1]


def test_a_sender_interrupted_while_waiting_leaves_the_group_usable(storage: Storage,
                                                                    prefix: str) -> None:
    class Interrupted(threading.Event):
        """The gate of the first caller that has to wait: its wait is interrupted (Ctrl-C)."""

        fired = False

        def wait(self, timeout: float | None = None) -> bool:
            if not Interrupted.fired:
                Interrupted.fired = True
                raise KeyboardInterrupt
            return super().wait(timeout)

    held = HeldQueues(storage.queues)
    bus = build(Storage(held, storage.blobs, storage.tables), prefix, gate=Interrupted)
    interrupted: list[BaseException] = []
    leader = threading.Thread(target=lambda: bus.send(Add(key="k0")))
    leader.start()
    assert held.holding.wait(30)  # k0 leads and is on the wire: k1 has to wait
    send_interrupted(bus, "k1", interrupted)
    held.release.set()  # the first send goes on only once the second gave up
    leader.join(30)
    assert len(interrupted) == 1
    group = bus.parts.sender.group
    assert group is not None and group.waiting == 0 and not group.busy
    third = threading.Thread(target=lambda: bus.send(Add(key="k2")), daemon=True)
    third.start()
    third.join(30)
    assert not third.is_alive()  # it would wait forever if the group still thought it busy
    assert drain(bus).signals == 2 and counts(bus, ["k0", "k1", "k2"]) == [1, 0, 1]
