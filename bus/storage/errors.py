"""The storage outcomes the protocol reasons about (defined in ``bus.errors``).

Adapters translate their SDK's errors into these. The distinction that matters for exactly-once
is between a *definite* answer (the request was evaluated and refused: :class:`NotFound`,
:class:`Conflict`, :class:`PreconditionFailed`) and an *unknown* outcome
(:class:`TransientError`: the request may or may not have taken effect, now or later).
"""

from __future__ import annotations

from bus.errors import (
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

__all__ = ["Conflict", "Missing", "NotFound", "PreconditionFailed", "Refused",
           "StorageError", "Throttled", "TooLarge", "TransientError"]
