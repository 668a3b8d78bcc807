"""Poisoning a signal: a poison-queue entry with the reason, and its token poisoned.

Four reasons, one rule each: the signal cannot be processed as it is (``bad``: it does not
decode, is not for this endpoint, its payload is gone, its message does not validate), its
time-to-live ended before it was handled (``expired``), its handler failed on the last
delivery allowed or rejected it (``failed``), or storage failed on every delivery its host
allows (``give_up``). Poisoning the token (``bus.protocol.tokens.inbox``) is what lets the
poison-queue tools replay the entry exactly once.

The entry is written first and the token poisoned afterwards, by the ETag it was read with
*before* the entry: a crash in between leaves the entry and a live token, which a replay
re-sends. A replay can also meet that entry before the token is poisoned, crash or none; it
rewrites the live token (``poisoned``), a new ETag, so poisoning the token then fails and the
token stays live for the copy the replay sent - instead of being poisoned with its entry gone.

A pending token is confirmed (made live) before the entry is written: a copy can arrive
before its sender confirms its token (the sender signals first), and that confirmation,
landing between the read and the poisoning, would change the ETag the same way - leaving the
token live, its entry written and its signal deleted, for the sweeper to take for an orphan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bus.envelope import BadSignal, Envelope, decode_signal
from bus.observability import conventions as sc
from bus.observability import note_error
from bus.protocol.delivery import Outcome, dropped, no_ack
from bus.protocol.poison.queue import PoisonQueue, signal_digest
from bus.protocol.tokens.inbox import Inbox, Token, TokenState
from bus.protocol.tokens.verdict import Verdict, verdict
from bus.retry import Reject
from bus.storage import StorageError

log = logging.getLogger(__name__)

_CONFIRM_ROUNDS = 3
"""Tries at confirming a pending token that keeps changing before a poisoning gives up on it."""

# ``error.type`` of a process span that poisoned its signal for a reason of the bus's own (a
# handler's failure is named by its exception's class).
INVALID, UNVERIFIED, EXPIRED = "eobus.invalid_message", "eobus.bad_signature", "eobus.expired"


class Poisoning:
    """Poisons the signals of one endpoint."""

    def __init__(self, *, endpoint: str, inbox: Inbox, poison: PoisonQueue,
                 clock: Callable[[], float]) -> None:
        self.endpoint = endpoint
        self._inbox = inbox
        self._poison = poison
        self._clock = clock

    def _token(self, attempt_id: str) -> Token | None:
        """The copy's token, read before its entry is written; a pending one confirmed first
        (see the module's docstring): its copy is here, so its record is committed."""
        token = self._inbox.read(self.endpoint, attempt_id)
        for _ in range(_CONFIRM_ROUNDS):
            if token is None or token.state is not TokenState.PENDING:
                return token
            token = (self._inbox.confirm(token, self._clock())
                     or self._inbox.read(self.endpoint, attempt_id))
        return token

    def bad(self, body: str, envelope: Envelope | None, reason: str, dequeue_count: int,
            ack: Callable[[], None]) -> Outcome:
        """A signal that cannot be processed as it is (``envelope`` None: not even decoded)."""
        token = None
        if envelope is not None:
            token = self._token(envelope.attempt_id)
            found = verdict(token)
            # No token poisons all the same: a foreign or broken signal may never have had one.
            if found not in (Verdict.PROCESS, Verdict.CONSUMED):
                ack()  # poisoned already, fenced (never really sent) or deferred
                return dropped(found)
        note_error(INVALID)
        self._put_and_poison(body, envelope, reason, dequeue_count, token=token, ack=ack)
        return Outcome.POISONED

    def expired(self, body: str, envelope: Envelope, reason: str, dequeue_count: int,
                ack: Callable[[], None]) -> Outcome:
        """A signal whose time-to-live ended (``reason`` says when): poisoned, its token
        poisoned - only while its token says it may be processed. A copy of a message that was
        processed (no token: unlike ``bad``, a message that expired is a well-formed one, so
        a copy without a token is a duplicate), fenced, poisoned or deferred is dropped as
        such: one message, at most one poison entry. The receiver calls it once it has
        claimed the message's partition (an unfinished record of the message completed
        first), so a message whose handler committed is never poisoned as expired."""
        token = self._token(envelope.attempt_id)
        found = verdict(token)
        if found is not Verdict.PROCESS:
            ack()
            return dropped(found)
        note_error(EXPIRED)
        self._put_and_poison(body, envelope, reason, dequeue_count, token=token, ack=ack)
        return Outcome.EXPIRED

    def _put_and_poison(self, body: str, envelope: Envelope | None, reason: str,
                        dequeue_count: int, *, token: Token | None,
                        ack: Callable[[], None]) -> None:
        self._poison.put(body, reason=reason, dequeue_count=dequeue_count, now=self._clock(),
                         envelope=envelope)
        self._poison_token(token, body)
        ack()
        log.warning("poisoned a signal at %s: %s", self.endpoint, reason)

    def unverified(self, body: str, envelope: Envelope, reason: str, dequeue_count: int,
                   ack: Callable[[], None]) -> Outcome:
        """A signal whose signature does not hold (``bus.protocol.copies.sealing``): poisoned with
        the reason, but the token it names is left alone - an unauthenticated signal must not
        poison the token of a real copy (which then goes on to be processed). A replay after the
        keys are fixed finds the token live and re-sends the signal: processed once."""
        note_error(UNVERIFIED)
        return self._put_alone(body, envelope, reason, dequeue_count, ack)

    def foreign(self, body: str, envelope: Envelope, reason: str, dequeue_count: int,
                ack: Callable[[], None]) -> Outcome:
        """A signal the bus never wrote as it is, though its signature (if any) holds: its
        payload reference names something other than its own claim check, or it is numbered
        in another sender's stream. Poisoned with the reason, its token left alone, as
        ``unverified`` - a real copy of the message then goes on to be processed."""
        note_error(INVALID)
        return self._put_alone(body, envelope, reason, dequeue_count, ack)

    def _put_alone(self, body: str, envelope: Envelope, reason: str, dequeue_count: int,
                   ack: Callable[[], None]) -> Outcome:
        self._poison.put(body, reason=reason, dequeue_count=dequeue_count, now=self._clock(),
                         envelope=envelope)
        ack()
        log.warning("poisoned a signal at %s: %s", self.endpoint, reason)
        return Outcome.POISONED

    def failed(self, body: str, envelope: Envelope, exc: Exception, dequeue_count: int,
               ack: Callable[[], None]) -> Outcome:
        """A handler that raised on the last delivery allowed, or rejected the message -
        unless its token says another copy's poisoning (or processing) got there first:
        then this copy is dropped as such (one message, one entry)."""
        token = self._token(envelope.attempt_id)  # before the entry
        found = verdict(token)
        if found is not Verdict.PROCESS:
            ack()
            return dropped(found)
        note_error(sc.error_type(exc), exc)
        reason = (f"rejected: {exc}" if isinstance(exc, Reject)
                  else f"handler failed {dequeue_count} times (max delivery count)")
        self._poison.put(body, reason=reason, dequeue_count=dequeue_count, now=self._clock(),
                         envelope=envelope, exception=f"{type(exc).__name__}: {exc}")
        self._poison_token(token, body)
        ack()
        log.warning("poisoned %s at %s: %s", envelope.message_id, self.endpoint, reason)
        return Outcome.POISONED

    def give_up(self, body: str, deliveries: int, cause: StorageError) -> Outcome:
        """Poison a signal (its body as on the queue) after storage errors on each of its
        ``deliveries`` deliveries, ``cause`` the last: no more are allowed
        (``bus.hosting.settlement``). Same poison queue and token poisoning as a failing
        handler, so the poison-queue tools list and replay it - unless its token says there
        is nothing to poison: gone (a delivery processed it and the error came after),
        poisoned already, fenced or deferred. Raises a StorageError when poisoning
        fails too.

        A message committed by one of those deliveries whose completion kept failing is
        poisoned as well (its token is still live): the partition's next message completes
        the record and consumes the token, after which the entry reads as stale and a replay
        removes it; a replay before that completes the record itself. Exactly once either way.
        """
        try:
            envelope = decode_signal(body)
        except BadSignal as exc:  # its poisoning met the errors
            return self.bad(body, None, str(exc), deliveries, no_ack)
        token = self._token(envelope.attempt_id)
        found = verdict(token)
        if found is not Verdict.PROCESS:
            return dropped(found)
        reason = f"storage errors on {deliveries} deliveries (max delivery count)"
        self._poison.put(body, reason=reason, dequeue_count=deliveries, now=self._clock(),
                         envelope=envelope, exception=f"{type(cause).__name__}: {cause}")
        self._poison_token(token, body)
        log.warning("poisoned %s at %s: %s, the last %s", envelope.message_id, self.endpoint,
                    reason, cause)
        return Outcome.POISONED

    def _poison_token(self, token: Token | None, body: str) -> None:
        """Poison the token the entry's copy (``body``) names, recording which copy that is:
        a replay sends only that one (``PoisonedMessages``)."""
        if token is not None and verdict(token) is Verdict.PROCESS:
            self._inbox.poison(token, self._clock(), poisoned_by=signal_digest(body))
