"""Storage trouble in the queue trigger: a message whose deliveries keep meeting storage errors
is put back on the queue carrying its delivery count, and once the configured number of
deliveries is reached, counted across the copies, the bus poisons it with the reason; an
original whose delete failed after its copy was put back leaves no spurious poison entry - on
the in-memory backend and Azurite.

``Host`` plays the Functions host's queue rules (QueueProcessor): success deletes the message;
a failure at ``maxDequeueCount`` copies it to ``<queue>-poison``, an earlier one makes it
visible again (visibility timeout 0 here); a message whose dequeue count is already over
``maxDequeueCount`` is poisoned without invoking the function.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

import bus.envelope as wire
import bus.hosting.settlement as settlement_module
from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.hosting.functions.trigger import QueueTrigger
from bus.protocol.delivery import Delivery, Outcome
from bus.protocol.poison.poisoned import ReplayResult
from bus.protocol.tokens.inbox import TokenState
from bus.storage import NotFound, Storage, TableOp, TransientError
from bus.storage.limits import AZURE

MAX = 5
REASON = f"storage errors on {MAX} deliveries (max delivery count)"


class Tick(Command):
    n: int


@dataclass
class Host:
    """The Functions host's rules for one queue trigger, one message at a time."""

    bus: Bus
    trigger: QueueTrigger
    lose_delete: Callable[[Delivery], bool] = lambda delivery: False
    """Whether the host's delete after a successful invocation fails (the message then comes
    back after its lease, with a higher dequeue count)."""
    invocations: int = 0

    @property
    def queue(self) -> str:
        return self.bus.names.queue(self.trigger.endpoint)

    def run(self, limit: int = 4 * MAX) -> None:
        for _ in range(limit):
            if not self.step():
                return
        raise AssertionError(f"the queue is not empty after {limit} deliveries: a message "
                             "cycles")

    def step(self) -> bool:
        queues = self.bus.storage.queues
        received = queues.receive(self.queue, max_messages=1, lease=30)
        if not received:
            return False
        [message] = received
        if message.dequeue_count > MAX:  # poisoned without invoking the function
            self._poison(message.body)
            queues.delete(self.queue, message)
            return True
        self.invocations += 1
        try:
            delivery = self.trigger.deliver(base64.b64decode(message.body),
                                            message.dequeue_count)
        except Exception:
            if message.dequeue_count >= MAX:
                self._poison(message.body)
                queues.delete(self.queue, message)
            else:
                queues.extend(self.queue, message, lease=0)
            return True
        if self.lose_delete(delivery):
            queues.extend(self.queue, message, lease=0)  # back once its lease ends
        else:
            queues.delete(self.queue, message)
        return True

    def _poison(self, body: str) -> None:
        self.bus.storage.queues.send(self.bus.names.poison_queue(self.trigger.endpoint), body)


@dataclass
class Outage:
    """Commits (the state table's transactions) of the chosen partitions fail while on."""

    on: bool = True
    partitions: Sequence[str] | None = None  # None: all
    handler: bool = False  # the handler raises

    def hits(self, ops: Sequence[TableOp]) -> bool:
        return self.on and (self.partitions is None or any(
            op.entity.partition_key in self.partitions for op in ops))


@pytest.fixture(autouse=True)
def _no_requeue_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settlement_module, "REQUEUE_DELAY_SECONDS", 0.0)


def build(storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch,
          outage: Outage, *, bundles: bool = True) -> tuple[Bus, Host]:
    # No retry delay: a failed handler's message is released by the host (the function's own
    # postponement for a retry delay is tested in test_retry_delays).
    ticks = Endpoint("ticks", retry=RetryPolicy(delays=(0.0,)))

    @ticks.handles(Tick, partition=lambda m: str(m.n))
    def tick(message: Tick, ctx: Context) -> None:
        if outage.handler:
            raise RuntimeError(f"tick {message.n} fails")
        row = ctx.state.get("tick") or {"times": 0}
        times = row["times"]
        assert isinstance(times, int)
        ctx.state.put("tick", {"times": times + 1})

    bus = Bus(storage, [ticks], prefix=prefix,
              settings=Settings(max_delivery_count=MAX, signal_bundles=bundles,
                                crash_retry_delays=()))  # what the host moves: entries
    bus.provision()
    state, transact = bus.names.state_table("ticks"), storage.tables.transact

    def failing(table: str, ops: Sequence[TableOp]) -> list[str]:
        if table == state and outage.hits(ops):
            raise TransientError("injected: the commit's request timed out")
        return transact(table, ops)

    monkeypatch.setattr(storage.tables, "transact", failing)
    trigger = QueueTrigger(bus, "ticks", max_dequeue_count=MAX, inline_dispatch_max=None,
                           in_process_tries=1)
    return bus, Host(bus, trigger)


