"""The bus end to end, on the in-memory backend and on real Azurite, the same scenarios."""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable

import pytest

from bus import Bus, Settings
from bus.adapters.memory import Fault
from bus.protocol.poison.queue import PoisonEntry
from bus.protocol.tokens.inbox import TokenState
from bus.seams import Seams
from bus.storage import Storage
from bus.testing import InMemoryStorage, drain
from tests.support.orderflow import Flaky, OrderPlaced, PlaceOrder, build, state


def leftovers(bus: Bus) -> list[str]:
    tokens = [f"token {t.endpoint}/{t.attempt_id}" for t in bus.parts.inbox.all()
              if t.state is not TokenState.POISONED]
    return tokens + [f"payload {r.blob}" for r in bus.parts.payloads.refs()]


def poison_entries(bus: Bus, endpoint: str) -> list[PoisonEntry]:
    queue = bus.names.poison_queue(endpoint)
    messages = bus.storage.queues.receive(queue, max_messages=32, lease=30)
    return [PoisonEntry.decode(m.body) for m in messages]


def test_command_and_event_reach_every_subscriber_once(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(PlaceOrder(order_id="o-1", amount=42))
    outcomes = drain(bus)
    assert outcomes["orders"] == {"processed": 1}
    assert state(bus, "orders", "o-1", "order") == {"amount": 42, "note_size": 0}
    for subscriber in ("billing", "shipping"):
        assert state(bus, subscriber, "o-1", "seen") == {"times": 1, "amount": 42}
    assert leftovers(bus) == []


def test_duplicate_signals_apply_the_effect_once(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(PlaceOrder(order_id="o-2", amount=7))
    queue = bus.names.queue("orders")
    [signal] = storage.queues.receive(queue, max_messages=1, lease=1)
    storage.queues.extend(queue, signal, lease=0)
    for _ in range(3):  # the transport delivers the same signal four times in all
        storage.queues.send(queue, signal.body)
    outcomes = drain(bus)
    assert outcomes["orders"] == {"processed": 1, "duplicate": 3}
    assert state(bus, "billing", "o-2", "seen") == {"times": 1, "amount": 7}
    assert leftovers(bus) == []


def test_large_payload_travels_by_claim_check_and_is_deleted(storage: Storage,
                                                            prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(PlaceOrder(order_id="o-3", amount=1, note="n" * 100_000))
    [ref] = bus.parts.payloads.refs()
    assert ref.blob.startswith("orders/")
    drain(bus)
    assert state(bus, "orders", "o-3", "order") == {"amount": 1, "note_size": 100_000}
    assert bus.parts.payloads.refs() == []


def test_bad_signals_go_to_the_poison_queue_with_a_reason(storage: Storage,
                                                          prefix: str) -> None:
    bus = build(storage, prefix)
    queue = bus.names.queue("orders")
    storage.queues.send(queue, "not base64 at all!")
    storage.queues.send(queue, base64.b64encode(b"[1, 2]").decode())
    bus.send(PlaceOrder(order_id="o-4", amount=3))  # good messages keep flowing
    drain(bus, fail_fast=False)
    reasons = sorted(e.reason for e in poison_entries(bus, "orders"))
    assert [r.split(":")[0] for r in reasons] == ["body is JSON but not an object",
                                                  "body is not valid base64"]
    assert state(bus, "orders", "o-4", "order") is not None


def test_unknown_type_and_invalid_payload_are_poisoned(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    good = bus.parts.addressing("client").envelopes(
        PlaceOrder(order_id="x", amount=1), message_id="m1", correlation_id="m1",
        causation_id=None)[0]
    unknown = good.model_copy(update={"message_type": "CancelOrder", "attempt_id": "a1"})
    invalid = good.model_copy(update={"payload": '{"order_id": 5}', "attempt_id": "a2"})
    for envelope in (unknown, invalid):
        bus.parts.courier.place(envelope)
        bus.parts.courier.signal(envelope)
    drain(bus, fail_fast=False)
    entries = sorted(poison_entries(bus, "orders"), key=lambda e: e.reason)
    assert [e.reason.split(" ")[0] for e in entries] == ["PlaceOrder", "unknown"]
    assert "failed validation" in entries[0].reason
    assert "unknown message type 'CancelOrder'" in entries[1].reason
    poisoned = sorted(t.attempt_id for t in bus.parts.inbox.all() if t.state is TokenState.POISONED)
    assert poisoned == ["a1", "a2"]


def test_failing_handler_is_retried_then_poisoned_with_the_exception(storage: Storage,
                                                                     prefix: str) -> None:
    bus = build(storage, prefix, settings=Settings(max_delivery_count=3))
    bus.send(Flaky(order_id="o-6"))
    outcomes = drain(bus, fail_fast=False)
    assert outcomes["orders"] == {"poisoned": 1}
    [entry] = poison_entries(bus, "orders")
    assert entry.dequeue_count == 3
    assert entry.exception == "RuntimeError: card declined for o-6"
    assert "max delivery count" in entry.reason


def test_concurrent_subscribes_are_never_lost(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    names = [f"sub{i}" for i in range(12)]
    barrier = threading.Barrier(len(names))

    def subscribe(name: str) -> None:
        barrier.wait()
        bus.parts.topics.subscribe("Race", name)

    threads = [threading.Thread(target=subscribe, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(bus.parts.topics.subscribers("Race")) == sorted(names)
    bus.parts.topics.unsubscribe("Race", "sub3")
    assert "sub3" not in bus.parts.topics.subscribers("Race")


class _FailOnce:
    """Fault hooks: the first call of ``operation`` loses its response after taking effect -
    the caller cannot know whether it happened, as after a crash or a timeout."""

    def __init__(self, service: str, operation: str) -> None:
        self.target, self.fired = (service, operation), False

    def now(self) -> float:
        import time

        return time.monotonic()

    def before_call(self, service: str, operation: str) -> Fault | None:
        if (service, operation) == self.target and not self.fired:
            self.fired = True
            return Fault.FAIL_AFTER
        return None

    def defer(self, effect: Callable[[], None]) -> None:  # pragma: no cover - no ghosts here
        effect()


def test_send_once_sends_a_message_id_once_across_calls(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    command = PlaceOrder(order_id="o1", amount=5)
    assert bus.send_once(command, message_id="job-7-row-1") is True
    assert bus.send_once(command, message_id="job-7-row-1") is False  # a re-run: nothing new
    assert bus.storage.queues.depth(bus.names.queue("orders")) == 1
    drain(bus)
    assert state(bus, "billing", "o1", "seen") == {"times": 1, "amount": 5}
    assert bus.send_once(command, message_id="job-7-row-1") is False  # after processing too
    assert drain(bus)["orders"] == {}
    assert leftovers(bus) == []


@pytest.mark.parametrize("where", [("queue", "send"), ("table", "insert"), ("table", "replace")])
def test_send_once_finishes_what_an_interrupted_call_left(where: tuple[str, str]) -> None:
    # The first call dies at the queue send, the token create or the phase update (response
    # lost after the effect); calling again finishes the job, and the effect happens once.
    from bus.storage import StorageError

    hooks = _FailOnce(*where)
    bus = build(InMemoryStorage(hooks=hooks), "p", settings=Settings(send_attempts=1))
    with pytest.raises(StorageError):
        bus.send_once(PlaceOrder(order_id="o2", amount=9), message_id="m-2")
    assert hooks.fired
    assert bus.send_once(PlaceOrder(order_id="o2", amount=9), message_id="m-2") is False
    outcomes = drain(bus)
    assert state(bus, "shipping", "o2", "seen") == {"times": 1, "amount": 9}
    assert outcomes["orders"].get("processed") == 1
    # A token whose create looked failed was superseded: only its tombstone (fence) remains,
    # until the sweeper's ghost horizon.
    fences = [t for t in bus.parts.inbox.all() if t.state is TokenState.FENCED]
    assert len(fences) == (where == ("table", "insert"))
    assert leftovers(bus) == [f"token {t.endpoint}/{t.attempt_id}" for t in fences]


def test_send_once_forgets_after_the_retention_window() -> None:
    clock = [1000.0]
    bus = build(InMemoryStorage(), "p", seams=Seams(clock=lambda: clock[0]))
    bus.publish_once(OrderPlaced(order_id="o3", amount=1), message_id="e-3")
    clock[0] += 10
    assert bus.parts.ledger.forget(older_than=60) == 0
    clock[0] += 100
    assert bus.parts.ledger.forget(older_than=60) == 1
    assert bus.publish_once(OrderPlaced(order_id="o3", amount=1), message_id="e-3") is True
