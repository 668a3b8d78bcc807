"""Poisoned messages: reading, replaying and purging an endpoint's poison queue.

A poisoned message's inbox token is *poisoned* (``inbox``): no copy of it can be processed while
it sits in the poison queue. Replaying is therefore exactly-once by construction:

1. revive the token (poisoned → live) with a compare-and-swap on its ETag - of two replays of one
   entry, only one can do this - writing on it the signal step 2 sends;
2. put the original signal back on the endpoint's queue;
3. delete the poison entry.

A replay interrupted after step 1 leaves a live token and the entry: replaying again sees the
token live and just re-sends the signal (a second copy of a live message is a duplicate the
receiver drops once the first is processed), and if nobody does, the sweeper sends the signal
the token carries once it has waited ``Settings.release_resend_seconds``, as it does for a
released deferral (``sweeper``) - an operator who decided to leave the entry after a replay of
every entry stopped half-way leaves no message that nothing will ever signal. A token that is
gone means the message was processed (or purged) since: the entry is stale and is removed.
Entries without an envelope (bodies that were never a message) cannot be replayed; purge them.

A token found live (or pending, or poisoned as a presumed orphan) is rewritten live in step 1 all
the same, by the same compare-and-swap: a poisoning writes its entry first and poisons the token
afterwards, by the ETag it read before the entry (``poisoning``), so a replay of that entry in
between makes poisoning the token fail. Were it to land after the copy is sent and the entry
deleted, the token would be poisoned with nothing left to replay it, and the copy dropped.

The Functions host moves a message to the poison queue itself when its function raised on
the last delivery allowed, or when its dequeue count is over the maximum before it invokes the
function at all: unchanged - a signal, or a whole bundle - without a reason, its tokens still
live, and (like any message the host sends) expiring after 7 days. The bus's trigger poisons a
handler's last failure itself, with the reason, so what the host moves is a message whose last
delivery never ended: the instance crashed, was stopped, or the invocation timed out - a
**crash**, not a failure (a crash loop moves every message its instances had leased). Every
operation here first **adopts** such messages (``adopt``; maintenance runs it too), per signal:

* while it has automatic retries left (``crash_retry_delays``, ``Settings.crash_retry_delays``)
  its signal is sent again after the next one's wait, its token rewritten first by
  compare-and-swap - live, counting the retry, carrying the signal and when it is due (so the
  sweeper sends it again should the send not happen) - and the retry audited; nothing waits in
  the poison queue meanwhile;
* then, or when its token is not live, an entry of the bus's own, with its envelope, its
  token poisoned, never expiring, marked as a crash (``PoisonedMessage.crashed``) with the
  retries it had, and the delivery count the host moved it at (the maximum and one, plus
  what a copy put back carried) - listed, replayed and purged like any other.

A replay sends only the copy the bus recorded: the poisoning that poisoned a token records the
digest of that copy in it (``Token.poisoned_by``), and the sender wrote its lineage (type,
source, correlation, cause) when it created the token; an entry whose body is another - one
written into the poison queue with a real message's ids - answers ``mismatched`` and revives
nothing, and keeping one entry per token keeps the recorded copy's.

A replay re-sends the signal as it was sent: without the delivery count a copy put back by the
Functions trigger carries (``deliveries``, docs/envelope.md), so that a replayed message always
starts counting its deliveries afresh, however its entry came to be.

A message poisoned because its time-to-live ended (reason ``expired: ...``) keeps its
``expires_at`` when replayed, so it expires again on arrival and comes back here. To have it
handled after all, replay it with ``drop_expiry``: the signal is sent without ``expires_at``
(signed again with the app's key when it was signed: the signature covers the field).

Purging deletes the entry and, when its token is poisoned, the token and its claim-check
payload: any late copy of the message is then a duplicate. A token found live whose recorded
copy is the entry's - its poisoning wrote the entry and has yet to poison the token, or stopped
in between - is poisoned by the purge first, by the same compare-and-swap, and purged with the
entry: the poisoning's own then fails. Were it to land after the entry was deleted, the token
would be poisoned with no entry to replay or purge it, and its payload kept for good.
A message whose handler committed can be poisoned too (its sends waited for room while its
deliveries ran out); its token is what tells the record is unfinished, so a purge first
completes that record, or keeps the entry while it cannot (``settle``:
``bus.protocol.receive.settle``; ``refusals`` says why). One entry per token: poisonings that
raced leave one each, and ``adopt`` deletes all but the oldest.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

from bus.audit import Audit
from bus.envelope import (
    BadSignal,
    Envelope,
    carried_deliveries,
    decode_signal,
    encode_signal,
    split_bundle,
)
from bus.errors import Contention, QueueFull, UnreadableRecord, UnreadableVersion
from bus.ids import random_id
from bus.naming import Names
from bus.protocol.copies.payloads import Payloads
from bus.protocol.copies.sealing import Sealer
from bus.protocol.outbox.slot import ClaimLost
from bus.protocol.poison.queue import PoisonEntry, PoisonQueue, as_sent, signal_digest
from bus.protocol.safeguards import Safeguards
from bus.protocol.tokens.inbox import Inbox, Lineage, Token, TokenState
from bus.protocol.tokens.verdict import Verdict, verdict
from bus.storage import NotFound, QueueMessage, Queues, StorageError

log = logging.getLogger(__name__)

HOST_REASON = "moved to the poison queue by the host after its maximum dequeue count"
_PAGE = 32  # the most messages one receive returns
_RELEASE_ATTEMPTS = 3
_ROUNDS = 5


@dataclass(frozen=True)
class PoisonedMessage:
    """One poison queue entry, with the id that names it in this queue."""

    id: str
    entry: PoisonEntry
    token: TokenState | None  # of the message in the inbox; None: gone (or no envelope)
    recoveries: int = 0
    """The automatic retries its message had after crashes (``Settings.crash_retry_delays``)."""

    @property
    def replayable(self) -> bool:
        return self.entry.envelope is not None and self.entry.original_body != ""

    @property
    def crashed(self) -> bool:
        """Moved here by the Functions host, not for a handler's failure: its last delivery
        never ended (a crash, a timeout, an instance stopped) - shown apart from failures."""
        return self.entry.reason == HOST_REASON


@dataclass(frozen=True)
class EntryFilter:
    """Which entries an operator means: each field given must match (None: any). Text is
    matched case-insensitively, as a part of the field."""

    message_type: str | None = None
    """The message's type, exactly (an entry without an envelope has none)."""
    exception: str | None = None
    """Text of the last exception (its type or message)."""
    reason: str | None = None
    """Text of the reason the entry was poisoned for."""
    since: float | None = None
    """Poisoned at or after (epoch seconds)."""
    until: float | None = None
    """Poisoned before (epoch seconds)."""

    def matches(self, letter: PoisonedMessage) -> bool:
        entry = letter.entry
        envelope = entry.envelope
        at = entry.poisoned_at.timestamp()
        return ((self.message_type is None
                 or (envelope is not None and envelope.message_type == self.message_type))
                and _contains(entry.exception or "", self.exception)
                and _contains(entry.reason, self.reason)
                and (self.since is None or at >= self.since)
                and (self.until is None or at < self.until))


