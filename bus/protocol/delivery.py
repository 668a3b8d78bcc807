"""What the receiver is given and what it answers: one signal in, one delivery out.

Shared by the receiving stages (``admission``, ``handling``, ``poisoning``, ``receive``)
and the hosts' settlement (``bus.hosting.settlement``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bus.protocol.records import RecordKey
from bus.protocol.tokens.verdict import Verdict


class Outcome(str, enum.Enum):
    """Where one signal ended (a delivery's result that needs no redelivery)."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    POISONED = "poisoned"
    ALREADY_POISONED = "already_poisoned"  # its message waits in the poison queue: dropped
    REQUEUED = "requeued"  # hosting only: put back on the queue as a copy (with its count)
    POSTPONED = "postponed"  # hosting only: the handler failed; visible again after its delay
    SCHEDULED = "scheduled"  # arrived before its time: put back with the remaining delay
    DEFERRED = "deferred"  # the handler set it aside (Context.defer)
    EXPIRED = "expired"  # its time-to-live ended before it was handled: poisoned, acknowledged


def dropped(found: Verdict) -> Outcome:
    """The outcome of a copy whose verdict is not PROCESS."""
    return Outcome.ALREADY_POISONED if found is Verdict.POISONED else Outcome.DUPLICATE


class HandlerFailed(Exception):
    """The handler raised and the delivery count allows another try: redeliver the signal
    after ``delay`` seconds (the route's retry policy, or what the handler asked for)."""

    def __init__(self, message: str, delay: float = 0.0) -> None:
        super().__init__(message)
        self.delay = delay


def no_ack() -> None:
    return None


@dataclass(frozen=True)
class Incoming:
    """One leased signal: its body as on the queue (base64 text), its delivery count, and
    the call that acknowledges it (the host deletes it once its outcome is durable)."""

    body: str
    dequeue_count: int
    ack: Callable[[], None] = no_ack
    trace: Mapping[str, str] | None = None
    """The trace context (W3C headers) its processing continues - a Functions invocation's,
    when invocations share a round - or None for the current one."""


@dataclass(frozen=True)
class Handoff:
    """A committed outbox record left for someone else to dispatch (a Durable orchestration).

    Identifies the record by its slot and the incoming copy it was committed for: whoever
    drives it later checks that the slot still holds this very record before doing anything.
    """

    endpoint: str
    key: RecordKey
    copies: int
    trace: Mapping[str, str] = field(default_factory=dict)
    """The trace context of the process span that committed it (W3C headers): the
    orchestration's sends belong to that trace."""


@dataclass(frozen=True)
class Delivery:
    outcome: Outcome
    handoff: Handoff | None = None
    parts: tuple[Delivery, ...] = ()
    """For a bundle (``bus.protocol.copies.bundles``): each of its signals' delivery, in order; the
    bundle's own ``outcome`` is then PROCESSED (every part reached an outcome)."""

    @property
    def handoffs(self) -> list[Handoff]:
        """Every record left for an orchestration: this delivery's, or its parts'."""
        own = [self.handoff] if self.handoff is not None else []
        return own + [handoff for part in self.parts for handoff in part.handoffs]
