"""What the host sends the worker for each trigger and input binding, as ``TypedData``.

The worker turns these into the function's arguments with azure-functions' own converters
(``QueueMessageInConverter``, ``TimerRequestConverter``, the Durable converters); the local host
only has to send what the host sends. ``docs/functions.md`` names the host source each shape
follows.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from azure.storage.queue import QueueMessage

from bus.hosting.local.protos import TypedData


def queue_trigger(message: QueueMessage, body: str) -> tuple[TypedData, dict[str, TypedData]]:
    """The trigger value and metadata of one queue message.

    The host decodes the base64 body (``messageEncoding``) and sends it as a string; the
    metadata are the queue trigger's binding data: strings as strings, the dequeue count and
    the three times as JSON (the host serialises non-string values with Json.NET).
    """
    metadata: dict[str, TypedData] = {
        "Id": TypedData(string=str(message.id)),
        "PopReceipt": TypedData(string=str(message.pop_receipt)),
        "DequeueCount": TypedData(json=json.dumps(int(message.dequeue_count or 1))),
        "InsertionTime": _time(message.inserted_on),
        "ExpirationTime": _time(message.expires_on),
        "NextVisibleTime": _time(message.next_visible_on),
        "QueueTrigger": TypedData(string=body),
    }
    return TypedData(string=body), apply_body_properties(metadata, body)


def apply_body_properties(metadata: dict[str, TypedData], body: str) -> dict[str, TypedData]:
    """What the host adds for a trigger value that is a JSON object (Utility.ApplyBindingData):
    each top-level property that is not an array, an object as JSON and a scalar as its string,
    overwriting metadata of the same name in any case - a body with an ``"Id"`` or
    ``"DequeueCount"`` field changes what the function sees as the message's id or count."""
    try:
        value = json.loads(body) if body.lstrip().startswith("{") else None
    except ValueError:
        return metadata
    if not isinstance(value, dict):
        return metadata
    merged = dict(metadata)
    existing = {key.lower(): key for key in merged}
    for name, item in value.items():
        if item is None or isinstance(item, list):
            continue
        data = (TypedData(json=json.dumps(item)) if isinstance(item, dict)
                else TypedData(string=_scalar(item)))
        key = existing.setdefault(name.lower(), name)
        merged[key] = data
    return merged


def _scalar(item: object) -> str:
    """A JSON scalar as Json.NET's ``(string)`` cast renders it."""
    if isinstance(item, bool):
        return "True" if item else "False"
    return str(item)


def durable_client(binding_json: str) -> TypedData:
    """The ``durableClient`` input: the extension's client data (task hub, webhook URLs)."""
    return TypedData(string=binding_json)


def orchestration_trigger(context: dict[str, Any]) -> TypedData:
    """The ``orchestrationTrigger`` input: history, instance id, input (the extension's
    out-of-process orchestration request, as a JSON string)."""
    return TypedData(string=json.dumps(context))


def activity_trigger(input_json: str | None) -> TypedData:
    """The ``activityTrigger`` input: the orchestrator's input for the activity, JSON."""
    return TypedData(string=input_json if input_json is not None else "null")


def timer_trigger(*, past_due: bool) -> TypedData:
    """The ``timerTrigger`` input: TimerInfo serialised by the host."""
    return TypedData(json=json.dumps({"Schedule": {"AdjustForDST": True},
                                      "ScheduleStatus": None, "IsPastDue": past_due}))


def returned_json(value: TypedData | None) -> str:
    """A function's return value (orchestrator state, activity result) as JSON text."""
    if value is None:
        return "null"
    kind = value.WhichOneof("data")
    if kind in ("json", "string"):
        return str(getattr(value, kind))
    if kind is None:
        return "null"
    raise TypeError(f"unexpected return value of kind {kind!r}")


def _time(moment: dt.datetime | None) -> TypedData:
    if moment is None:
        return TypedData(json="null")
    return TypedData(json=json.dumps(moment.astimezone(dt.timezone.utc).isoformat()))
