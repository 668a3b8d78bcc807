"""Whatever bytes a queue holds, the bus ends with the message processed, dropped as a copy of
a consumed one, or poisoned with a reason - and no host loop or poison-queue tool raises. Hostile
and malformed input generated with hypothesis: arbitrary bytes, and valid envelopes and bundles
with one field replaced by something hostile (deep nesting, integers of thousands of digits,
lone surrogates, bad base64, oversized strings, references to blobs of others, bundles of
thousands of parts), also with signatures required (signed envelopes with a field replaced,
unsigned ones, bytes). In-memory backend, through the polling worker and the Functions
trigger."""

from __future__ import annotations

import base64
import json
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bus import Bus, Command, Context, Endpoint, RetryAfter, RetryPolicy
from bus.envelope import BadSignal, parse_envelope
from bus.errors import PayloadError
from bus.hosting.functions.trigger import QueueTrigger
from bus.protocol.delivery import Outcome
from bus.settings import Settings
from bus.signing import Signing, SigningKey
from bus.storage import NotFound
from bus.testing import InMemoryStorage, drain


class Note(Command):
    """Known before as ``Jotting`` (its key was ``k``): copies sent under that name are upcast,
    so hostile payloads under the alias go through the contract's own code."""

    aliases: ClassVar[tuple[str, ...]] = ("Jotting",)
    key: str

    @classmethod
    def upcast(cls, data: dict[str, Any], sent_as: str) -> dict[str, Any]:
        if sent_as == "Jotting":
            data["key"] = data.pop("k")
        return data


SIGNING = Settings(signing=Signing(mode="required", key_id="k1",
                                   keys=(SigningKey(key_id="k1", secret=b"k" * 32),)))


def build(settings: Settings | None = None, *,
          wait: float | None = None) -> tuple[Bus, list[str]]:
    """The desk; ``wait``: its handler asks for another delivery that much later, every time
    (``RetryAfter``)."""
    desk = Endpoint("desk", retry=RetryPolicy(delays=(0.0,)))
    seen: list[str] = []

    @desk.handles(Note, partition=lambda m: m.key)
    def note(message: Note, ctx: Context) -> None:
        if wait is not None:
            raise RetryAfter(wait)
        seen.append(message.key)
        ctx.state.put("n", {"n": len(seen)})

    bus = Bus(InMemoryStorage(), [desk], prefix="h", settings=settings)
    bus.provision()
    return bus, seen


def valid_fields(bus: Bus) -> dict[str, str]:
    """A valid envelope as JSON texts per field (its token is created by ``with_token``)."""
    ref = bus.parts.payloads.ref("desk", "a1")
    return {
        "bus": "1", "message_id": '"m1"', "attempt_id": '"a1"', "kind": '"command"',
        "message_type": '"Note"', "source": '"client"', "destination": '"desk"',
        "correlation_id": '"m1"', "sent_at": '"2026-11-24T00:00:00Z"',
        "payload": json.dumps('{"key": "k"}'), "headers": '{"h": "v"}',
        "_ref": json.dumps(ref.model_dump()),
    }


HOSTILE_TIMES = [
    '"0001-01-01T00:00:00"', '"0001-01-01T00:30:00+01:00"',  # before year 1 once in UTC
    '"9999-12-31T23:59:59"', '"9999-12-31T23:30:00-01:00"',  # after year 9999 once in UTC
]
HOSTILE_VALUES = [
    "[" * 5_000 + "]" * 5_000,  # nesting beyond the recursion limit
    "1" + "0" * 5_000,  # an integer beyond Python's 4,300-digit limit
    '"\\ud800"', '"a\\udfff"',  # lone surrogates
    json.dumps("x" * 40_000),  # longer than any field takes
    '"QUJD="', '"=="',  # bad base64
    "null", "true", "3.5e308", "-1", '""', '{"a": [1, {"b": null}]}', "[]",
    '{"container": "other", "blob": "orders.json"}',  # someone else's blob
    '{"container": "h-bus-topics", "blob": "t.json"}',  # a topic file
    *HOSTILE_TIMES,
]
HOSTILE = st.sampled_from(HOSTILE_VALUES) | st.text(max_size=50).map(json.dumps)


def document(fields: dict[str, str]) -> bytes:
    return ("{" + ",".join(f'"{k}":{v}' for k, v in fields.items() if not k.startswith("_"))
            + "}").encode("utf-8")