def times(bus: Bus, n: int) -> int:
    try:
        row = bus.storage.tables.get(bus.names.state_table("ticks"), str(n), "tick")
    except NotFound:
        return 0
    value = row.properties["times"]
    assert isinstance(value, int)
    return value


def live(bus: Bus) -> int:
    return bus.storage.queues.depth(bus.names.queue("ticks"))


# -- (a) storage errors on every delivery --------------------------------------------------
def test_storage_errors_on_every_delivery_poison_the_message_after_max_deliveries(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    outage = Outage()
    bus, host = build(storage, prefix, monkeypatch, outage)
    bus.send(Tick(n=1))
    host.run()
    assert host.invocations == MAX  # counted across the original and its copy
    assert live(bus) == 0 and times(bus, 1) == 0
    [letter] = bus.poisoned("ticks").entries()
    assert letter.entry.reason == REASON and letter.entry.dequeue_count == MAX
    assert letter.entry.exception == "TransientError: injected: the commit's request timed out"
    assert letter.token is TokenState.POISONED and letter.replayable
    # the entry holds the signal as sent: a replay starts counting afresh
    assert "deliveries" not in json.loads(base64.b64decode(letter.entry.original_body))
    outage.on = False  # storage is back: the replay is processed once
    assert list(bus.poisoned("ticks").replay().values()) == ["replayed"]
    host.run()
    assert times(bus, 1) == 1 and live(bus) == 0 and bus.poisoned("ticks").entries() == []


def until_requeued(host: Host) -> None:
    """Deliver until the trigger puts a copy back (the original is then deleted)."""
    outcomes: list[Outcome] = []

    def record(delivery: Delivery) -> bool:
        outcomes.append(delivery.outcome)
        return False

    host.lose_delete = record
    while Outcome.REQUEUED not in outcomes:
        assert host.step()
    host.lose_delete = Host.lose_delete


def test_the_copy_is_put_back_one_delivery_early_with_its_count(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bus, host = build(storage, prefix, monkeypatch, Outage())
    bus.send(Tick(n=1))
    until_requeued(host)
    assert host.invocations == MAX - 1  # the host's last delivery of the original is unused
    [copy] = bus.storage.queues.receive(bus.names.queue("ticks"), max_messages=2, lease=30)
    assert copy.dequeue_count == 1
    assert wire.carried_deliveries(base64.b64decode(copy.body))[1] == MAX - 1


# -- (b) the host's delete of the original failed ------------------------------------------
@pytest.mark.parametrize("heals", [True, False], ids=["storage-back", "storage-still-down"])
def test_an_original_whose_delete_failed_leaves_no_spurious_poison_entry(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch, heals: bool) -> None:
    outage = Outage()
    bus, host = build(storage, prefix, monkeypatch, outage)
    lost: list[Delivery] = []

    def lose_the_first_requeue(delivery: Delivery) -> bool:
        if delivery.outcome is not Outcome.REQUEUED or lost:
            return False
        lost.append(delivery)
        outage.on = not heals
        return True

    host.lose_delete = lose_the_first_requeue
    bus.send(Tick(n=1))
    host.run()
    assert lost and live(bus) == 0
    letters = bus.poisoned("ticks").entries()
    if heals:  # the original and the copy: one processes it, the other is a duplicate
        assert letters == [] and times(bus, 1) == 1
    else:  # one entry, with the reason, whichever of the two met the last error
        assert [(x.entry.reason, x.token) for x in letters] == [(REASON, TokenState.POISONED)]
        assert times(bus, 1) == 0


# -- bundles --------------------------------------------------------------------------------
def test_a_bundle_puts_back_only_the_part_that_met_storage_errors(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bus, host = build(storage, prefix, monkeypatch, Outage(partitions=["2"]), bundles=False)
    queue = bus.names.queue("ticks")
    bus.send(Tick(n=1))
    bus.send(Tick(n=2))
    texts = []
    for message in bus.storage.queues.receive(queue, max_messages=2, lease=30):
        texts.append(base64.b64decode(message.body).decode())
        bus.storage.queues.delete(queue, message)
    bus.storage.queues.send(queue, wire.encode_bundle(texts))
    host.run()
    assert host.invocations == MAX  # the bundle MAX - 1 times, then the part alone once
    assert [times(bus, 1), times(bus, 2), live(bus)] == [1, 0, 0]
    [letter] = bus.poisoned("ticks").entries()
    assert letter.entry.reason == REASON
    assert json.loads(base64.b64decode(letter.entry.original_body))["message_type"] == "Tick"
    assert letter.entry.envelope is not None and letter.entry.envelope.payload is not None
    assert json.loads(letter.entry.envelope.payload)["n"] == 2


# -- (c) the normal paths are unchanged --------------------------------------------------------
def test_a_delivery_without_storage_trouble_is_processed_once(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bus, host = build(storage, prefix, monkeypatch, Outage(on=False))
    bus.send(Tick(n=1))
    host.run()
    assert host.invocations == 1 and times(bus, 1) == 1 and live(bus) == 0
    assert bus.poisoned("ticks").entries() == []


def test_a_failing_handler_is_poisoned_by_the_bus_at_max_deliveries(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bus, host = build(storage, prefix, monkeypatch, Outage(on=False, handler=True))
    bus.send(Tick(n=1))
    host.run()
    assert host.invocations == MAX and live(bus) == 0
    [letter] = bus.poisoned("ticks").entries()
    assert letter.entry.reason == f"handler failed {MAX} times (max delivery count)"


def test_a_copy_counts_its_earlier_deliveries_for_handler_failures_too(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    outage = Outage()
    bus, host = build(storage, prefix, monkeypatch, outage)
    bus.send(Tick(n=1))
    until_requeued(host)
    outage.on, outage.handler = False, True  # storage is back; now the handler fails
    host.run()
    assert host.invocations == MAX and live(bus) == 0
    [letter] = bus.poisoned("ticks").entries()
    assert letter.entry.reason == f"handler failed {MAX} times (max delivery count)"


# -- the wire format --------------------------------------------------------------------------
def test_a_signal_without_a_count_is_left_as_it_is() -> None:
    raw = (b'{"bus":1,"message_id":"m","headers":{"deliveries":"3"},'
           b'"payload":"{\\"deliveries\\": 2}"}')
    assert wire.carried_deliveries(raw) == (raw, 0)
    assert wire.carried_deliveries(b"not json") == (b"not json", 0)


def test_the_count_travels_in_the_envelope_and_comes_off_again() -> None:
    raw = '{"bus":1,"message_id":"m","payload":"\u00e9"}'.encode()
    annotated = wire.with_deliveries(raw, 4, AZURE.signal_bytes)
    assert annotated is not None
    assert json.loads(annotated) == {**json.loads(raw), "deliveries": 4}
    stripped, count = wire.carried_deliveries(annotated)
    assert count == 4 and json.loads(stripped) == json.loads(raw)
    assert json.loads(wire.with_deliveries(annotated, 0, AZURE.signal_bytes) or b"") == \
        json.loads(raw)
    assert wire.with_deliveries(b"[1]", 4, AZURE.signal_bytes) is None
    assert wire.with_deliveries(raw, 4, len(raw) + 5) is None  # no room for the count


def test_a_replay_starts_counting_afresh(storage: Storage, prefix: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bus, host = build(storage, prefix, monkeypatch, Outage())
    queue = bus.names.queue("ticks")
    bus.send(Tick(n=1))
    [message] = bus.storage.queues.receive(queue, max_messages=1, lease=30)
    bus.storage.queues.delete(queue, message)
    copy = wire.with_deliveries(base64.b64decode(message.body), MAX - 1, AZURE.signal_bytes)
    assert copy is not None  # a copy put back, moved to the poison queue by the host:
    bus.storage.queues.send(bus.names.poison_queue("ticks"), base64.b64encode(copy).decode())
    [letter] = bus.poisoned("ticks").entries()  # adopted: token poisoned
    assert letter.token is TokenState.POISONED
    assert bus.poisoned("ticks").replay() == {letter.id: ReplayResult.REPLAYED}
    host.run()  # storage still fails: the replayed message gets all its deliveries
    assert host.invocations == MAX
    assert [x.entry.reason for x in bus.poisoned("ticks").entries()] == [REASON]