def _contains(text: str, part: str | None) -> bool:
    return part is None or part.casefold() in text.casefold()


class ReplayResult(str, enum.Enum):
    REPLAYED = "replayed"  # the token was poisoned: it is live again and the signal is queued
    RESENT = "resent"  # an earlier replay was interrupted: the signal is queued again
    STALE = "stale"  # the message was processed or purged since: the entry was removed
    NOT_A_MESSAGE = "not a message"  # nothing to replay (kept; purge it)
    MISMATCHED = "mismatched"  # its body is not the message its envelope names, or not the
    # copy the token recorded when it was poisoned (a forged entry; kept: purge it)
    UNVERIFIED = "unverified"  # a drop-expiry replay of a copy whose signature does not hold:
    # never signed anew (kept; purge it, or fix the keys and replay it as it is)


class PoisonedMessages:
    """The poison queue of one endpoint."""

    def __init__(self, *, endpoint: str, names: Names, queues: Queues, inbox: Inbox,
                 payloads: Payloads, clock: Callable[[], float],
                 new_id: Callable[[], str] = random_id, peek_lease: float = 60.0,
                 sealer: Sealer | None = None,
                 safeguards: Safeguards | None = None,
                 settle: Callable[[Envelope], None] | None = None,
                 audit: Audit | None = None, crash_retry_delays: tuple[float, ...] = (),
                 host_deliveries: int = 6) -> None:
        """``sealer``: verifies a signed copy and signs it anew, for a replay that drops its
        ``expires_at`` (the app's keys). ``settle``: completes the unfinished outbox record of
        a message before a purge deletes its token (``bus.protocol.receive.settle``), raising
        when it cannot yet. ``crash_retry_delays``: the automatic retries of what the host
        moved here (``Settings.crash_retry_delays``). ``host_deliveries``: the delivery count
        at which the host moves a message without invoking its function (the max delivery
        count and one)."""
        self._crash_delays = crash_retry_delays
        self._host_deliveries = host_deliveries
        self._settle = settle
        self._audit = audit
        self.refusals: dict[str, str] = {}
        """Why the last ``purge`` kept each entry it was asked to purge and did not."""
        self.endpoint = endpoint
        self._swap_live = (safeguards or Safeguards()).swap_before_resend
        self._poison_live = (safeguards or Safeguards()).poison_before_purge
        self._one_entry = (safeguards or Safeguards()).one_entry_per_token
        self._sealer = sealer
        self._queue = names.queue(endpoint)
        self._poison = names.poison_queue(endpoint)
        self._queues = queues
        self._inbox = inbox
        self._payloads = payloads
        self._clock = clock
        self.peek_lease = peek_lease
        """Seconds an entry stays hidden from other readers while it is read (a read that
        fails before it releases its entries leaves them hidden that long)."""
        self._writer = PoisonQueue(queues, self._poison, endpoint, blobs=payloads.blobs,
                                   container=payloads.container, new_id=new_id)

    def adopt(self) -> int:
        """Turn what the Functions host moved here itself into entries of the bus's own (see
        the module docstring), and keep one entry per poisoned token; returns how many
        signals were adopted. A signal whose message was processed since (its token gone) is
        dropped: there is nothing to replay. A peek comes first, and when it shows nothing to
        do the queue is left unleased: maintenance runs this on every pass, and every
        receive here hides the entries it returns from the other readers - an operator's
        purge among them - for the peek lease if its answer is lost."""
        if not self._worth_leasing():
            return 0
        adopted = 0
        ours: list[QueueMessage] = []
        unadopted: list[QueueMessage] = []  # the host's, leased here and not adopted (yet)
        try:
            while page := self._queues.receive(self._poison, max_messages=_PAGE,
                                               lease=self.peek_lease):
                theirs: list[QueueMessage] = []
                for message in page:
                    (ours if self._ours(message) else theirs).append(message)
                unadopted.extend(theirs)
                for message in theirs:
                    adopted += self._adopt(message)
                    unadopted.remove(message)
            if self._one_entry:
                ours = self._without_duplicates(ours)
        finally:
            # The host's messages a failure left unadopted are shown again at once too:
            # hidden for the peek lease, no other reader could adopt them meanwhile, and
            # each expires with the queue's time-to-live unless adopted.
            self._release(ours + unadopted)
        return adopted

    def _worth_leasing(self) -> bool:
        """Whether the front of the queue (one peek, ``_PAGE`` entries) may hold anything
        ``adopt`` acts on: a message of the host's, entries that may be duplicates (two of
        one token, or kept in a blob), or more than one peek shows."""
        bodies = self._queues.peek(self._poison, max_messages=_PAGE)
        if len(bodies) == _PAGE:
            return True
        attempts: set[str] = set()
        for body in bodies:
            try:
                entry = PoisonEntry.decode(body)
            except UnreadableVersion:
                continue  # a newer bus's entry: ``adopt`` leaves it as it is too
            except (ValueError, binascii.Error):
                return True  # the host's
            if not self._one_entry:
                continue
            if entry.entry_ref is not None:
                return True
            if entry.envelope is not None and entry.envelope.destination == self.endpoint:
                if entry.envelope.attempt_id in attempts:
                    return True
                attempts.add(entry.envelope.attempt_id)
        return False

    def _without_duplicates(self, ours: list[QueueMessage]) -> list[QueueMessage]:
        """Delete all but the oldest entry of each token that is poisoned or gone; the rest of
        ``ours``. Poisonings that race (concurrent copies of one message rejected, each writing
        its entry before one of them poisons the token: the others' compare-and-swap fails)
        leave one entry each. Only a token that is poisoned now (its poisoning landed, so the
        other entries are spare) or gone (its message processed or purged since: every entry
        is stale, one is kept to say so); of a poisoned token, only the entries of the copy
        it records (``_recorded``) - an entry forged with its ids is no duplicate of the real
        one, which must not go in its favour. An entry kept whole in a blob (it names no envelope
        here) is kept once: two alike to the byte are one entry sent twice (a send retried
        after its answer was lost), and a replay or purge of one deletes the blob the other
        points to - a pointer left to a blob so deleted (its twin was hidden by another
        reader's lease when it went) goes too."""
        by_token: dict[str, list[tuple[QueueMessage, PoisonEntry]]] = {}
        by_body: dict[str, list[tuple[QueueMessage, PoisonEntry]]] = {}
        seen: set[str] = set()
        for message in ours:
            if message.id in seen:  # received twice: its lease ran out while the pages came
                continue
            seen.add(message.id)
            try:
                entry = PoisonEntry.decode(message.body)
            except ValueError:
                continue
            if entry.envelope is not None and entry.envelope.destination == self.endpoint:
                by_token.setdefault(entry.envelope.attempt_id, []).append((message, entry))
            elif entry.entry_ref is not None:
                by_body.setdefault(message.body, []).append((message, entry))
        spare: set[str] = set()
        for twins in by_body.values():
            gone = self._writer.gone(twins[0][1])
            for message, _ in twins if gone else twins[1:]:
                with contextlib.suppress(NotFound):
                    self._queues.delete(self._poison, message)
                spare.add(message.id)
        for attempt_id, group in by_token.items():
            if len(group) < 2:
                continue
            token = self._inbox.read(self.endpoint, attempt_id)
            if verdict(token) not in (Verdict.POISONED, Verdict.CONSUMED):
                continue
            # Only entries of the copy it records are one another's duplicates.
            alike = group if token is None else [
                pair for pair in group if _recorded(token, pair[1].original_body)]
            for message, _ in sorted(alike, key=lambda pair: pair[1].poisoned_at)[1:]:
                with contextlib.suppress(NotFound):
                    self._queues.delete(self._poison, message)
                spare.add(message.id)
        return [message for message in ours if message.id not in spare]

    def entries(self, *, adopt: bool = True,
                where: EntryFilter | None = None) -> list[PoisonedMessage]:
        """Every entry, oldest first (entries are leased briefly while read). ``adopt``:
        first turn what the Functions host moved here into entries of the bus's own, which
        poisons their tokens (``adopt``); without it the host's messages are listed as they
        are, not replayable until adopted, and the reading changes nothing (the dashboard's
        reads: maintenance, a replay and a purge adopt them). ``where``: only the entries it
        matches (the whole queue is read all the same)."""
        with self._leased(adopt=adopt) as entries:
            listed = [self._listed(m, e) for m, e in entries]
        return [x for x in listed if where is None or where.matches(x)]

    def replay(self, ids: set[str] | None = None, *,
               drop_expiry: bool = False) -> dict[str, ReplayResult]:
        """Replay the entries named by ``ids`` (all when None); returns what happened to each.
        ``drop_expiry``: send their messages without a time-to-live (see the module
        docstring); otherwise an expired message expires again."""
        results: dict[str, ReplayResult] = {}
        with self._leased() as entries:
            chosen = [(m, e) for m, e in entries if ids is None or m.id in ids]
            self._record("replay", ids, chosen, {"drop_expiry": True} if drop_expiry else {})
            for message, entry in chosen:
                results[message.id] = self._replay(message, entry, drop_expiry)
        return results

    def purge(self, ids: set[str] | None = None) -> list[str]:
        """Delete the entries named by ``ids`` (all when None), their poisoned tokens (one
        poisoned as a presumed orphan too) and payloads; returns the ids purged."""
        purged: list[str] = []
        self.refusals = {}
        with self._leased() as entries:
            chosen = [(m, e) for m, e in entries if ids is None or m.id in ids]
            self._record("purge", ids, chosen, {})
            for message, entry in chosen:
                if entry.envelope is not None:
                    token = self._poisoned_for_purge(entry)
                    if _poisoned(token):
                        refused = self._settled(entry.envelope)
                        if refused is not None:
                            self.refusals[message.id] = refused
                            continue
                        token = self._inbox.read(self.endpoint, entry.envelope.attempt_id)
                    if token is not None and _poisoned(token):
                        self._inbox.delete_if_unchanged(token)
                        if entry.envelope.payload_ref is not None and self._payloads.confined(
                                entry.envelope, self.endpoint):
                            self._payloads.delete(entry.envelope.payload_ref)
                self._queues.delete(self._poison, message)
                self._writer.discard(entry)
                purged.append(message.id)
        return purged

    def _poisoned_for_purge(self, entry: PoisonEntry) -> Token | None:
        """The entry's token, as a purge acts on it: a live one whose recorded copy is the
        entry's (its poisoning wrote the entry and has yet to poison it, or stopped in
        between) is poisoned here first, by a compare-and-swap - the poisoning's own then
        fails, as it does against a replay - so that the purge deletes it with the entry."""
        assert entry.envelope is not None
        for _ in range(_ROUNDS):
            token = self._inbox.read(self.endpoint, entry.envelope.attempt_id)
            if (not self._poison_live or token is None or token.state is not TokenState.LIVE
                    or not _recorded(token, entry.original_body)):
                return token
            if self._inbox.poison(token, self._clock(),
                                  poisoned_by=signal_digest(entry.original_body)):
                return self._inbox.read(self.endpoint, entry.envelope.attempt_id)
        raise Contention(f"the token of {entry.envelope.message_id} at {self.endpoint} kept "
                         "changing")

    def _record(self, action: str, ids: set[str] | None,
                chosen: list[tuple[QueueMessage, PoisonEntry]], options: dict[str, bool]) -> None:
        """The audit record of a replay or purge, before it acts (``bus.audit``): the entries
        and the messages it acts on."""
        if self._audit is None:
            return
        self._audit(action, self.endpoint, {
            **({"all": True} if ids is None else {"asked": sorted(ids)}),
            "entries": [m.id for m, _ in chosen],
            "messages": [e.envelope.message_id for _, e in chosen if e.envelope is not None],
            **options})

    # -- steps ------------------------------------------------------------------------------
    def _settled(self, envelope: Envelope) -> str | None:
        """None once the message has no unfinished record (completed now, or none), else why
        not: its token must stay until the record is finished (``inbox.finished``)."""
        if self._settle is None:
            return None
        try:
            self._settle(envelope)
        except QueueFull as exc:
            return f"kept: its handler committed and its sends wait for room ({exc})"
        except (StorageError, Contention, ClaimLost, UnreadableRecord) as exc:
            return f"kept: its handler's committed record could not be completed now ({exc})"
        return None

    def _replay(self, message: QueueMessage, entry: PoisonEntry,
                drop_expiry: bool) -> ReplayResult:
        envelope = entry.envelope
        if envelope is None or not entry.original_body:
            return ReplayResult.NOT_A_MESSAGE
        if not self._matches(entry, envelope):
            return ReplayResult.MISMATCHED
        body = self._resent(entry.original_body, drop_expiry)  # before the token changes
        if body is None:
            return ReplayResult.UNVERIFIED
        for _ in range(_ROUNDS):
            token = self._inbox.read(self.endpoint, envelope.attempt_id)
            found = verdict(token)
            if token is None or found.payload_is_garbage:  # consumed or fenced
                self._queues.delete(self._poison, message)
                self._writer.discard(entry)
                return ReplayResult.STALE
            if not _recorded(token, entry.original_body):
                return ReplayResult.MISMATCHED
            # Live, pending or deferred: a copy is harmless. Poisoned: made live again. Live or
            # pending: rewritten live all the same, so that a poisoning's poison by the ETag it
            # read before this entry was written fails (see the module docstring).
            result = ReplayResult.REPLAYED if found is Verdict.POISONED else ReplayResult.RESENT
            swap = found is Verdict.POISONED or (found is Verdict.PROCESS and self._swap_live)
            if swap and not self._inbox.revive(token, self._clock(), body):
                continue  # it changed under us: look again
            self._queues.send(self._queue, body)
            self._queues.delete(self._poison, message)
            self._writer.discard(entry)
            return result
        raise Contention(f"the token of {envelope.message_id} kept changing")

    def _resent(self, body: str, drop_expiry: bool) -> str | None:
        """The signal a replay sends: as sent, and without ``expires_at`` if asked - None
        when that would sign anew a copy whose signature does not hold (a forgery, poisoned
        as such, would go out signed with the app's key)."""
        sent = as_sent(body)
        if not drop_expiry:
            return sent
        envelope = decode_signal(sent)  # it does decode: ``_matches`` checked
        if envelope.expires_at is None:
            return sent
        lasting = envelope.model_copy(update={"expires_at": None})
        if envelope.signature is not None:  # the signature covers expires_at
            if self._sealer is None:
                raise ValueError("dropping the expiry of a signed copy needs the app's key: "
                                 "use Bus.poisoned")
            if self._sealer.check(envelope) is not None:
                return None
            lasting = self._sealer.resign(lasting)
        return encode_signal(lasting)

    def _matches(self, entry: PoisonEntry, envelope: Envelope) -> bool:
        """Whether the entry's body is the signal of the message its envelope names, for this
        endpoint: a replay revives the envelope's token and sends the body, so a forged entry
        must not pair one message's token with another's body."""
        try:
            sent = decode_signal(as_sent(entry.original_body))
        except BadSignal:
            return False
        return ((sent.message_id, sent.attempt_id, sent.destination)
                == (envelope.message_id, envelope.attempt_id, envelope.destination)
                and envelope.destination == self.endpoint)

    def _listed(self, message: QueueMessage, entry: PoisonEntry) -> PoisonedMessage:
        token = None
        if entry.envelope is not None:
            token = self._inbox.read(self.endpoint, entry.envelope.attempt_id)
        return PoisonedMessage(message.id, entry, token.state if token is not None else None,
                               token.recoveries if token is not None else 0)

    def _adopt(self, message: QueueMessage) -> int:
        """One message the host put here: per signal an automatic retry or an entry, then
        the message goes."""
        bodies = split_bundle(message.body) or [message.body]
        for body in bodies:
            self._adopt_signal(body)
        self._queues.delete(self._poison, message)
        return len(bodies)

    def _adopt_signal(self, body: str) -> None:
        try:
            envelope: Envelope | None = decode_signal(body)
        except BadSignal:
            envelope = None
        token = None
        if envelope is not None:
            token = self._inbox.read(self.endpoint, envelope.attempt_id)
            if verdict(token).duplicate:
                return  # processed (or never to be) since: nothing to replay
            if token is not None and self._retried(token, body, envelope):
                return
        self._writer.put(body, reason=HOST_REASON, dequeue_count=self._deliveries(body),
                         now=self._clock(), envelope=envelope)
        if token is not None and verdict(token) is Verdict.PROCESS:
            self._inbox.poison(token, self._clock(), poisoned_by=signal_digest(body))

    def _deliveries(self, body: str) -> int:
        """The delivery count of a signal the host moved here: the host moves a message
        whose dequeue count is over the maximum before invoking its function (the bus's
        trigger poisons a handler's last failure itself), plus the deliveries a copy put back
        carried."""
        try:
            _, carried = carried_deliveries(base64.b64decode(body, validate=True))
        except (ValueError, binascii.Error):
            carried = 0
        return carried + self._host_deliveries

    def _retried(self, token: Token, body: str, envelope: Envelope) -> bool:
        """Send a crashed message's signal again after the wait of its next automatic retry
        (``crash_retry_delays``), counted on its token; False when its retries are used up
        (or its token is not live: pending, or poisoned already) and it becomes an entry.

        The token is rewritten first, by compare-and-swap, carrying the signal and when it
        is due: of two adoptions of one message only one counts a retry per token version,
        and one that stops before the send leaves a token the sweeper signals
        (``Settings.release_resend_seconds`` after it was due). The signal goes without the
        deliveries a copy carried: the retry counts its deliveries afresh, as a replay does."""
        for _ in range(_ROUNDS):
            if token.state is not TokenState.LIVE or token.recoveries >= len(self._crash_delays):
                return False
            delay = min(self._crash_delays[token.recoveries], self._queues.limits.longest_delay)
            signal = as_sent(body)
            now = self._clock()
            if self._audit is not None:
                self._audit("retry", self.endpoint, {
                    "messages": [envelope.message_id], "retry": token.recoveries + 1,
                    "of": len(self._crash_delays), "delay": delay})
            if self._inbox.revive(token, now, signal, recovery=True, due=now + delay):
                self._queues.send(self._queue, signal, delay=delay)
                log.warning("%s: %s was moved to the poison queue by the host without a "
                            "handler failure (a crash?): automatic retry %d of %d in %g s",
                            self.endpoint, envelope.message_id, token.recoveries + 1,
                            len(self._crash_delays), delay)
                return True
            found = self._inbox.read(self.endpoint, envelope.attempt_id)
            if found is None or verdict(found).duplicate or found.recoveries > token.recoveries:
                return True  # processed since, or retried by another adoption
            token = found
        raise Contention(f"the token of {envelope.message_id} kept changing")

    @staticmethod
    def _ours(message: QueueMessage) -> bool:
        """Whether the bus wrote this entry (any version)."""
        try:
            PoisonEntry.decode(message.body)
        except UnreadableVersion:
            return True
        except (ValueError, binascii.Error):
            return False
        return True

    @contextmanager
    def _leased(self, *, adopt: bool = True) -> Iterator[list[tuple[QueueMessage, PoisonEntry]]]:
        """Every entry of the poison queue (after adopting the host's, unless not
        ``adopt``), leased, oldest first; released again on the way out (deleted ones
        excepted)."""
        if adopt:
            self.adopt()
        messages: list[QueueMessage] = []
        while True:
            page = self._queues.receive(self._poison, max_messages=_PAGE, lease=self.peek_lease)
            if not page:
                break
            messages.extend(page)
        try:
            entries = [(m, self._entry(m)) for m in messages]
            yield sorted(entries, key=lambda pair: pair[1].poisoned_at)
        finally:
            self._release(messages)

    def _release(self, messages: list[QueueMessage]) -> None:
        """Make leased entries visible again (deleted ones excepted: replayed or purged).
        Each on its own, tried up to ``_RELEASE_ATTEMPTS`` times: an entry whose release still
        fails is hidden from every reader (the dashboard, ``dlq``, maintenance) until its
        lease runs out, and the others are not left hidden for as long."""
        for message in messages:
            for _ in range(_RELEASE_ATTEMPTS):
                try:
                    self._queues.extend(self._poison, message, lease=0)
                    break
                except NotFound:
                    break  # deleted meanwhile (replayed, purged): nothing to show again
                except StorageError:
                    continue

    def _entry(self, message: QueueMessage) -> PoisonEntry:
        try:
            return self._writer.read(message.body)
        except UnreadableVersion as exc:  # an entry a newer bus wrote: shown, not guessed at
            return self._unknown(message, f"a poison entry this bus cannot read: {exc}", None)
        except (ValueError, binascii.Error):  # the host's, moved here since ``adopt`` ran
            return self._unknown(message, HOST_REASON, None)

    def _unknown(self, message: QueueMessage, reason: str,
                 envelope: Envelope | None) -> PoisonEntry:
        """An entry for a poison-queue message the bus did not write (or cannot read)."""
        return PoisonEntry(
            reason=reason, dequeue_count=message.dequeue_count, endpoint=self.endpoint,
            poisoned_at=datetime.fromtimestamp(self._clock(), tz=timezone.utc),
            original_body=message.body, envelope=envelope)


def _recorded(token: Token, body: str) -> bool:
    """Whether ``body`` is the copy the bus recorded for the token: the one whose poisoning
    poisoned it (its digest), of the lineage its sender wrote - where the token has them (a
    token poisoned by an earlier version records no copy; a foreign producer's, no lineage).
    A forged entry with the real message's ids and another body revives nothing."""
    if token.poisoned_by is not None and signal_digest(body) != token.poisoned_by:
        return False
    if token.lineage is None:
        return True
    try:
        return token.lineage == Lineage.of(decode_signal(as_sent(body)))
    except BadSignal:
        return False


def _poisoned(token: Token | None) -> bool:
    """Whether the token is poisoned - one poisoned as a presumed orphan too, which a late
    signal may still process (``verdict``) but a purge removes like any other."""
    return token is not None and token.state is TokenState.POISONED