@st.composite
def mutated_envelopes(draw: st.DrawFn) -> tuple[str, str | None]:
    """(field, JSON text) replacing one field of a valid envelope, or adding one."""
    field = draw(st.sampled_from([
        "bus", "message_id", "attempt_id", "kind", "message_type", "source", "destination",
        "correlation_id", "causation_id", "topic", "sent_at", "not_before", "expires_at",
        "session", "stream", "sequence", "payload",
        "payload_encoding", "payload_ref", "headers", "content_type", "deliveries", "bundle",
        "alias"]))
    if field == "headers":
        return field, draw(st.sampled_from([
            json.dumps({f"h{i}": "v" for i in range(100)}),
            json.dumps({"h": "v" * 5_000}), json.dumps({"h" * 500: "v"}), '{"h": 1}']))
    if field == "payload_encoding":
        return field, '"base64"'  # with the payload as it is: not base64
    if field == "alias":  # sent as the old name: the upcast meets the hostile value
        return field, draw(st.sampled_from(['{"k": %s}', '{"key": %s}', "%s"])) % draw(HOSTILE)
    return field, draw(HOSTILE)


def hostile_body(bus: Bus, mutation: tuple[str, str | None]) -> bytes:
    return document(mutated(valid_fields(bus), mutation))


def mutated(fields: dict[str, str], mutation: tuple[str, str | None]) -> dict[str, str]:
    """``fields`` with ``mutation`` applied (``mutated_envelopes``)."""
    field, value = mutation
    if field == "alias" and value is not None:
        fields["message_type"] = '"Jotting"'
        field, value = "payload", json.dumps(value)
    if field == "payload_ref" and value is not None and value.startswith("{"):
        fields.pop("payload")
    if value is not None:
        fields[field] = value
    return fields


def bundle_body(parts: int, part: bytes) -> bytes:
    return b'{"bus":1,"bundle":[' + b",".join([part] * parts) + b"]}"


