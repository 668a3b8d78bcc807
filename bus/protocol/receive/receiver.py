"""The receiver: processing one signal so that its effect happens exactly once.

For a signal carrying message ``m``, attempt ``a``, for endpoint ``E`` - each step by its code
(``bus.protocol.steps``, docs/protocol.md) and the module that does it:

R1. decode the envelope, find the handler (``admission``; bad input: ``poisoning``, with the
   reason);
R2. fetch the payload (claim check) and map the message to its state partition ``P``
   (``admission``);
R3. load ``P``'s outbox slot, remembering its ETag, with the state rows the route declares
   (``reads``) in the same request; if it holds an unfinished record (its incoming token
   still exists), complete that first (it may be ours, committed by an earlier delivery) and
   start again;
R4. check ``m``'s inbox token ``(E, a)``: gone (or fenced) means a duplicate - acknowledge;
   poisoned means it is in the poison queue already (read in one request with R3's token);
   a live one whose time-to-live ended is poisoned as expired - here, after R3, so that a
   message whose handler committed (its record completed in R3) is never called expired;
R5. run the handler against ``P`` (``handling``: reads come from R3 or storage, writes are
   collected), then create its outgoing tokens, pending (``Dispatcher.place_ahead``);
R6. commit the state changes and the outbox record (phase SENDING, with the tokens' ETags) in
   one transaction, conditional on the ETag from R3: if someone else committed since, the
   claim is lost - withdraw the pending tokens and go back to R3;
R7. complete the record (``dispatch``) and acknowledge the signal (the host settles the queue
   message: ``bus.hosting.settlement``).

R3, R4, R6 and R7 are this module's: the claim. A single signal is a batch of one;
batching lives only in the storage calls that serve several messages at once.

R3 happens before R4 on purpose: the token is consumed only after a commit, and the
commit changes the slot's ETag, so a copy that saw the token live either commits first or fails
its compare-and-swap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial

from bus.envelope import Envelope
from bus.errors import Contention, UnreadableRecord
from bus.observability import Processing, Telemetry
from bus.observability import conventions as sc
from bus.observability.stats import StatsBook
from bus.protocol.copies.payloads import Payloads
from bus.protocol.delivery import (
    Delivery,
    HandlerFailed,
    Handoff,
    Incoming,
    Outcome,
    dropped,
    no_ack,
)
from bus.protocol.outbox.dispatch import Dispatcher
from bus.protocol.outbox.slot import ClaimLost, Outbox, Slot
from bus.protocol.poison.poisoning import Poisoning
from bus.protocol.receive.admission import Admission, Admitted, expired
from bus.protocol.receive.handling import Handling
from bus.protocol.receive.lanes import Lanes
from bus.protocol.receive.slotcache import SlotCache
from bus.protocol.records import OutboxRecord, Phase, RecordKey
from bus.protocol.safeguards import Safeguards
from bus.protocol.tokens.inbox import Inbox, Token, finished
from bus.protocol.tokens.verdict import Verdict, verdict
from bus.storage import StorageError, TableOp

__all__ = ["Contention", "Receiver"]

log = logging.getLogger(__name__)

_MAX_CLAIM_ROUNDS = 20


@dataclass(frozen=True)
class _Claim:
    """A signal past R1-R2, waiting for its turn at its partition's slot."""

    index: int
    decoded: Admitted
    item: Incoming
    processing: Processing
    tries: int = 0


@dataclass(frozen=True)
class _Ready:
    """A claim whose handler ran: what to commit, at which slot."""

    claim: _Claim
    slot: Slot
    operations: list[TableOp]
    record: OutboxRecord


def _one_per_partition(waiting: list[_Claim]) -> tuple[list[_Claim], list[_Claim]]:
    """The first claim of each partition (this round's), and the others (in order)."""
    turn: list[_Claim] = []
    later: list[_Claim] = []
    taken: set[str] = set()
    for claim in waiting:
        if claim.decoded.partition in taken:
            later.append(claim)
        else:
            taken.add(claim.decoded.partition)
            turn.append(claim)
    return turn, later


def _unused_pool(workers: int) -> Executor:
    raise AssertionError("lanes of width 1 run their tasks on the caller's thread")


def _processed(slot: Slot) -> Outcome:
    deferred = slot.record is not None and slot.record.deferred_signal is not None
    return Outcome.DEFERRED if deferred else Outcome.PROCESSED


