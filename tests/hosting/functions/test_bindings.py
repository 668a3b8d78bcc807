"""What the devhost sends the worker for a queue message: the shapes the host sends
(azure-functions-host GrpcMessageConversionExtensions.ToRpc, the queue extension's binding
data, Utility.ApplyBindingData), decoded by azure-functions' own QueueMessage converter."""

from __future__ import annotations

import datetime as dt

from azure.functions.meta import Datum
from azure.functions.queue import QueueMessageInConverter
from azure.storage.queue import QueueMessage

from bus.hosting.local import bindings
from bus.hosting.local.protos import TypedData


def _message() -> QueueMessage:
    message = QueueMessage(content="ignored")
    message.id, message.pop_receipt, message.dequeue_count = "m-1", "receipt", 3
    message.inserted_on = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.timezone.utc)
    message.expires_on = message.inserted_on + dt.timedelta(days=7)
    message.next_visible_on = message.inserted_on + dt.timedelta(minutes=10)
    return message


def _decode(body: str) -> object:
    value, metadata = bindings.queue_trigger(_message(), body)
    kind = value.WhichOneof("data")
    return QueueMessageInConverter.decode(
        Datum(getattr(value, kind), kind),
        trigger_metadata={k: Datum(getattr(v, v.WhichOneof("data")), v.WhichOneof("data"))
                          for k, v in metadata.items()})


def test_queue_message_reaches_the_function_with_its_metadata() -> None:
    msg = _decode("hello")
    assert msg.get_body() == b"hello"  # type: ignore[attr-defined]
    assert (msg.id, msg.dequeue_count, msg.pop_receipt) == ("m-1", 3, "receipt")  # type: ignore[attr-defined]
    assert msg.insertion_time == dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.timezone.utc)  # type: ignore[attr-defined]


def test_a_json_body_adds_its_properties_and_overrides_the_message_id() -> None:
    """The host merges a JSON object body's top-level properties into the trigger metadata,
    case-insensitively: a body field named "id" replaces the queue message's id."""
    metadata = bindings.apply_body_properties(
        {"Id": TypedData(string="m-1")}, '{"id": "spoofed", "n": 2, "ok": true, '
                                         '"headers": {"a": "b"}, "list": [1], "none": null}')
    assert metadata["Id"] == TypedData(string="spoofed")
    assert metadata["n"] == TypedData(string="2") and metadata["ok"] == TypedData(string="True")
    assert metadata["headers"] == TypedData(json='{"a": "b"}')
    assert "list" not in metadata and "none" not in metadata and "id" not in metadata
    assert _decode('{"Id": "spoofed"}').id == "spoofed"  # type: ignore[attr-defined]