@st.composite
def hostile_raw(draw: st.DrawFn) -> bytes:
    bus, _ = build()
    kind = draw(st.sampled_from(["bytes", "envelope", "bundle"]))
    if kind == "bytes":
        return draw(st.binary(max_size=3_000))
    if kind == "envelope":
        return hostile_body(bus, draw(mutated_envelopes()))
    part = draw(st.sampled_from([document(valid_fields(bus)), b"1", b'"x"', b"{}",
                                 hostile_body(bus, draw(mutated_envelopes()))]))
    return bundle_body(draw(st.sampled_from([1, 2, 33, 16_000 // max(1, len(part))])), part)


def signed_fields(bus: Bus) -> dict[str, str]:
    """``valid_fields``, signed by ``bus``'s key (as JSON texts per field)."""
    envelope = bus.parts.sealer.resign(parse_envelope(document(valid_fields(bus))))
    return {k: json.dumps(v) for k, v in json.loads(envelope.to_json()).items()}


@st.composite
def hostile_signed_raw(draw: st.DrawFn) -> bytes:
    """A signed envelope with one field replaced (or none), an unsigned one, or bytes."""
    bus, _ = build(SIGNING)
    kind = draw(st.sampled_from(["signed", "mutated", "unsigned", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=3_000))
    fields = signed_fields(bus) if kind != "unsigned" else valid_fields(bus)
    if kind == "mutated":
        fields = mutated(fields, draw(mutated_envelopes() | st.tuples(
            st.sampled_from(["signature", "payload_sha256"]), HOSTILE)))
    return document(fields)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=hostile_signed_raw())
def test_with_signatures_required_anything_is_processed_once_signed_or_poisoned(
        raw: bytes) -> None:
    assume(fits(raw))
    for host in ("worker", "trigger"):
        bus, seen = build(SIGNING)
        with_token(bus)
        if host == "worker":
            bus.storage.queues.send(bus.names.queue("desk"), base64.b64encode(raw).decode())
            outcomes = set(drain(bus, fail_fast=False).total())
        else:
            delivery = QueueTrigger(bus, "desk", max_dequeue_count=5, inline_dispatch_max=None,
                                    in_process_tries=1).deliver(raw, 1)
            outcomes = {part.outcome.value for part in delivery.parts or [delivery]}
        assert outcomes <= ENDS | {"scheduled"}, outcomes
        letters = bus.poisoned("desk").entries()
        assert all(letter.entry.reason for letter in letters)
        if seen:  # a handler ran only for the signed message, each field as it was signed
            # (what the signature does not cover: the transport's deliveries, unknown fields)
            assert seen == ["k"]
            assert parse_envelope(raw) == parse_envelope(document(signed_fields(bus)))


def fits(raw: bytes) -> bool:
    """Whether a queue can hold it (base64): nothing else can arrive."""
    return len(base64.b64encode(raw)) <= 65_536


def with_token(bus: Bus) -> None:
    bus.parts.inbox.create("desk", "a1", "m1", bus.parts.clock())


ENDS = {Outcome.PROCESSED.value, Outcome.DUPLICATE.value, Outcome.POISONED.value,
        Outcome.EXPIRED.value, Outcome.ALREADY_POISONED.value, "fenced", "deferred"}
POISON_ENDS = (Outcome.POISONED, Outcome.EXPIRED)  # each leaves a poison entry


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=hostile_raw())
def test_the_envelope_decoder_only_ever_says_why(raw: bytes) -> None:
    try:
        parse_envelope(raw)
    except BadSignal as exc:
        assert str(exc)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=hostile_raw())
def test_the_polling_worker_processes_or_poisons_anything(raw: bytes) -> None:
    assume(fits(raw))
    bus, _ = build()
    with_token(bus)
    bus.storage.queues.send(bus.names.queue("desk"), base64.b64encode(raw).decode())
    drained = drain(bus, fail_fast=False)
    # A well-formed copy scheduled far ahead (not_before in the year 9999) is neither
    # processed nor poisoned: it waits on the queue, invisible, its token live, and is put
    # back each time it comes up early. Nothing else may be left.
    scheduled = drained.total().get(Outcome.SCHEDULED.value, 0)
    assert set(drained.total()) <= ENDS | {Outcome.SCHEDULED.value}, drained.total()
    assert bus.storage.queues.depth(bus.names.queue("desk")) == scheduled
    if scheduled:
        assert bus.parts.inbox.read("desk", "a1") is not None
    letters = bus.poisoned("desk").entries()
    assert len(letters) >= sum(drained.total().get(end.value, 0) for end in POISON_ENDS)
    assert all(letter.entry.reason for letter in letters)
    bus.poisoned("desk").replay()  # the tools never fail on an entry
    assert bus.storage.blobs.list(bus.names.topic_container) == []


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=hostile_raw())
def test_the_functions_trigger_processes_or_poisons_anything(raw: bytes) -> None:
    assume(fits(raw))
    bus, _ = build()
    with_token(bus)
    trigger = QueueTrigger(bus, "desk", max_dequeue_count=5, inline_dispatch_max=None,
                           in_process_tries=1)
    delivery = trigger.deliver(raw, 1)  # returns: the host deletes the message
    outcomes = [part.outcome for part in delivery.parts] or [delivery.outcome]
    assert {o.value for o in outcomes} <= ENDS | {"scheduled"}
    letters = bus.poisoned("desk").entries()
    assert len(letters) >= sum(o in POISON_ENDS for o in outcomes)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=hostile_raw())
def test_the_functions_trigger_postpones_a_retry_on_the_lease_it_was_given_or_poisons(
        raw: bytes) -> None:
    """With the host's lease (the trigger's metadata) and a handler that asks to wait: what
    it cannot process is poisoned as ever, and what it can is postponed - the leased message
    itself made visible later, nothing copied."""
    assume(fits(raw))
    bus, _ = build(wait=30.0)
    with_token(bus)
    queue = bus.names.queue("desk")
    bus.storage.queues.send(queue, base64.b64encode(raw).decode())
    [leased] = bus.storage.queues.receive(queue, max_messages=1, lease=60)
    trigger = QueueTrigger(bus, "desk", max_dequeue_count=5, inline_dispatch_max=None,
                           in_process_tries=1)
    delivery = trigger.deliver(raw, 1, lease=leased)
    outcomes = {part.outcome for part in delivery.parts} or {delivery.outcome}
    assert {o.value for o in outcomes} <= ENDS | {"scheduled", "postponed"}
    assert bus.storage.queues.depth(queue) <= 1 + (Outcome.SCHEDULED in outcomes)
    if Outcome.POSTPONED in outcomes:  # the message waits, on a new pop receipt
        with pytest.raises(NotFound):
            bus.storage.queues.delete(queue, leased)