class Receiver:
    """Receives the signals of one endpoint: admission, the claim, handling, dispatch."""

    def __init__(self, *, admission: Admission[Admitted], handling: Handling, poisoning: Poisoning,
                 inbox: Inbox, outbox: Outbox, payloads: Payloads, dispatcher: Dispatcher,
                 safeguards: Safeguards, slots: SlotCache | None = None,
                 lanes: Lanes | None = None,
                 telemetry: Telemetry | None = None, parent_on_message: bool = False,
                 stats: StatsBook | None = None) -> None:
        """``lanes``: where a round's independent requests run side by side (one after
        another without); ``parent_on_message``: ``Settings.process_span_parent`` is
        ``message``; ``stats``: where each signal's outcome and processing time is
        tallied."""
        self.poisoning = poisoning
        self._stats = stats
        self._telemetry = telemetry or Telemetry()
        self._parent_on_message = parent_on_message
        self._admission = admission
        self._handling = handling
        self._inbox = inbox
        self._outbox = outbox
        self._payloads = payloads
        self._dispatcher = dispatcher
        self._safeguards = safeguards
        self._slots = slots if slots is not None else SlotCache(0)
        self._lanes = lanes if lanes is not None else Lanes(_unused_pool, 1)

    @property
    def endpoint(self) -> str:
        return self._admission.endpoint

    @property
    def slots(self) -> SlotCache:
        """The slots this receiver remembers from its own commits (``Settings.slot_cache_size``)."""
        return self._slots

    def receive(self, batch: Sequence[Incoming], *,
                inline_max: int | None = None) -> list[Delivery | Exception]:
        """Process signals exactly as they sit on the queue (base64 text), one result each:
        its Delivery, or the exception that leaves it to a redelivery - HandlerFailed (the
        handler raised; redeliver after its delay) or a StorageError (outcome unknown). Both
        are safe to retry any number of times. Each signal's ``ack`` is called once its
        outcome is durable. A bundle is its host's to split (``bus.hosting.settlement``).

        A record with more than ``inline_max`` outgoing copies is committed but not
        dispatched: its Delivery's ``handoff`` says which, for an orchestration to finish
        (``bus.hosting.functions``).

        One signal is a batch of one. For a batch, the storage calls that can serve several
        messages at once do: the inbox tokens are read in one request per round, the outgoing
        tokens created, signals sent and incoming tokens consumed in one per destination. The
        claim (R3-R7) goes in rounds: one message per partition each round, so two
        messages of one partition commit one after the other; a message that finds an
        unfinished record, or loses its compare-and-swap, tries again in the next round.
        """
        results: dict[int, Delivery | Exception] = {}
        processing: dict[int, Processing] = {}
        try:
            waiting = self._admit_all(batch, results, processing)
            while waiting:
                waiting = self._claim_round(waiting, results, inline_max)
        finally:
            self._finish_spans(processing, results)
        return [results[i] for i in range(len(batch))]

    def _finish_spans(self, processing: dict[int, Processing],
                      results: dict[int, Delivery | Exception]) -> None:
        """End each signal's process span with its result; a record handed off carries
        the span's context to the orchestration that dispatches it."""
        now = self._admission.now()
        for index, span in processing.items():
            result = results.get(index)
            if isinstance(result, Delivery):
                if result.handoff is not None:
                    results[index] = replace(result, handoff=replace(
                        result.handoff, trace=span.carrier()))
                outcome = result.outcome.value
                span.finish(outcome, None, now)
            else:
                outcome = sc.RETRY if isinstance(result, HandlerFailed) else sc.ERROR
                span.finish(outcome, result, now)
            if self._stats is not None:
                envelope = span.envelope
                due = envelope.not_before or envelope.sent_at if envelope is not None else None
                self._stats.record(
                    outcome, time.perf_counter() - span.started,
                    envelope.message_type if envelope is not None else None,
                    max(0.0, now - due.timestamp())
                    if due is not None and outcome == "processed" else None)

    def flush_stats(self) -> None:
        """Write this endpoint's statistics now (``bus.observability.stats``)."""
        if self._stats is not None:
            self._stats.flush()

    def handle(self, body: str, dequeue_count: int,
               ack: Callable[[], None] = no_ack) -> Outcome:
        """``receive`` for one signal: its outcome, or the exception raised."""
        [result] = self.receive([Incoming(body, dequeue_count, ack)])
        if isinstance(result, Exception):
            raise result
        return result.outcome

    def _admit_all(self, batch: Sequence[Incoming], results: dict[int, Delivery | Exception],
                   processing: dict[int, Processing]) -> list[_Claim]:
        """Steps 1-2 for each signal, each in its process span (started once the signal is
        decoded); returns those that go on to claim their partition."""
        waiting: list[_Claim] = []
        for index, item in enumerate(batch):
            try:
                decoded = self._admission.decode(item)
                with self._telemetry.continued(item.trace):
                    span = processing[index] = self._telemetry.process(
                        self.endpoint, decoded if isinstance(decoded, Envelope) else None,
                        item.dequeue_count, parent_on_message=self._parent_on_message)
                with span.active():
                    step = self._admission.admit(item, decoded)
            except Exception as exc:
                results[index] = exc
                continue
            if isinstance(step, Outcome):
                results[index] = Delivery(step)
            else:
                waiting.append(_Claim(index, step, item, span))
        return waiting

    def _claim_round(self, waiting: list[_Claim], results: dict[int, Delivery | Exception],
                     inline_max: int | None) -> list[_Claim]:
        """Steps 3-7 for one message per partition; returns the claims for the next round:
        those whose partition was taken this round, and those to try again."""
        turn, later = _one_per_partition(waiting)
        again: list[_Claim] = []
        loaded = self._load_slots(turn, results)
        tokens = self._read_tokens(loaded, results)
        ready: list[_Ready] = []
        for claim, slot in loaded:
            if claim.index in results:
                continue  # the token read failed
            try:
                with claim.processing.active():  # the handler's spans and logs, and an
                    step = self._check(claim, slot, tokens)  # earlier record's completion
            except ClaimLost:
                self._slots.forget(slot.partition)
                step = None
            except Exception as exc:  # HandlerFailed, StorageError: left to a redelivery
                results[claim.index] = exc
                continue
            if step is None:
                again.append(claim)
            elif isinstance(step, Delivery):
                results[claim.index] = step
            else:
                ready.append(step)
        committed = self._commit_all(self._place(ready, results, inline_max), results, again)
        self._complete_all(committed, results, again, inline_max)
        return later + self._another_round(again, results)

    def _another_round(self, again: list[_Claim],
                       results: dict[int, Delivery | Exception]) -> list[_Claim]:
        """The claims to try again, up to ``_MAX_CLAIM_ROUNDS`` tries each."""
        retried: list[_Claim] = []
        for claim in again:
            if claim.tries + 1 >= _MAX_CLAIM_ROUNDS:
                results[claim.index] = Contention(
                    f"partition {claim.decoded.partition!r} of {self.endpoint!r} kept changing")
            else:
                retried.append(replace(claim, tries=claim.tries + 1))
        return retried

    def _load_slots(self, turn: list[_Claim], results: dict[int, Delivery | Exception],
                    ) -> list[tuple[_Claim, Slot]]:
        """R3: each claim's slot (remembered, or read with its declared rows), side by
        side."""
        loaded: list[tuple[_Claim, Slot]] = []
        found = self._lanes.run([partial(self._load_slot, claim) for claim in turn])
        for claim, slot in zip(turn, found, strict=True):
            if isinstance(slot, Slot):
                loaded.append((claim, slot))
            else:
                results[claim.index] = slot
        return loaded

    def _load_slot(self, claim: _Claim) -> Slot | Delivery | Exception:
        """One claim's R3: its slot, or what became of a claim whose slot cannot be read."""
        try:
            with claim.processing.active():
                return self._slot(claim.decoded)
        except UnreadableRecord as exc:
            with claim.processing.active():
                return self._unreadable(claim, exc)
        except Exception as exc:
            return exc

    def _unreadable(self, claim: _Claim, problem: UnreadableRecord) -> Delivery | Exception:
        """Poison a message whose partition's slot cannot be read (replayable once it can)."""
        item = claim.item
        try:
            return Delivery(self.poisoning.bad(item.body, claim.decoded.envelope, str(problem),
                                               item.dequeue_count, item.ack))
        except Exception as exc:
            return exc

    def _read_tokens(self, loaded: list[tuple[_Claim, Slot]],
                     results: dict[int, Delivery | Exception]) -> dict[str, Token]:
        """R4's read, with R3's: every claim's own token and each slot record's
        incoming token (to tell whether it is finished), in one request per token shard
        (side by side)."""
        keys = [key for claim, slot in loaded for key in self._token_keys(claim.decoded, slot)]
        if not keys:
            return {}
        try:
            return self._inbox.read_many(self.endpoint, keys, side_by_side=self._lanes.run)
        except StorageError as exc:
            for claim, _ in loaded:
                results[claim.index] = exc
            return {}

    def _check(self, claim: _Claim, slot: Slot,
               tokens: dict[str, Token]) -> _Ready | Delivery | None:
        """Steps 3-5 for one claim: None to try again (an unfinished record was in the slot,
        now completed), the Delivery when the copy goes no further, else what to commit."""
        d, item = claim.decoded, claim.item
        if self._safeguards.complete_unfinished and self._unfinished(slot, tokens):
            if not slot.cached:
                self._dispatcher.complete(slot, committed_by_me=False)
            self._slots.forget(slot.partition)  # read it, and its record, afresh
            return None
        token = tokens.get(d.envelope.attempt_id)
        outcome = self._check_token(d, token)
        if outcome is not None:
            item.ack()
            return Delivery(outcome)
        expiry = expired(d.envelope, self._admission.now())
        if expiry is not None:  # not committed: R3 completed any record of it, consuming it
            if self._slot_moved(slot):  # unless a copy committed it since R3 read the slot
                self._slots.forget(slot.partition)
                return None
            return Delivery(self.poisoning.expired(item.body, d.envelope, expiry,
                                                   item.dequeue_count, item.ack))
        prepared = self._handling.run(d, slot, item, token)
        if prepared is None:
            return Delivery(Outcome.POISONED)
        return _Ready(claim, slot, *prepared)

    def _place(self, ready: list[_Ready], results: dict[int, Delivery | Exception],
               inline_max: int | None) -> list[_Ready]:
        """Steps 2-3 of dispatch before the commit: every outgoing token of the round created
        pending, one request per destination (``Dispatcher.place_ahead``) - not for a record
        left to an orchestration. On an unknown outcome the messages that send anything are
        redelivered (their handlers run again, with fresh ids)."""
        placing = [r for r in ready if r.record.outgoing and self._inline(r.record, inline_max)]
        if not placing:
            return ready
        try:
            placed = self._dispatcher.place_ahead(
                [(r.slot.partition, r.record) for r in placing])
        except Exception as exc:
            failed = {r.claim.index for r in placing}
            for index in failed:
                results[index] = exc
            return [r for r in ready if r.claim.index not in failed]
        records = {r.claim.index: record for r, record in zip(placing, placed, strict=True)}
        return [replace(r, record=records.get(r.claim.index, r.record)) for r in ready]

    def _commit_all(self, ready: list[_Ready], results: dict[int, Delivery | Exception],
                    again: list[_Claim]) -> list[tuple[_Ready, Slot]]:
        """R6 for each message of the round, side by side (each at its own partition's slot);
        a lost claim tries again."""
        committed: list[tuple[_Ready, Slot]] = []
        done = self._lanes.run([partial(self._commit_one, r) for r in ready])
        for r, slot in zip(ready, done, strict=True):
            if isinstance(slot, ClaimLost):
                again.append(r.claim)
            elif isinstance(slot, Exception):
                results[r.claim.index] = slot
            else:
                committed.append((r, slot))
        return committed

    def _commit_one(self, r: _Ready) -> Slot | Exception:
        try:
            with r.claim.processing.active():
                return self._commit(r.slot, r.operations, r.record)
        except Exception as exc:  # ClaimLost among them
            return exc

    def _complete_all(self, committed: list[tuple[_Ready, Slot]],
                      results: dict[int, Delivery | Exception], again: list[_Claim],
                      inline_max: int | None) -> None:
        """R7: the round's records completed together (``Dispatcher.complete_many``) -
        or handed off - and their signals acknowledged."""
        inline: list[tuple[_Ready, Slot]] = []
        handed: list[_Ready] = []
        for r, slot in committed:
            handoff = self._handoff(r.claim.decoded, slot, inline_max)
            if handoff is None:
                inline.append((r, slot))
            else:
                handed.append(r)
                results[r.claim.index] = Delivery(_processed(slot), handoff)
        self._lanes.run([r.claim.item.ack for r in handed])
        # The sends are bundled across the round's records: under the first one's span,
        # linked to every copy's create span.
        first = inline[0][0].claim.processing.active() if inline else nullcontext()
        with first:
            problems = self._dispatcher.complete_many([slot for _, slot in inline],
                                                      committed_by_me=True)
        acks: list[Callable[[], None]] = []
        for (r, slot), problem in zip(inline, problems, strict=True):
            if problem is None:
                self._remember(slot, r.slot, r.operations)
                acks.append(r.claim.item.ack)
                results[r.claim.index] = Delivery(_processed(slot))
            elif isinstance(problem, ClaimLost):
                self._slots.forget(slot.partition)
                again.append(r.claim)  # someone else moved the slot on: look again
            else:
                results[r.claim.index] = problem  # unknown: the redelivery finishes it
        self._lanes.run(acks)  # each outcome is durable: the acknowledgements side by side

    @staticmethod
    def _token_keys(d: Admitted, slot: Slot) -> list[str]:
        """The copy's token, and the slot record's (to tell whether it is finished) - not for
        a remembered slot: its record is this process's own, remembered once finished, and
        if the slot moved on since, the commit's compare-and-swap fails anyway."""
        keys = [d.envelope.attempt_id]
        if slot.record is not None and not slot.cached:
            keys.append(slot.record.attempt_id)
        return keys

    # -- the claim's helpers --------------------------------------------------------------
    def _handoff(self, d: Admitted, slot: Slot, inline_max: int | None) -> Handoff | None:
        assert slot.record is not None
        if self._inline(slot.record, inline_max):
            return None
        record = slot.record
        return Handoff(self.endpoint, RecordKey(d.partition, record.message_id,
                                                record.attempt_id, record.generation),
                       len(record.outgoing))

    @staticmethod
    def _inline(record: OutboxRecord, inline_max: int | None) -> bool:
        """Whether the receiver sends the record's copies itself (else an orchestration)."""
        return inline_max is None or len(record.outgoing) <= inline_max

    def _unfinished(self, slot: Slot, tokens: dict[str, Token]) -> bool:
        """Whether the slot holds a record whose work is not done (read with its token)."""
        return slot.record is not None and not finished(
            slot.record, tokens.get(slot.record.attempt_id),
            poisoned_ends=not self._safeguards.apply_poisoned_deferral)

    def _slot_moved(self, slot: Slot) -> bool:
        """Whether the partition's slot changed since ``slot`` was read (or remembered): a
        commit landed meanwhile - perhaps of this very message, by another copy of it."""
        if not self._safeguards.recheck_before_expiry:
            return False  # the "expire-on-stale-slot" break
        return self._outbox.load(slot.partition).etag != slot.etag

    def _check_token(self, d: Admitted, token: Token | None) -> Outcome | None:
        """None when the copy may be processed; otherwise why not."""
        if not self._safeguards.token_check:
            return None  # the "skip-token-check" break
        found = verdict(token)
        if (found is Verdict.PROCESS and token is not None and token.orphan
                and not self._safeguards.process_presumed_orphans):
            found = Verdict.POISONED  # the "drop-presumed-orphans" break
        if found is Verdict.PROCESS:
            return None
        if found.payload_is_garbage and d.envelope.payload_ref is not None:
            self._payloads.delete(d.envelope.payload_ref)
        log.debug("%s copy of %s attempt %s at %s", found.value, d.envelope.message_id,
                  d.envelope.attempt_id, self.endpoint)
        return dropped(found)

    def _commit(self, slot: Slot, operations: list[TableOp], record: OutboxRecord) -> Slot:
        """R6; a lost claim withdraws the tokens created for it (none will be signalled).

        The partition leaves the slot cache first: whatever this commit's outcome, the slot
        is remembered again only once the record is complete (``_remember``)."""
        self._slots.forget(slot.partition)
        if not self._safeguards.release_after_commit:  # the "release-before-commit" break
            self._dispatcher.release_requested(record)
        try:
            return self._outbox.commit(slot, operations, record,
                                       cas=self._safeguards.claim_cas)
        except ClaimLost:
            self._slots.lost(slot)
            self._dispatcher.withdraw(record)
            raise

    def _slot(self, d: Admitted) -> Slot:
        """R3: the partition's slot (and declared rows) as this process's last commit of
        it left them, if it remembers that commit (``slotcache``), else as read now."""
        rows = self._outbox.claimed_rows(d.claimed)
        if not self._safeguards.snapshot_claim and rows:  # the "split-claim-read" break
            earlier = self._outbox.load(d.partition, rows)  # the rows as they were then,
            return replace(self._outbox.load(d.partition), rows=earlier.rows)  # a later slot
        return self._slots.lookup(d.partition, rows) or self._outbox.load(d.partition, rows)

    def _remember(self, committed: Slot, claimed: Slot, operations: list[TableOp]) -> None:
        """Keep a completed commit's slot for the partition's next claim: only a record in
        phase SENDING (or with nothing to send), whose slot completing did not rewrite."""
        record = committed.record
        if record is not None and (record.phase is Phase.SENDING or not record.outgoing):
            self._slots.remember(committed, claimed, operations)
