"""What the signature covers, by construction: every envelope field but those ``UNSIGNED``
lists (each with why), a field added later included. These tests walk ``Envelope``'s fields,
so a new field is checked without anyone remembering to add it here - and one this file
cannot change fails, asking to be taught.

End to end: a copy on the queue changed in any one field, without the key, and put before the
real copy, never takes the real copy's place - it is poisoned (its token left alone) or
dropped, and the real copy is processed once."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel

from bus import Bus, Command, Context, Endpoint, Event
from bus.envelope import Envelope, PayloadEncryption, PayloadRef, Signature
from bus.settings import Settings
from bus.signing import FIRST_FORM_NULLS, UNSIGNED, Signing, SigningKey, canonical
from bus.storage import Storage
from bus.testing import drain

FIELDS = tuple(Envelope.model_fields)
SENT = datetime(2026, 11, 28, 10, 0, tzinfo=timezone.utc)


def every_field_set() -> Envelope:
    """An envelope with every field set (the model does not check that they go together)."""
    return Envelope.model_construct(
        bus=1, message_id="m1", attempt_id="a1", kind="command", message_type="Ping",
        source="client", destination="desk", topic="pings", correlation_id="c1",
        causation_id="k1", headers={"tenant": "t1"}, sent_at=SENT,
        content_type="application/json", payload='{"key":"a"}', payload_encoding="utf-8",
        payload_ref=PayloadRef(container="payloads", blob="desk/a1"),
        not_before=SENT + timedelta(seconds=5), expires_at=SENT + timedelta(minutes=5),
        encryption=PayloadEncryption(key_id="e1", nonce="bm9uY2Vub25jZQ=="),
        payload_sha256="0" * 64, signature=Signature(key_id="k1", hmac="x"),
        session="s1", stream="client:client", sequence=3)


def changed(value: object) -> object:
    """Another value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, datetime):
        return value + timedelta(microseconds=1)
    if isinstance(value, dict):
        return {**value, "added": "1"}
    if isinstance(value, BaseModel):
        first = next(iter(type(value).model_fields))
        return value.model_copy(update={first: changed(getattr(value, first))})
    raise AssertionError(f"no change known for {value!r}: teach changed() this kind of value")


def form(envelope: Envelope) -> bytes:
    return canonical(envelope, "f" * 64, "k1")


def test_every_field_but_the_documented_ones_is_in_the_signed_form() -> None:
    assert set(UNSIGNED) <= set(FIELDS), "UNSIGNED names a field the envelope no longer has"
    assert all(why.strip() for why in UNSIGNED.values())
    full = every_field_set()
    assert all(getattr(full, name) is not None for name in FIELDS), "set every field above"
    for name in FIELDS:
        other = full.model_copy(update={name: changed(getattr(full, name))})
        if name in UNSIGNED:
            assert form(other) == form(full), f"{name} is listed unsigned but is signed"
        else:
            assert form(other) != form(full), f"{name} is neither signed nor in UNSIGNED"


def test_a_field_added_since_the_first_form_is_left_out_when_absent() -> None:
    """So that a signature made before the field existed, or by a producer that does not
    know it, still holds; the first form's own optional fields are written null."""
    full = every_field_set()
    for name in FIELDS:
        if name in UNSIGNED or Envelope.model_fields[name].is_required():
            continue
        document = json.loads(form(full.model_copy(update={name: None})))
        if name in FIRST_FORM_NULLS:
            assert document[name] is None
        elif name != "payload_sha256":  # the form's digest is the payload's, always there
            assert name not in document


# -- end to end --------------------------------------------------------------------------------
K1 = bytes([1]) * 32


class Ping(Command):
    key: str
    note: str = ""


class Pinged(Event):
    key: str


SAMPLES: dict[str, Any] = {
    "topic": "pings", "causation_id": "k1", "payload_ref": {"container": "x", "blob": "desk/a"},
    "not_before": "2026-11-28T10:00:00Z", "expires_at": "2999-01-01T00:00:00Z",
    "encryption": {"key_id": "e1", "nonce": "bm9uY2Vub25jZQ=="}, "payload_sha256": "0" * 64,
    "signature": {"key_id": "k1", "hmac": "eA=="}, "session": "s1", "stream": "client:client",
    "sequence": 1, "bus": 2, "payload": '{"key":"b"}',
}
"""A value for each field a plain signed Ping leaves out: putting it in is the change."""


def tampered(document: dict[str, Any], name: str) -> dict[str, Any]:
    if document.get(name) is None:
        assert name in SAMPLES, f"teach SAMPLES a value for the envelope field {name!r}"
        return {**document, name: SAMPLES[name]}
    value = document[name]
    if name == "payload":
        return {**document, name: value.replace('"a"', '"b"')}
    if isinstance(value, dict) and name != "headers":  # a nested model: change its first key
        first = next(iter(value))
        return {**document, name: {**value, first: changed(value[first])}}
    return {**document, name: changed(value)}


def signed_app(storage: Storage, prefix: str) -> tuple[Bus, list[str]]:
    desk, log = Endpoint("desk"), Endpoint("log")
    seen: list[str] = []

    @desk.handles(Ping, partition=lambda m: m.key)
    def ping(message: Ping, ctx: Context) -> None:
        seen.append(f"desk:{message.key}")
        ctx.publish(Pinged(key=message.key))

    @log.handles(Pinged, partition=lambda m: m.key)
    def pinged(message: Pinged, ctx: Context) -> None:
        seen.append(f"log:{message.key}")

    keys = (SigningKey(key_id="k1", secret=K1),)
    bus = Bus(storage, [desk, log], prefix=prefix,
              settings=Settings(signing=Signing(mode="required", keys=keys, key_id="k1")))
    bus.provision()
    return bus, seen


@pytest.mark.parametrize("size", ["inline", "claim check"])
@pytest.mark.parametrize("name", FIELDS)
def test_a_copy_changed_in_any_field_never_takes_the_real_ones_place(
        name: str, size: str, storage: Storage, prefix: str) -> None:
    bus, seen = signed_app(storage, prefix)
    bus.send(Ping(key="a", note="n" * 60_000 if size == "claim check" else ""))
    queue = bus.names.queue("desk")
    [message] = bus.storage.queues.receive(queue, max_messages=1, lease=60)
    bus.storage.queues.delete(queue, message)
    real = json.loads(base64.b64decode(message.body))
    forged = tampered(real, name)
    for document in (forged, real):  # the changed copy first
        bus.storage.queues.send(queue, base64.b64encode(json.dumps(document).encode()).decode())
    outcome = drain(bus, fail_fast=False)["desk"]
    assert seen == ["desk:a", "log:a"], f"a change of {name} took the real copy's place"
    assert outcome.get("processed") == 1
    if name not in UNSIGNED:  # rejected: poisoned, the real copy processed all the same
        assert outcome.get("poisoned") == 1, outcome