@pytest.mark.parametrize("value", HOSTILE_TIMES)
@pytest.mark.parametrize("field", ["sent_at", "not_before", "expires_at"])
def test_a_time_at_the_ends_of_the_calendar_is_processed_or_poisoned(field: str,
                                                                    value: str) -> None:
    """A time whose UTC form is outside years 1-9999 has no timestamp: reading it raised out
    of the worker's poll (a time without a zone was taken as local time)."""
    bus, _ = build()
    with_token(bus)
    raw = hostile_body(bus, (field, value))
    bus.storage.queues.send(bus.names.queue("desk"), base64.b64encode(raw).decode())
    assert set(drain(bus, fail_fast=False).total()) <= ENDS | {"scheduled"}
    trigger = QueueTrigger(bus, "desk", max_dequeue_count=5, inline_dispatch_max=None,
                           in_process_tries=1)
    delivery = trigger.deliver(raw, 1)
    assert {p.outcome.value for p in delivery.parts} | {delivery.outcome.value} <= ENDS | {
        "scheduled"}


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_a_hostile_delivery_count_is_poisoned_or_ignored_on_every_host(value: str) -> None:
    """The carried delivery count is read before the envelope is decoded (found by the
    property test above on Python 3.10: nesting deep enough for a RecursionError there)."""
    bus, _ = build()
    with_token(bus)
    raw = hostile_body(bus, ("deliveries", value))
    bus.storage.queues.send(bus.names.queue("desk"), base64.b64encode(raw).decode())
    assert set(drain(bus, fail_fast=False).total()) <= ENDS
    trigger = QueueTrigger(bus, "desk", max_dequeue_count=5, inline_dispatch_max=None,
                           in_process_tries=1)
    delivery = trigger.deliver(raw, 1)
    assert {p.outcome.value for p in delivery.parts} | {delivery.outcome.value} <= ENDS


def test_a_claim_check_over_the_limit_is_poisoned_unread() -> None:
    """A payload blob larger than ``max_payload_bytes`` is not read whole: the copy is
    poisoned with the reason (before, a blob of any size was read into memory and handled)."""
    bus, seen = build(Settings(max_payload_bytes=1_000))
    with_token(bus)
    ref = bus.parts.payloads.ref("desk", "a1")
    bus.parts.payloads.blobs.write(ref.container, ref.blob, b'{"key": "k"}' + b" " * 5_000)
    fields = {**valid_fields(bus), "payload_ref": json.dumps(ref.model_dump())}
    fields.pop("payload")
    bus.storage.queues.send(bus.names.queue("desk"),
                            base64.b64encode(document(fields)).decode())
    assert drain(bus, fail_fast=False).total() == {Outcome.POISONED.value: 1} and seen == []
    [letter] = bus.poisoned("desk").entries()
    assert "holds more than 1000 bytes" in letter.entry.reason
    with pytest.raises(PayloadError, match="over the limit of 1000"):
        bus.send(Note(key="k" * 70_000), to="desk")


def test_a_bundle_part_is_poisoned_with_its_exact_bytes() -> None:
    """A part's poison entry keeps the part as it was sent: duplicate keys and numbers as
    written (before, the part was re-serialised from its parsed form)."""
    bus, _ = build()
    part = (b'{"bus":1,"message_id":"m2","message_id":"m2","attempt_id":"a2","kind":"command",'
            b'"message_type":"Nope","source":"client","destination":"desk",'
            b'"correlation_id":"m2","sent_at":"2026-11-24T00:00:00Z","payload":"{}",'
            b'"x": 1.50000000000000000001, "y":1e400}')
    good = document(valid_fields(bus))
    with_token(bus)
    bus.storage.queues.send(bus.names.queue("desk"), base64.b64encode(
        b'{"bus":1,"bundle":[' + good + b" , " + part + b"]}").decode())
    drain(bus, fail_fast=False)
    [letter] = bus.poisoned("desk").entries()
    assert base64.b64decode(letter.entry.original_body) == part


