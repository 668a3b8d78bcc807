"""Signal bundles (``bus.protocol.copies.bundles``): the signals a worker has for one queue at one
moment travel in one queue message, and every receiver takes them apart - each part
processed, poisoned or retried on its own, the message deleted once all parts are settled.
In-memory and Azurite."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.envelope import Envelope, encode_bundle, split_bundle
from bus.hosting.functions.trigger import QueueTrigger
from bus.protocol.copies.bundles import MAX_PARTS, pack, parts
from bus.protocol.delivery import HandlerFailed, Outcome
from bus.storage import QueueMessage, Storage
from bus.storage.limits import AZURE, check_message
from bus.testing import drain
from tests.support.orderflow import state


class Split(Command):
    keys: list[str]
    fail_once: str = ""


class Add(Command):
    key: str
    fail_once: bool = False


def build(storage: Storage, prefix: str, *, bundles: bool = True) -> Bus:
    splitter, counter = Endpoint("splitter"), Endpoint("counter")

    @splitter.handles(Split, partition=lambda m: "all")
    def split(message: Split, ctx: Context) -> None:
        for key in message.keys:  # several sends to one endpoint: one bundle
            ctx.send(Add(key=key, fail_once=key == message.fail_once))

    failed: set[str] = set()

    @counter.handles(Add, partition=lambda m: m.key, retry=RetryPolicy(immediate=1,
                                                                        delays=(0.0,)))
    def add(message: Add, ctx: Context) -> None:
        if message.fail_once and message.key not in failed:
            failed.add(message.key)
            raise RuntimeError("once")
        row = ctx.state.get("n") or {"n": 0}
        ctx.state.put("n", {"n": int(row["n"] or 0) + 1})

    bus = Bus(storage, [splitter, counter], prefix=prefix,
              settings=Settings(signal_bundles=bundles))
    bus.provision()
    return bus


def count(bus: Bus, key: str) -> int:
    n = (state(bus, "counter", key, "n") or {"n": 0})["n"]
    assert isinstance(n, int)
    return n


def waiting(bus: Bus, endpoint: str) -> list[QueueMessage]:
    """The messages in ``endpoint``'s queue, leased for a moment and put back."""
    queue = bus.names.queue(endpoint)
    found = bus.storage.queues.receive(queue, max_messages=32, lease=30)
    for message in found:
        bus.storage.queues.extend(queue, message, lease=0)
    return found


@pytest.mark.parametrize("batched", [True, False])
def test_sends_to_one_endpoint_share_a_queue_message(storage: Storage, prefix: str,
                                                     batched: bool) -> None:
    bus = build(storage, prefix)
    bus.send(Split(keys=["a", "b", "c"]))
    drain(bus, ["splitter"])
    [message] = waiting(bus, "counter")
    assert len(parts([message])) == 3
    assert drain(bus, ["counter"], batched=batched).total() == {"processed": 3}
    assert [count(bus, k) for k in "abc"] == [1, 1, 1]
    assert waiting(bus, "counter") == []
    assert bus.parts.courier.bundled == 3


def test_turned_off_every_signal_is_its_own_message(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix, bundles=False)
    bus.send(Split(keys=["a", "b", "c"]))
    drain(bus, ["splitter"])
    assert len(waiting(bus, "counter")) == 3
    assert drain(bus, ["counter"]).total() == {"processed": 3}


@pytest.mark.parametrize("batched", [True, False])
def test_a_failed_part_brings_its_bundle_back_and_the_others_are_duplicates(
        storage: Storage, prefix: str, batched: bool) -> None:
    bus = build(storage, prefix)
    bus.send(Split(keys=["a", "b", "c"], fail_once="b"))
    drain(bus, ["splitter"])
    outcomes = drain(bus, ["counter"], batched=batched).total()
    assert outcomes == {"processed": 3, "duplicate": 2}  # a and c again, as duplicates
    assert [count(bus, k) for k in "abc"] == [1, 1, 1]
    assert waiting(bus, "counter") == []


