"""bus: an exactly-once service bus on Azure Storage queues, blobs and tables.

The public API::

    from bus import Bus, Command, Context, Endpoint, Event
"""

from bus.bus import Bus
from bus.context import Context, PartitionState
from bus.endpoint import ConfigurationError, Endpoint
from bus.envelope import Envelope, PayloadRef
from bus.messages import Command, Event, Message
from bus.naming import Names
from bus.protocol.receive import HandlerFailed, Outcome
from bus.retry import Abandon, RetryAfter, RetryPolicy
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
    "Names",
    "Outcome",
    "PartitionState",
    "PayloadRef",
    "RetryAfter",
    "RetryPolicy",
    "Serializer",
    "Settings",
]
