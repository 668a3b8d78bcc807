"""Storage ports: the three small interfaces the exactly-once protocol is written against.

The protocol never imports an Azure SDK. It talks to :class:`Queues`, :class:`Blobs` and
:class:`Tables`; the Azure adapter (``bus.adapters.azure``) and the in-memory adapter
(``bus.adapters.memory``, re-exported by ``bus.testing``) implement them and pass one shared
contract test suite (``bus.testing.contract``).
"""

from bus.storage.errors import (
    Conflict,
    Missing,
    NotFound,
    PreconditionFailed,
    Refused,
    StorageError,
    Throttled,
    TooLarge,
    TransientError,
)
from bus.storage.ports import (
    Blob,
    Blobs,
    Entity,
    EntityValue,
    QueueMessage,
    Queues,
    Storage,
    TableOp,
    Tables,
)

__all__ = [
    "Blob",
    "Blobs",
    "Conflict",
    "Entity",
    "EntityValue",
    "Missing",
    "NotFound",
    "PreconditionFailed",
    "QueueMessage",
    "Queues",
    "Refused",
    "Storage",
    "StorageError",
    "TableOp",
    "Tables",
    "Throttled",
    "TooLarge",
    "TransientError",
]
