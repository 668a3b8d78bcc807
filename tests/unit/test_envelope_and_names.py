from __future__ import annotations

import base64
from datetime import datetime, timezone

import pytest

from bus.envelope import BadSignal, Envelope, decode_signal, encode_signal
from bus.errors import NamingError
from bus.ids import derived_message_id
from bus.naming import Names


def envelope(**changes: object) -> Envelope:
    fields: dict[str, object] = dict(
        message_id="m1", attempt_id="a1", kind="command", message_type="PlaceOrder",
        source="client", destination="orders", correlation_id="m1",
        sent_at=datetime(2026, 11, 22, tzinfo=timezone.utc), payload='{"order_id": "o"}')
    fields.update(changes)
    return Envelope.model_validate(fields)


def test_signal_round_trip_is_base64_json() -> None:
    body = encode_signal(envelope())
    assert base64.b64decode(body).startswith(b'{"bus":1,"message_id":"m1"')
    assert decode_signal(body) == envelope()


@pytest.mark.parametrize(("body", "reason"), [
    ("%%%", "not valid base64"),
    (base64.b64encode(b"\xff\xfe").decode(), "not UTF-8 JSON"),
    (base64.b64encode(b'{"bus": 1}').decode(), "envelope is invalid: message_id: Field required"),
])
def test_bad_bodies_say_what_is_wrong(body: str, reason: str) -> None:
    with pytest.raises(BadSignal, match=reason):
        decode_signal(body)


def test_envelope_needs_exactly_one_payload() -> None:
    with pytest.raises(ValueError, match="exactly one of payload and payload_ref"):
        envelope(payload=None)


def test_derived_ids_are_deterministic_and_distinct() -> None:
    assert derived_message_id("m1", 0) == derived_message_id("m1", 0)
    assert derived_message_id("m1", 0) != derived_message_id("m1", 1)


@pytest.mark.parametrize("endpoint", ["orders", "Billing.Service_v2", "x", "e" * 63])
def test_queue_names_are_valid(endpoint: str) -> None:
    for names in (Names(), Names("t0123456789abcde")):
        queue, poison = names.queue(endpoint), names.poison_queue(endpoint)
        for name in (queue, poison):
            assert 3 <= len(name) <= 63
            assert name == name.lower() and "--" not in name
        assert poison == queue + "-poison"


def test_bad_names_fail_with_advice() -> None:
    with pytest.raises(NamingError, match="endpoint name"):
        Names().queue("has space")
    with pytest.raises(NamingError, match="prefix"):
        Names("Upper")
