"""bus: an exactly-once service bus on Azure Storage queues, blobs and tables.

The public API::

    from bus import Bus, Command, Context, Endpoint, Event, connect

(``connect``: a bus from a connection string, or from the app's settings as the Functions app
reads them)
and the errors a user may catch, all ``BusError`` (``bus.errors`` has the tree). Internals -
the envelope, outcomes, storage names - live in their modules (``bus.envelope``,
``bus.protocol.delivery``, ``bus.naming``).
"""

from bus.bus import Bus
from bus.connection import connect
from bus.context import Context, PartitionState
from bus.endpoint import Endpoint
from bus.errors import (
    BusError,
    ConfigurationError,
    Contention,
    MessageKindError,
    NamingError,
    NotProvisioned,
    PayloadError,
    QueueFull,
    RecordTooLarge,
    RoutingError,
    SendFailed,
    StateError,
    StorageError,
    TopicError,
    TransientError,
    UnreadableRecord,
    UnreadableVersion,
)
from bus.messages import Command, Event, Message
from bus.middleware import Middleware, Outgoing
from bus.retry import Abandon, Reject, RetryAfter, RetryPolicy
from bus.serialization import JsonSerializer, Serializer
from bus.settings import Settings

__all__ = [
    "Abandon",
    "Bus",
    "BusError",
    "Command",
    "ConfigurationError",
    "Contention",
    "Context",
    "Endpoint",
    "Event",
    "JsonSerializer",
    "Message",
    "MessageKindError",
    "Middleware",
    "NamingError",
    "NotProvisioned",
    "Outgoing",
    "PartitionState",
    "PayloadError",
    "QueueFull",
    "RecordTooLarge",
    "Reject",
    "RetryAfter",
    "RetryPolicy",
    "RoutingError",
    "SendFailed",
    "Serializer",
    "Settings",
    "StateError",
    "StorageError",
    "TopicError",
    "TransientError",
    "UnreadableRecord",
    "UnreadableVersion",
    "connect",
]
