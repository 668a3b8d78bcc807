"""The orphan-cleanup rule. Run it periodically (the Functions app does, on a timer).

What can be left behind, and when it is removed:

* a fenced token (tombstone of a superseded attempt id) - once it is older than the ghost
  horizon, the longest a delayed storage request can still arrive (default 1 hour; Azure
  Storage refuses requests signed more than 15 minutes earlier);
* a claim-check blob whose token is gone or fenced - at once (tokens are created before
  their payload blob, so such a blob can never be needed again); a deferred message keeps its
  token, so its blob stays;
* a released deferral (a live token of a later generation), a replayed message (a token a
  poison-queue replay made live) or a crashed message retried automatically (a token due
  later) still unprocessed ``release_resend`` seconds after it was due - its
  signal is sent again, at every sweep until it is processed (the release or the replay may
  have stopped between making the token live and sending; a second signal is a harmless
  duplicate). It is never presumed an orphan: its token carries its signal;
* an index row of a deferral (``inbox``) whose token is gone - at once (the message was
  released and processed);
* a pending token (created before its record's commit, ``dispatch``) that no committed record
  lists - once it is older than ``pending_age``: the handler run that created it never
  committed (a crash, a lost claim, an unknown outcome). Its origin slot is rewritten first
  (a compare-and-swap), so a slow worker that still holds the slot as it was cannot commit a
  record listing the token afterwards; then the token goes if unchanged. A committed record
  confirms its pending tokens before it is finished, and a slot moves on to another record
  only once it is, so "no committed record in the origin slot lists it" is exact;
* a send mark (``marked``) older than ``mark_retention`` (``Settings.ledger_retention_seconds``,
  7 days) whose token is gone - then the same message id may be sent again as a new message;
  a mark whose token still exists stays, however old (its message still waits). Found through
  the marks' log (``marklog``): up to ``MARK_LOG_ROWS`` due rows a pass, a row naming the marks
  of one send, instead of reading every mark;
* a live token nobody signalled (its sender crashed between token and signal) - once no
  signal has come for ``orphan_age`` (default 7 days) after it was due (its creation, or a
  scheduled message's due time) it is poisoned as a presumed **orphan**, with a poison entry,
  so that a message whose sender died is not lost silently. Presumed, because the protocol
  cannot prove that no signal will come (a backlog, an endpoint paused for longer): if one
  does, its copy is processed all the same (``verdict``) and the entry reads as stale. Poisoned,
  not deleted: a token disappears only when its message's effect is finished (``dispatch``),
  and a slot's record counts as finished exactly when its incoming token is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bus.protocol.copies.payloads import Payloads
from bus.protocol.outbox.slot import ClaimLost, Outbox
from bus.protocol.poison.queue import PoisonQueue
from bus.protocol.safeguards import Safeguards
from bus.protocol.tokens.inbox import Inbox, Token, TokenState
from bus.protocol.tokens.marklog import CALL_SLACK, MarkLog
from bus.protocol.tokens.verdict import verdict

ALL_ON = Safeguards()
MARK_LOG_ROWS = 100
"""The marks' log rows one pass reads (one request; each names one send's marks)."""
RECHECK_SECONDS = 86400.0
"""When the marks of a row that still wait are looked at again (or after the retention, if
shorter)."""


@dataclass
class SweepReport:
    fences_removed: int = 0
    orphan_tokens_parked: int = 0
    payloads_removed: int = 0
    deferral_index_removed: int = 0
    released_signals_resent: int = 0
    """Signals sent again from the live tokens that carry them: released deferrals and
    replayed messages still unprocessed."""
    pending_tokens_removed: int = 0
    send_marks_forgotten: int = 0


class Sweeper:
    def __init__(self, *, inbox: Inbox, payloads: Payloads,
                 poison_for: Callable[[str], PoisonQueue], clock: Callable[[], float],
                 ghost_horizon: float, orphan_age: float,
                 resend: Callable[[str, str], None], release_resend: float,
                 outbox_for: Callable[[str], Outbox], pending_age: float,
                 mark_retention: float = 7 * 86400.0, mark_log: MarkLog | None = None,
                 safeguards: Safeguards = ALL_ON) -> None:
        self._mark_retention = mark_retention
        self._mark_log = mark_log
        self._outbox_for = outbox_for
        self._pending_age = pending_age
        self._safeguards = safeguards
        self._inbox = inbox
        self._payloads = payloads
        self._poison_for = poison_for
        self._clock = clock
        self._ghost_horizon = ghost_horizon
        self._orphan_age = orphan_age
        self._resend = resend
        self._release_resend = release_resend

    def sweep(self) -> SweepReport:
        report = SweepReport()
        now = self._clock()
        for token in self._inbox.all():
            age = now - token.since
            if token.state is TokenState.FENCED and age > self._ghost_horizon:
                self._inbox.delete_if_unchanged(token)
                report.fences_removed += 1
            elif (token.state is TokenState.LIVE and token.signal
                  and now - max(token.since, token.due or 0.0) > self._release_resend):
                # A released deferral or a replayed message carries its signal: never a
                # presumed orphan, since the sweeper itself can always make its signal come.
                self._resend(token.endpoint, token.signal)
                report.released_signals_resent += 1
            elif token.state is TokenState.PENDING and age > self._pending_age:
                if self._collect(token):
                    report.pending_tokens_removed += 1
            elif token.state is TokenState.LIVE and self._unsignalled(token, now):
                self._poison_for(token.endpoint).put(
                    "", reason=f"orphan inbox token: attempt {token.attempt_id} of message "
                    f"{token.message_id} was not processed within {self._orphan_age:.0f} s "
                    "of being due (processed all the same if its signal still comes)",
                    dequeue_count=0, now=now)
                if self._inbox.poison(token, now, orphan=True):
                    report.orphan_tokens_parked += 1
        if self._mark_log is not None:
            report.send_marks_forgotten += self._forget_marks(self._mark_log, now)
        for stale in self._inbox.stale_index():
            self._inbox.drop_index(stale)
            report.deferral_index_removed += 1
        for ref in self._payloads.refs():
            destination, _, attempt_id = ref.blob.partition("/")
            # The blob's question is the one a late copy of its message would ask: will
            # anything read this payload again?
            if verdict(self._inbox.read(destination, attempt_id)).payload_is_garbage:
                self._payloads.delete(ref)
                report.payloads_removed += 1
        return report

    def _forget_marks(self, mark_log: MarkLog, now: float) -> int:
        """Forget the marks of the log's due rows whose retention has passed and whose tokens
        are gone; the ids of those still waiting are logged again, due after ``recheck``."""
        forgotten = 0
        recheck = min(self._mark_retention, RECHECK_SECONDS)
        for row in mark_log.due(now, MARK_LOG_ROWS):
            waiting = []
            for message_id, mark in self._inbox.marks(row.endpoint, row.message_ids).items():
                if mark.at > row.at + CALL_SLACK:
                    continue  # a later send's mark: that send's row covers it
                if now - mark.at > self._mark_retention and self._inbox.forget_mark(mark):
                    forgotten += 1
                else:
                    waiting.append(message_id)
            mark_log.settle(row, waiting, now + recheck)
        return forgotten

    def _unsignalled(self, token: Token, now: float) -> bool:
        """Whether no signal has come for a live token for ``orphan_age`` after it was due."""
        due = max(token.since, token.due or 0.0)
        return now - due > self._orphan_age

    def _collect(self, token: Token) -> bool:
        """Remove a pending token no committed record lists; False when one does (its record
        confirms it) or its origin slot changed meanwhile (the next sweep looks again)."""
        origin = token.origin
        if origin is None:
            return False
        outbox = self._outbox_for(origin.endpoint)
        slot = outbox.load(origin.partition)
        record = slot.record
        if self._safeguards.check_origin_record and record is not None and (  # off: a break
                record.attempt_id == origin.attempt_id) and any(
                e.attempt_id == token.attempt_id for e in record.outgoing):
            return False
        if self._safeguards.fence_origin:  # off: the "skip-origin-fence" break
            try:
                outbox.touch(slot)
            except ClaimLost:
                return False
        self._inbox.withdraw(token.endpoint, token.attempt_id, token.etag)
        return True
