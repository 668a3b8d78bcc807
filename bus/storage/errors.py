"""The storage outcomes the protocol reasons about.

Adapters translate their SDK's errors into these. The distinction that matters for exactly-once
is between a *definite* answer (the request was evaluated and refused: :class:`NotFound`,
:class:`Conflict`, :class:`PreconditionFailed`) and an *unknown* outcome
(:class:`TransientError`: the request may or may not have taken effect, now or later).
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every error a storage port raises."""


class NotFound(StorageError):
    """The queue message, blob or entity does not exist (HTTP 404)."""


class Missing(NotFound):
    """The queue, table or blob container itself does not exist: nothing was provisioned
    there. Not an answer about an item, so the protocol never reads it as "no row yet"."""


class Conflict(StorageError):
    """A create-only write found the item already there (HTTP 409)."""


class PreconditionFailed(StorageError):
    """A conditional write found a different ETag (HTTP 412): someone else changed the item."""


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
