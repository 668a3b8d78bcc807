"""How the in-memory backend asks whether (and how) a storage call should misbehave."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Protocol


class Fault(enum.Enum):
    FAIL_BEFORE = "fail_before"  # refused before taking effect
    FAIL_AFTER = "fail_after"  # took effect, but the response was lost
    GHOST = "ghost"  # the caller sees a failure; the request takes effect later
    DUPLICATE = "duplicate"  # a queue send delivers two copies


class FaultHooks(Protocol):
    """Consulted by :class:`~bus.adapters.memory.store.InMemoryStorage` at every call."""

    def now(self) -> float:
        """The clock leases and delays are measured against (seconds)."""

    def before_call(self, service: str, operation: str) -> Fault | None:
        """Called before each storage operation; returns the fault to inject, if any."""

    def defer(self, effect: Callable[[], None]) -> None:
        """Keep a ghost request to apply later (or never)."""

    def page_length(self, limit: int) -> int:
        """How many rows the next page of a query holds: at most ``limit`` (the service's
        page size); fewer, or none with more to follow, as Azure may answer. Optional: hooks
        without it get whole pages."""


class NoFaults:
    """The default: real time, no faults. What users' unit tests get."""

    def now(self) -> float:
        return time.monotonic()

    def before_call(self, service: str, operation: str) -> Fault | None:
        return None

    def defer(self, effect: Callable[[], None]) -> None:  # pragma: no cover - never asked
        effect()

    def page_length(self, limit: int) -> int:
        return limit
