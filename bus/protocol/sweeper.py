"""The orphan-cleanup rule. Run it periodically (the Functions app does, on a timer).

What can be left behind, and when it is removed:

* a fenced token (tombstone of a superseded attempt id) - once it is older than the ghost
  horizon, the longest a delayed storage request can still arrive (default 1 hour; Azure
  Storage refuses requests signed more than 15 minutes earlier);
* a claim-check blob whose token is gone or fenced - at once (tokens are created before
  their payload blob, so such a blob can never be needed again);
* a live token nobody signalled (its sender crashed between token and signal) - once it is
  older than ``orphan_age`` (default 7 days) it is parked, with a poison entry, so that a
  message whose signal was merely stuck that long is not lost silently. Parked, not deleted:
  a token disappears only when its message's effect is finished (``dispatch``), and a slot's
  record counts as finished exactly when its incoming token is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bus.protocol.inbox import Inbox, TokenState
from bus.protocol.payloads import Payloads
from bus.protocol.poison import PoisonQueue


@dataclass
class SweepReport:
    fences_removed: int = 0
    orphan_tokens_parked: int = 0
    payloads_removed: int = 0


class Sweeper:
    def __init__(self, *, inbox: Inbox, payloads: Payloads,
                 poison_for: Callable[[str], PoisonQueue], clock: Callable[[], float],
                 ghost_horizon: float, orphan_age: float) -> None:
        self._inbox = inbox
        self._payloads = payloads
        self._poison_for = poison_for
        self._clock = clock
        self._ghost_horizon = ghost_horizon
        self._orphan_age = orphan_age

    def sweep(self) -> SweepReport:
        report = SweepReport()
        now = self._clock()
        for token in self._inbox.all():
            age = now - token.since
            if token.state is TokenState.FENCED and age > self._ghost_horizon:
                self._inbox.delete_if_unchanged(token)
                report.fences_removed += 1
            elif token.state is TokenState.LIVE and age > self._orphan_age:
                self._poison_for(token.endpoint).put(
                    "", reason=f"orphan inbox token: attempt {token.attempt_id} of message "
                    f"{token.message_id} was not processed within {self._orphan_age:.0f} s",
                    dequeue_count=0, now=now)
                if self._inbox.park(token, now):
                    report.orphan_tokens_parked += 1
        for ref in self._payloads.refs():
            destination, _, attempt_id = ref.blob.partition("/")
            owner = self._inbox.read(destination, attempt_id)
            if owner is None or owner.state is TokenState.FENCED:
                self._payloads.delete(ref)
                report.payloads_removed += 1
        return report
