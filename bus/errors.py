"""Every error the bus raises that a user may catch, under one base: ``BusError``.

::

    BusError
    ├── ConfigurationError   the bus is set up wrongly (raised at start-up); also a ValueError
    ├── NamingError          an endpoint, topic or prefix name storage cannot hold; ValueError
    ├── MessageKindError     an event sent or a command published; also a TypeError
    ├── RoutingError         no destination for a command, or an unknown one; LookupError
    ├── AmbiguousSession     a session key with a row in several partitions; LookupError
    ├── StateError           a state key or row ``ctx.state`` cannot store; ValueError
    ├── RecordTooLarge       one handler call sends more than an outbox record holds; ValueError
    ├── UnreadableRecord     an outbox slot holds a record this bus cannot read; ValueError
    ├── UnreadableVersion    a document of a version this bus does not read; ValueError
    ├── PayloadError         a payload that does not validate against its contract; ValueError
    ├── TopicError           a topic's recipient list that cannot be read; ValueError
    ├── SendFailed           some sends of ``Bus.send_many`` failed (``sent``, ``errors``)
    └── StorageError         a storage call failed (adapters map their SDK's errors to these)
        ├── NotFound         the item does not exist (HTTP 404)
        │   └── Missing      the queue, table or container itself does not exist
        │       └── NotProvisioned  a send before the bus's storage was provisioned
        ├── Conflict         a create found the item there (409)
        ├── PreconditionFailed  a conditional write found another ETag (412)
        ├── Refused          the service refused the request as invalid (400): nothing written
        │   └── TooLarge     an item over one of the service's size limits (413, or 400)
        ├── TransientError   the outcome is unknown: safe to retry, the protocol reads back
        │   └── Throttled    the service is busy (``retry_after``)
        ├── QueueFull        a destination's queue is at its configured depth: try later
        └── Contention       a row kept changing under a step that is safe to run again

The Spark integration's own errors (``OptionError``, ``RowError``) derive
from ``BusError`` as well. What a handler raises to steer retries (``RetryAfter``, ``Reject``,
``Abandon``: ``bus.retry``) are requests, not errors, and stay apart.

Why ``QueueFull`` and ``Contention`` are storage errors: every caller treats them as it treats
a storage call that must be tried again later - the signal is released, the step re-run -
and nothing is lost meanwhile.
"""

from __future__ import annotations


class BusError(Exception):
    """Base class of every error the bus raises that a user may catch."""


class ConfigurationError(BusError, ValueError):
    """The bus is set up wrongly; the message says what to fix. Raised at start-up."""


class NamingError(BusError, ValueError):
    """A name (endpoint, topic, prefix) that storage naming rules do not allow."""


class MessageKindError(BusError, TypeError):
    """A command was published or an event sent; the message says which call to use."""


class RoutingError(BusError, LookupError):
    """No destination for a command, or one the bus does not know (declare it with
    ``routes=``)."""


class AmbiguousSession(BusError, LookupError):
    """An operator named a session whose key has a row in several partitions (its session
    function and partition function disagree): name the partition too."""


class StateError(BusError, ValueError):
    """A state key or row ``ctx.state`` cannot store, or a partition key that is not valid."""


class RecordTooLarge(BusError, ValueError):
    """A handler produced more outgoing data than one outbox record can hold."""


class UnreadableRecord(BusError, ValueError):
    """An outbox slot holds a record this bus cannot read (a newer version, or damaged):
    nothing may be committed over it, since it may still have messages to send. The message
    says which partition and why; the partition's messages are poisoned with it meanwhile."""


class UnreadableVersion(BusError, ValueError):
    """A document of a version this bus does not read; the message says which and why."""


class PayloadError(BusError, ValueError):
    """The payload could not be turned into the declared message contract."""


class TopicError(BusError, ValueError):
    """A topic's recipient list that cannot be read or changed as asked."""


class SendFailed(BusError):
    """Some sends of ``Bus.send_many`` failed: ``errors`` by position; ``sent`` holds the
    message ids of the others (they were sent)."""

    def __init__(self, sent: dict[int, str], errors: dict[int, Exception]) -> None:
        first = min(errors)
        super().__init__(f"{len(errors)} of {len(sent) + len(errors)} sends failed; the first "
                         f"(message {first}): {errors[first]!r}")
        self.sent = sent
        self.errors = errors


# -- storage ----------------------------------------------------------------------------------
# The distinction that matters for exactly-once is between a *definite* answer (the request
# was evaluated and refused: NotFound, Conflict, PreconditionFailed) and an *unknown* outcome
# (TransientError: the request may or may not have taken effect, now or later).

class StorageError(BusError):
    """Base class of every error a storage port raises."""


class NotFound(StorageError):
    """The queue message, blob or entity does not exist (HTTP 404)."""


class Missing(NotFound):
    """The queue, table or blob container itself does not exist: nothing was provisioned
    there. Not an answer about an item, so the protocol never reads it as "no row yet"."""


class NotProvisioned(Missing):
    """A send met a missing queue, table or container: the bus's storage is not provisioned."""


class Conflict(StorageError):
    """A create-only write found the item already there (HTTP 409)."""


class PreconditionFailed(StorageError):
    """A conditional write found a different ETag (HTTP 412): someone else changed the item."""


class Refused(StorageError):
    """The service refused the request as invalid (HTTP 400): a key with a forbidden
    character, a value out of range, too many properties. A definite answer: nothing was
    written, and the same request will be refused again."""


class TooLarge(Refused):
    """An item over one of the service's size limits (HTTP 413, or a 400 naming the size):
    a queue message, a property, an entity or a transaction. Nothing was written. The limits
    are declared by the adapter (``bus.storage.limits``), so the protocol checks before it
    writes; this is the service's own refusal, for what a check could not foresee."""


class TransientError(StorageError):
    """The outcome is unknown: the request failed, timed out, or its response was lost.

    It may have taken effect, may take effect later (a delayed "ghost" request), or never.
    The protocol must read back before it assumes either.
    """


class Throttled(TransientError):
    """The service is busy (HTTP 503/500 server busy); ``retry_after`` seconds if it said so."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(StorageError):
    """The destination's queue is at its maximum depth; try again later (nothing was lost)."""

    def __init__(self, destination: str, depth: int, limit: int) -> None:
        super().__init__(
            f"the queue of endpoint {destination!r} is full ({depth} messages, limit "
            f"{limit}); the message stays in the sender's outbox and goes out when there "
            "is room")
        self.destination = destination
        self.depth = depth
        self.limit = limit


class Contention(StorageError):
    """A row (an outbox slot, a token, a ledger row) kept changing under a step: another
    worker is busy with the same message. The step is safe to run again; a signal being
    processed is released and redelivered."""
