"""bus: an exactly-once service bus on Azure Storage queues, blobs and tables.

The public API::

    from bus import Bus, Command, Context, Endpoint, Event
"""

from bus.bus import Bus, NotProvisioned, SendFailed
from bus.context import Context, PartitionState
from bus.endpoint import ConfigurationError, Endpoint
from bus.envelope import Envelope, PayloadRef
from bus.messages import Command, Event, Message, MessageKindError
from bus.middleware import Middleware, Outgoing
from bus.naming import Names
from bus.protocol.backpressure import QueueFull
from bus.protocol.delivery import HandlerFailed, Outcome
from bus.retry import Abandon, Reject, RetryAfter, RetryPolicy
from bus.serialization import JsonSerializer, Serializer
from bus.settings import Settings

__all__ = [
    "Abandon",
    "Bus",
    "Command",
    "ConfigurationError",
    "Context",
    "Endpoint",
    "Envelope",
    "Event",
    "HandlerFailed",
    "JsonSerializer",
    "Message",
    "MessageKindError",
    "Middleware",
    "Names",
    "NotProvisioned",
    "Outcome",
    "Outgoing",
    "PartitionState",
    "PayloadRef",
    "QueueFull",
    "Reject",
    "RetryAfter",
    "RetryPolicy",
    "SendFailed",
    "Serializer",
    "Settings",
]