@pytest.mark.parametrize("blob", ["orders.json", "desk/someone-else"])
def test_a_reference_to_another_blob_is_poisoned_and_never_touched(blob: str) -> None:
    bus, seen = build()
    with_token(bus)
    container = bus.names.topic_container if blob.endswith(".json") else \
        bus.names.payload_container
    bus.storage.blobs.write(container, blob, b'{"key": "k"}')
    fields = valid_fields(bus)
    fields.pop("payload")
    fields["payload_ref"] = json.dumps({"container": container, "blob": blob})
    bus.storage.queues.send(bus.names.queue("desk"),
                            base64.b64encode(document(fields)).decode())
    drained = drain(bus, fail_fast=False)
    assert drained.total() == {Outcome.POISONED.value: 1} and seen == []
    [letter] = bus.poisoned("desk").entries()
    assert letter.entry.reason.startswith(f"payload reference {container}/{blob} is not this "
                                          "message's claim check")
    assert bus.poisoned("desk").purge() == [letter.id]
    assert bus.storage.blobs.read(container, blob).data == b'{"key": "k"}'  # still there


def test_a_long_correlation_id_is_poisoned_before_it_blocks_anything() -> None:
    """Copied into every message the handler sends, it would make them too large to send
    after the commit; it is refused on receipt instead."""
    bus, seen = build()
    with_token(bus)
    fields = valid_fields(bus)
    fields["correlation_id"] = json.dumps("c" * 30_000)
    bus.storage.queues.send(bus.names.queue("desk"),
                            base64.b64encode(document(fields)).decode())
    assert drain(bus, fail_fast=False).total() == {Outcome.POISONED.value: 1} and seen == []
    [letter] = bus.poisoned("desk").entries()
    assert "correlation_id" in letter.entry.reason


def test_a_bundle_of_thousands_of_parts_is_one_poison_entry() -> None:
    bus, _ = build()
    bus.storage.queues.send(bus.names.queue("desk"),
                            base64.b64encode(bundle_body(10_000, b"{}")).decode())
    assert drain(bus, fail_fast=False).total() == {Outcome.POISONED.value: 1}
    [letter] = bus.poisoned("desk").entries()
    assert letter.entry.reason.startswith("a bundle this bus does not take apart")


def test_replay_refuses_an_entry_whose_body_is_another_message() -> None:
    """A forged entry pairing this message's envelope (its token is revived by a replay)
    with another message's body: refused, kept for purging."""
    bus, seen = build()
    first = bus.send(Note(key="a"))
    drain(bus)
    other = valid_fields(bus)
    body = base64.b64encode(document(other)).decode()
    poison = bus.parts.poison_queue("desk")
    bus.parts.inbox.create("desk", "a2", "m2", bus.parts.clock())
    envelope = parse_envelope(document({**other, "message_id": '"m2"', "attempt_id": '"a2"'}))
    poison.put(body, reason="forged", dequeue_count=1, now=bus.parts.clock(), envelope=envelope)
    results = bus.poisoned("desk").replay()
    assert list(results.values()) == ["mismatched"]
    assert seen == ["a"] and first


def test_a_topic_file_naming_no_endpoint_is_refused_with_the_reason() -> None:
    from bus import Event, TopicError

    class Happened(Event):
        key: str

    bus, _ = build()
    bus.storage.blobs.write(bus.names.topic_container, "Happened.json",
                            b'{"subscribers": ["desk", "../../etc"]}')
    with pytest.raises(TopicError, match=r"'\.\./\.\./etc' is not an endpoint name"):
        bus.publish(Happened(key="k"))


def test_the_poison_queue_tools_survive_a_hostile_poison_queue() -> None:
    bus, _ = build()
    poison = bus.names.poison_queue("desk")
    for raw in (b"[" * 5_000 + b"]" * 5_000, b'{"v": 1, "reason": ' + b"1" * 5_000 + b"}"):
        bus.storage.queues.send(poison, base64.b64encode(raw).decode())
    bus.storage.queues.send(poison, "not base64!")
    dead = bus.poisoned("desk")
    letters = dead.entries()
    assert len(letters) == 3 and all(letter.entry.reason for letter in letters)
    assert set(dead.replay().values()) == {"not a message"}
    assert sorted(dead.purge({letters[0].id})) == [letters[0].id]
    assert len(dead.purge()) == 2 and dead.entries() == []


def test_a_delivery_count_of_thousands_of_digits_is_poisoned_not_raised() -> None:
    """Found by the property test: reading ``deliveries`` met Python's 4,300-digit limit
    outside the decoder, and the polling worker's settlement raised."""
    bus, seen = build()
    with_token(bus)
    fields = {**valid_fields(bus), "deliveries": "1" + "0" * 5_000}
    bus.storage.queues.send(bus.names.queue("desk"),
                            base64.b64encode(document(fields)).decode())
    assert drain(bus, fail_fast=False).total() == {Outcome.POISONED.value: 1} and seen == []
