"""Attribute names and values: the OpenTelemetry messaging conventions, and the bus's own.

The conventions (semantic-conventions 1.44, messaging spans and metrics, "Development")
have no well-known ``messaging.system`` for Azure Storage Queues carrying this protocol, so the
bus names itself ``eobus`` and keeps its own attributes under ``eobus.``.
"""

from __future__ import annotations

SYSTEM = "eobus"
"""The value of ``messaging.system`` on every span and metric the bus emits."""

MESSAGING_SYSTEM = "messaging.system"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
CONVERSATION_ID = "messaging.message.conversation_id"
BATCH_COUNT = "messaging.batch.message_count"
ERROR_TYPE = "error.type"

MESSAGE_TYPE = "eobus.message.type"
ATTEMPT_ID = "eobus.attempt.id"
CAUSATION_ID = "eobus.causation.id"
DELIVERY_COUNT = "eobus.delivery.count"
OUTCOME = "eobus.outcome"
SESSION = "eobus.session.id"
TOPIC = "eobus.topic"
SETTLEMENT = "eobus.settlement"
STORAGE_SERVICE = "eobus.storage.service"
STORAGE_OPERATION = "eobus.storage.operation"
QUEUE = "eobus.queue"
ALERT = "eobus.alert.condition"

# Operation types of the conventions (``messaging.operation.type``).
CREATE, SEND, RECEIVE, PROCESS, SETTLE = "create", "send", "receive", "process", "settle"

# Outcomes of a delivery that is not a ``bus.protocol.delivery.Outcome``: the handler raised
# and the signal is redelivered later; storage failed and the outcome is unknown.
RETRY, ERROR = "retry", "error"

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0)
"""The conventions' advice for ``messaging.*.duration`` histograms (seconds)."""
END_TO_END_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                      300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
"""Send to processed: from milliseconds to a day (messages wait out pauses and deferrals)."""


def error_type(exc: BaseException) -> str:
    """``error.type`` for an exception: its fully qualified class name (the conventions'
    advice), ``builtins.`` left out."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"