def _signals(bus: Bus, endpoint: str) -> list[str]:
    """Take every plain signal off ``endpoint``'s queue; their envelope JSON texts."""
    queue = bus.names.queue(endpoint)
    texts = []
    for message in bus.storage.queues.receive(queue, max_messages=32, lease=30):
        texts.append(base64.b64decode(message.body).decode())
        bus.storage.queues.delete(queue, message)
    return texts


@pytest.mark.parametrize("batched", [True, False])
def test_a_bad_part_is_poisoned_alone(storage: Storage, prefix: str, batched: bool) -> None:
    bus = build(storage, prefix, bundles=False)
    bus.send(Split(keys=["a", "b"]))
    drain(bus, ["splitter"])
    texts = _signals(bus, "counter")
    garbage = json.dumps({"bus": 1, "message_type": "Add"})
    bus.storage.queues.send(bus.names.queue("counter"), encode_bundle([texts[0], garbage,
                                                                       texts[1]]))
    drained = drain(bus, ["counter"], batched=batched, fail_fast=False)
    assert drained.total() == {"processed": 2, "poisoned": 1}
    [letter] = bus.poisoned("counter").entries()
    assert "envelope is invalid" in letter.entry.reason
    assert json.loads(base64.b64decode(letter.entry.original_body)) == json.loads(garbage)
    assert [count(bus, k) for k in "ab"] == [1, 1]
    assert waiting(bus, "counter") == []


def test_the_functions_trigger_delivers_every_part(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(Split(keys=["a", "b", "c"], fail_once="c"))
    drain(bus, ["splitter"])
    [message] = waiting(bus, "counter")
    trigger = QueueTrigger(bus, "counter", max_dequeue_count=5, inline_dispatch_max=None)
    raw = base64.b64decode(message.body)
    with pytest.raises(HandlerFailed):  # raised after a and b were processed
        trigger.deliver(raw, 1)
    assert [count(bus, k) for k in "abc"] == [1, 1, 0]
    delivery = trigger.deliver(raw, 2)  # the host's redelivery
    assert delivery.outcome is Outcome.PROCESSED
    assert [p.outcome for p in delivery.parts] == [Outcome.DUPLICATE, Outcome.DUPLICATE,
                                                   Outcome.PROCESSED]
    assert [count(bus, k) for k in "abc"] == [1, 1, 1]


# -- packing -------------------------------------------------------------------------------
def test_pack_keeps_order_and_limits() -> None:
    small = ['{"x":1}'] * (MAX_PARTS + 3)
    assert [len(g) for g in pack(small, AZURE.signal_bytes)] == [MAX_PARTS, 3]
    big = ["y" * (AZURE.signal_bytes // 3)] * 4
    groups = pack(big, AZURE.signal_bytes)
    assert [len(g) for g in groups] == [2, 2]
    assert [i for g in groups for i in g] == [0, 1, 2, 3]
    for group in groups:
        check_message(encode_bundle([big[i] for i in group]), AZURE)  # fits a queue message


def test_a_plain_signal_is_not_a_bundle() -> None:
    assert split_bundle(base64.b64encode(b'{"bus": 1, "bundle": []}').decode()) is None
    assert split_bundle("not base64!") is None
    body = encode_bundle(['{"a": 1}', '{"b": "\u00e9"}'])
    assert [json.loads(base64.b64decode(s)) for s in split_bundle(body) or []] == [
        {"a": 1}, {"b": "\u00e9"}]


def test_scheduled_copies_travel_alone(storage: Storage, prefix: str) -> None:
    plain = build(storage, prefix, bundles=False)
    plain.send(Split(keys=["a", "b", "c"]))
    drain(plain, ["splitter"])
    envelopes = [Envelope.model_validate_json(t) for t in _signals(plain, "counter")]
    later = envelopes[1].model_copy(update={
        "not_before": datetime.now(timezone.utc) + timedelta(hours=1)})
    bus = build(storage, prefix)
    assert bus.parts.courier.signal_many([envelopes[0], later, envelopes[2]]) == [None] * 3
    [visible] = bus.storage.queues.receive(bus.names.queue("counter"), max_messages=32,
                                           lease=30)
    assert len(parts([visible])) == 2  # the scheduled copy went alone, hidden for an hour
