"""Retry policies: what happens when a handler raises.

    payments = Endpoint("payments", retry=RetryPolicy(immediate=3, delays=(5, 30, 120)))

    @payments.handles(Charge, partition=..., retry=RetryPolicy(immediate=1, delays=(60,)))
    def charge(message: Charge, ctx: Context) -> None:
        if gateway.busy():
            raise RetryAfter(30)       # ask for another delivery in 30 s
        ...

1. **Immediate retries**: the handler runs up to ``immediate`` times within one delivery, with
   exponential backoff and jitter between attempts (tenacity); each attempt starts from fresh
   reads, and nothing is committed until one succeeds.
2. **Delayed retries**: then the message is released with the visibility delay
   ``delays[n-1]`` after its n-th delivery (the last delay repeats) - the queue's own delay, so
   nothing waits in memory. Under every host: the Functions trigger, whose host releases a
   message after host.json's ``visibilityTimeout``, postpones the message itself instead.
   A handler can ask for a specific delay by raising ``RetryAfter``.
3. **Poison**: on the last delivery allowed (``Settings.max_delivery_count``, host.json
   ``maxDequeueCount`` in Functions) the message goes to the poison queue with the exception.

A policy on ``handles()`` wins over the endpoint's, which wins over the default (one attempt
per delivery, redelivered after 1 s). Storage errors are not handler failures: they are
retried by the hosts' own transient-error policy, and exactly-once holds through all of it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from bus.backoff import FIRST_WAIT, LONGEST_WAIT, backoff

__all__ = ["DEFAULT_RETRY", "Abandon", "Reject", "RetryAfter", "RetryPolicy", "backoff"]


class RetryPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    immediate: int = Field(1, ge=1, le=20)
    """Attempts of the handler within one delivery (1: no immediate retry)."""
    backoff_initial: float = Field(FIRST_WAIT, ge=0)
    """First wait between immediate attempts, in seconds; doubles each time, plus a random
    jitter of up to this much."""
    backoff_max: float = Field(LONGEST_WAIT, ge=0)
    """Longest wait between immediate attempts."""
    delays: tuple[float, ...] = Field((1.0,), min_length=1)
    """Visibility delay before the next delivery, after the 1st, 2nd, ... (the last repeats).
    At most 7 days (the queue's limit)."""

    def delay_after(self, delivery: int) -> float:
        """Seconds before the delivery after ``delivery`` (1-based)."""
        return self.delays[min(max(delivery, 1), len(self.delays)) - 1]

    def model_post_init(self, _context: object) -> None:
        if any(d < 0 or d > 7 * 24 * 3600 for d in self.delays):
            raise ValueError("retry delays must be between 0 and 7 days (the queue's limit)")


DEFAULT_RETRY = RetryPolicy()


class RetryAfter(Exception):
    """Raised by a handler: deliver this message again after ``seconds`` (no immediate retry).

    It counts as a delivery: a message that keeps asking is poisoned at the maximum delivery
    count like any failing one.
    """

    def __init__(self, seconds: float, reason: str = "") -> None:
        if not 0 <= seconds <= 7 * 24 * 3600:
            raise ValueError("RetryAfter takes 0 to 7 days (the queue's visibility limit)")
        super().__init__(reason or f"retry after {seconds:g} s")
        self.seconds = seconds


class Abandon(RetryAfter):
    """Raised by a handler: give the message up for now and let it be delivered again at once
    (Service Bus's abandon). It counts as a delivery, like any retry."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(0.0, reason or "abandoned by the handler")


class Reject(Exception):
    """Raised by a handler or a middleware: this message can never succeed (it fails
    validation, say): put it in the poison queue now, with this reason, without retries."""
