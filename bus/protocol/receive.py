"""The receiver: processing one signal so that its effect happens exactly once.

For a signal carrying message ``m``, attempt ``a``, for endpoint ``E``:

1. decode the envelope, find the handler (bad input: poison queue, with the reason);
2. fetch the payload (claim check) and map the message to its state partition ``P``;
3. load ``P``'s outbox slot, remembering its ETag, with the state rows the route declares
   (``reads``) in the same request; if it holds an unfinished record (its incoming token
   still exists), complete that first (it may be ours, committed by an earlier delivery) and
   start again;
4. check ``m``'s inbox token ``(E, a)``: gone (or fenced) means a duplicate - acknowledge;
   parked means it is in the poison queue already (read in one request with step 3's token);
5. run the handler against ``P`` (reads come from step 3 or storage, writes are collected),
   then create its outgoing tokens, pending (``Dispatcher.place_ahead``);
6. commit the state changes and the outbox record (phase SENDING, with the tokens' ETags) in
   one transaction, conditional on the ETag from step 3: if someone else committed since, the
   claim is lost - withdraw the pending tokens and go back to step 3;
7. complete the record (see ``dispatch``) and acknowledge the signal.

Step 3 happens before step 4 on purpose: the token is consumed only after a commit, and the
commit changes the slot's ETag, so a copy that saw the token live either commits first or fails
its compare-and-swap.
"""

from __future__ import annotations

import enum
import logging
import random as _random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from bus.addressing import Addressing
from bus.context import Context, PartitionState, StateError, check_key
from bus.endpoint import Endpoint, Route
from bus.envelope import BadSignal, Envelope, decode_signal
from bus.messages import Message
from bus.middleware import HandleNext, Middleware, handling_chain
from bus.protocol.courier import due_in
from bus.protocol.dispatch import Dispatcher
from bus.protocol.inbox import Inbox, Token, finished
from bus.protocol.outbox import RESERVED_PREFIX, ClaimLost, Outbox, Slot
from bus.protocol.payloads import Payloads
from bus.protocol.poison import PoisonQueue
from bus.protocol.records import OutboxRecord, Phase, Release
from bus.protocol.safeguards import Safeguards
from bus.protocol.slotcache import SlotCache
from bus.protocol.verdict import Verdict, verdict
from bus.retry import Reject, RetryAfter, RetryPolicy, backoff
from bus.serialization import PayloadError, Serializer
from bus.storage import Queues, StorageError, TableOp, Tables

log = logging.getLogger(__name__)

_MAX_CLAIM_ROUNDS = 20


class Outcome(str, enum.Enum):
    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    POISONED = "poisoned"
    PARKED = "parked"
    REQUEUED = "requeued"  # hosting only: put back on the queue as a copy (with its count)
    SCHEDULED = "scheduled"  # arrived before its time: put back with the remaining delay
    DEFERRED = "deferred"  # the handler set it aside (Context.defer)


def dropped(found: Verdict) -> Outcome:
    """The outcome of a copy whose verdict is not PROCESS."""
    return Outcome.PARKED if found is Verdict.PARKED else Outcome.DUPLICATE


class HandlerFailed(Exception):
    """The handler raised and the delivery count allows another try: redeliver the signal
    after ``delay`` seconds (the route's retry policy, or what the handler asked for)."""

    def __init__(self, message: str, delay: float = 0.0) -> None:
        super().__init__(message)
        self.delay = delay


class Contention(StorageError):
    """The partition kept changing under us; let the signal be redelivered."""


@dataclass(frozen=True)
class _Decoded:
    envelope: Envelope
    route: Route
    message: Message
    partition: str
    reads: tuple[str, ...] = ()  # state rows to fetch with the claim (Route.reads)


@dataclass(frozen=True)
class Handoff:
    """A committed outbox record left for someone else to dispatch (a Durable orchestration).

    Identifies the record by its slot and incoming message: whoever drives it later checks
    that the slot still holds this message before doing anything.
    """

    endpoint: str
    partition: str
    message_id: str
    copies: int


def _no_ack() -> None:
    return None


@dataclass(frozen=True)
class Incoming:
    """One leased signal of a batch: its body as on the queue, its delivery count, and the
    call that deletes it from the queue."""

    body: str
    dequeue_count: int
    ack: Callable[[], None] = _no_ack


@dataclass(frozen=True)
class _Claim:
    """A signal past steps 1-2, waiting for its turn at its partition's slot."""

    index: int
    decoded: _Decoded
    item: Incoming
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


@dataclass(frozen=True)
class Delivery:
    outcome: Outcome
    handoff: Handoff | None = None
    parts: tuple[Delivery, ...] = ()
    """For a bundle (``bus.protocol.bundles``): each of its signals' delivery, in order; the
    bundle's own ``outcome`` is then PROCESSED (every part reached an outcome)."""

    @property
    def handoffs(self) -> list[Handoff]:
        """Every record left for an orchestration: this delivery's, or its parts'."""
        own = [self.handoff] if self.handoff is not None else []
        return own + [handoff for part in self.parts for handoff in part.handoffs]


def _reads(route: Route, message: Message) -> tuple[str, ...]:
    """The state keys the route's ``reads`` names for ``message`` (checked like state keys)."""
    if route.reads is None:
        return ()
    try:
        keys = tuple(route.reads(message))
    except Exception as exc:
        raise BadSignal(f"the reads function raised {exc!r}") from exc
    for key in keys:
        if not isinstance(key, str) or key.startswith(RESERVED_PREFIX):
            raise BadSignal(f"the reads function named {key!r}: state keys are strings not "
                            f"starting with {RESERVED_PREFIX!r}")
        try:
            check_key("state key", key)
        except StateError as exc:
            raise BadSignal(str(exc)) from exc
    return keys


def _retried_at_once(exc: BaseException) -> bool:
    """Whether a handler attempt that raised ``exc`` gets an immediate retry: a failure of
    the handler's own (not storage, not a lost claim, not a request to wait or to give up),
    and never a BaseException - tenacity catches those too, and a KeyboardInterrupt or a
    SystemExit must stop the worker, not run the handler again."""
    return isinstance(exc, Exception) and not isinstance(
        exc, (StorageError, ClaimLost, RetryAfter, Reject))


def _processed(slot: Slot) -> Outcome:
    deferred = slot.record is not None and slot.record.deferred_signal is not None
    return Outcome.DEFERRED if deferred else Outcome.PROCESSED


class Receiver:
    def __init__(self, *, endpoint: Endpoint, inbox: Inbox, outbox: Outbox, payloads: Payloads,
                 dispatcher: Dispatcher, poison: PoisonQueue, addressing: Addressing,
                 tables: Tables, state_table: str, serializer: Serializer,
                 clock: Callable[[], float], max_delivery_count: int,
                 safeguards: Safeguards, queues: Queues, queue: str,
                 sleep: Callable[[float], None] = time.sleep,
                 random: Callable[[], float] = _random.random,
                 slots: SlotCache | None = None,
                 middleware: Sequence[Middleware] = ()) -> None:
        self._slots = slots if slots is not None else SlotCache(0)
        self._middleware = tuple(middleware)
        self._chains: dict[str, HandleNext] = {
            message_type: handling_chain(self._middleware, route.handler)
            for message_type, route in endpoint.routes.items()}
        self._queues = queues
        self._queue = queue
        self._sleep = sleep
        self._random = random
        self._endpoint = endpoint
        self._inbox = inbox
        self._outbox = outbox
        self._payloads = payloads
        self._dispatcher = dispatcher
        self._poison = poison
        self._addressing = addressing
        self._state_table = state_table
        self._serializer = serializer
        self._clock = clock
        self._max_delivery_count = max_delivery_count
        self._safeguards = safeguards
        self._tables = tables

    @property
    def endpoint(self) -> str:
        return self._endpoint.name

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
        claim (steps 3-7) goes in rounds: one message per partition each round, so two
        messages of one partition commit one after the other; a message that finds an
        unfinished record, or loses its compare-and-swap, tries again in the next round.
        """
        results: dict[int, Delivery | Exception] = {}
        waiting = self._admit_all(batch, results)
        while waiting:
            waiting = self._claim_round(waiting, results, inline_max)
        return [results[i] for i in range(len(batch))]

    def handle(self, body: str, dequeue_count: int,
               ack: Callable[[], None] = _no_ack) -> Outcome:
        """``receive`` for one signal: its outcome, or the exception raised."""
        [result] = self.receive([Incoming(body, dequeue_count, ack)])
        if isinstance(result, Exception):
            raise result
        return result.outcome

    def _admit_all(self, batch: Sequence[Incoming],
                   results: dict[int, Delivery | Exception]) -> list[_Claim]:
        """Steps 1-2 for each signal; returns those that go on to claim their partition."""
        waiting: list[_Claim] = []
        for index, item in enumerate(batch):
            try:
                step = self._admit_body(item.body, item.dequeue_count, item.ack)
            except Exception as exc:
                results[index] = exc
                continue
            if isinstance(step, Outcome):
                results[index] = Delivery(step)
            else:
                waiting.append(_Claim(index, step, item))
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
                step = self._check(claim, slot, tokens)
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
        """Step 3: each claim's slot (remembered, or read with its declared rows)."""
        loaded: list[tuple[_Claim, Slot]] = []
        for claim in turn:
            try:
                loaded.append((claim, self._slot(claim.decoded)))
            except Exception as exc:
                results[claim.index] = exc
        return loaded

    def _read_tokens(self, loaded: list[tuple[_Claim, Slot]],
                     results: dict[int, Delivery | Exception]) -> dict[str, Token]:
        """Step 4's read, with step 3's: every claim's own token and each slot record's
        incoming token (to tell whether it is finished), in one request."""
        keys = [key for claim, slot in loaded for key in self._token_keys(claim.decoded, slot)]
        if not keys:
            return {}
        try:
            return self._inbox.read_many(self.endpoint, keys)
        except StorageError as exc:
            for claim, _ in loaded:
                results[claim.index] = exc
            return {}

    def _check(self, claim: _Claim, slot: Slot,
               tokens: dict[str, Token]) -> _Ready | Delivery | None:
        """Steps 3-5 for one claim: None to try again (an unfinished record was in the slot,
        now completed), the Delivery when the copy goes no further, else what to commit."""
        d, item = claim.decoded, claim.item
        if self._unfinished(slot, tokens):
            if not slot.cached:
                self._dispatcher.complete(slot, committed_by_me=False)
            self._slots.forget(slot.partition)  # read it, and its record, afresh
            return None
        token = tokens.get(d.envelope.attempt_id)
        outcome = self._check_token(d, token)
        if outcome is not None:
            item.ack()
            return Delivery(outcome)
        prepared = self._run_handler(d, slot, item.body, item.dequeue_count, item.ack,
                                     token=token)
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
        """Step 6 for each message of the round; a lost claim tries again."""
        committed: list[tuple[_Ready, Slot]] = []
        for r in ready:
            try:
                committed.append((r, self._commit(r.slot, r.operations, r.record)))
            except ClaimLost:
                again.append(r.claim)
            except Exception as exc:
                results[r.claim.index] = exc
        return committed

    def _complete_all(self, committed: list[tuple[_Ready, Slot]],
                      results: dict[int, Delivery | Exception], again: list[_Claim],
                      inline_max: int | None) -> None:
        """Step 7: the round's records completed together (``Dispatcher.complete_many``) -
        or handed off - and their signals acknowledged."""
        inline: list[tuple[_Ready, Slot]] = []
        for r, slot in committed:
            handoff = self._handoff(r.claim.decoded, slot, inline_max)
            if handoff is None:
                inline.append((r, slot))
            else:
                r.claim.item.ack()
                results[r.claim.index] = Delivery(_processed(slot), handoff)
        problems = self._dispatcher.complete_many([slot for _, slot in inline],
                                                  committed_by_me=True)
        for (r, slot), problem in zip(inline, problems, strict=True):
            if problem is None:
                self._remember(slot, r.slot, r.operations)
                r.claim.item.ack()
                results[r.claim.index] = Delivery(_processed(slot))
            elif isinstance(problem, ClaimLost):
                self._slots.forget(slot.partition)
                again.append(r.claim)  # someone else moved the slot on: look again
            else:
                results[r.claim.index] = problem  # unknown: the redelivery finishes it

    @staticmethod
    def _token_keys(d: _Decoded, slot: Slot) -> list[str]:
        """The copy's token, and the slot record's (to tell whether it is finished) - not for
        a remembered slot: its record is this process's own, remembered once finished, and
        if the slot moved on since, the commit's compare-and-swap fails anyway."""
        keys = [d.envelope.attempt_id]
        if slot.record is not None and not slot.cached:
            keys.append(slot.record.attempt_id)
        return keys

    # -- steps 1-2 ------------------------------------------------------------------------
    def _admit_body(self, body: str, dequeue_count: int,
                    ack: Callable[[], None]) -> _Decoded | Outcome:
        try:
            envelope = decode_signal(body)
        except BadSignal as exc:
            return self._poison_bad(body, None, str(exc), dequeue_count, ack)
        return self._admit(envelope, body, dequeue_count, ack)

    def _admit(self, envelope: Envelope, body: str, dequeue_count: int,
               ack: Callable[[], None]) -> _Decoded | Outcome:
        """Steps 1-2: the decoded message, or the outcome when it goes no further."""
        problem, route = self._route(envelope)
        if route is None:
            return self._poison_bad(body, envelope, problem, dequeue_count, ack)
        if due_in(envelope, self._clock()) > 0:
            return self._not_yet(envelope, body, ack)
        if not self._safeguards.ack_after_commit:
            ack()  # the "ack-before-commit" break: a crash from here on loses the message
        payload = self._payload(envelope)
        if payload is None:
            found = verdict(self._inbox.read(self.endpoint, envelope.attempt_id))
            if found is Verdict.PROCESS:
                assert envelope.payload_ref is not None
                return self._poison_bad(
                    body, envelope, f"payload blob {envelope.payload_ref.blob} is missing",
                    dequeue_count, ack)
            ack()
            return dropped(found)
        try:
            return self._decode(envelope, route, payload)
        except BadSignal as exc:
            return self._poison_bad(body, envelope, str(exc), dequeue_count, ack)

    def _not_yet(self, envelope: Envelope, body: str, ack: Callable[[], None]) -> Outcome:
        """A scheduled copy that arrived early (its delay was longer than a queue allows):
        put the same signal back with the remaining delay, then drop this copy. The token
        is untouched, so whichever copy arrives when due is processed once."""
        found = verdict(self._inbox.read(self.endpoint, envelope.attempt_id))
        if found is not Verdict.PROCESS:
            ack()  # consumed, fenced, parked or deferred: nothing to wait for
            return dropped(found)
        self._queues.send(self._queue, body, delay=due_in(envelope, self._clock()))
        ack()
        return Outcome.SCHEDULED

    def _route(self, envelope: Envelope) -> tuple[str, Route | None]:
        if envelope.destination != self.endpoint:
            return (f"signal addressed to {envelope.destination!r} arrived at "
                    f"{self.endpoint!r}", None)
        if envelope.content_type != self._serializer.content_type:
            return (f"content type {envelope.content_type!r} is not supported here "
                    f"(expected {self._serializer.content_type!r})", None)
        route = self._endpoint.route(envelope.message_type)
        if route is None:
            known = ", ".join(sorted(self._endpoint.routes)) or "nothing"
            return (f"unknown message type {envelope.message_type!r} for endpoint "
                    f"{self.endpoint!r} (it handles {known})", None)
        return "", route

    def _payload(self, envelope: Envelope) -> bytes | None:
        if envelope.payload_ref is None:
            return envelope.inline_payload()
        return self._payloads.get(envelope.payload_ref)

    def _decode(self, envelope: Envelope, route: Route, payload: bytes) -> _Decoded:
        try:
            message = self._serializer.loads(payload, route.contract)
        except PayloadError as exc:
            raise BadSignal(str(exc)) from exc
        try:
            partition = check_key("partition key", route.partition(message))
        except StateError as exc:
            raise BadSignal(str(exc)) from exc
        except Exception as exc:
            raise BadSignal(f"the partition function raised {exc!r}") from exc
        return _Decoded(envelope, route, message, partition, _reads(route, message))

    # -- steps 3-7 ------------------------------------------------------------------------
    def _handoff(self, d: _Decoded, slot: Slot, inline_max: int | None) -> Handoff | None:
        assert slot.record is not None
        if self._inline(slot.record, inline_max):
            return None
        return Handoff(self.endpoint, d.partition, d.envelope.message_id,
                       len(slot.record.outgoing))

    @staticmethod
    def _inline(record: OutboxRecord, inline_max: int | None) -> bool:
        """Whether the receiver sends the record's copies itself (else an orchestration)."""
        return inline_max is None or len(record.outgoing) <= inline_max

    @staticmethod
    def _unfinished(slot: Slot, tokens: dict[str, Token]) -> bool:
        """Whether the slot holds a record whose work is not done (read with its token)."""
        return slot.record is not None and not finished(
            slot.record, tokens.get(slot.record.attempt_id))

    def _check_token(self, d: _Decoded, token: Token | None) -> Outcome | None:
        """None when the copy may be processed; otherwise why not."""
        if not self._safeguards.token_check:
            return None  # the "skip-token-check" break
        found = verdict(token)
        if found is Verdict.PROCESS:
            return None
        if found.payload_is_garbage and d.envelope.payload_ref is not None:
            self._payloads.delete(d.envelope.payload_ref)
        log.debug("%s copy of %s attempt %s at %s", found.value, d.envelope.message_id,
                  d.envelope.attempt_id, self.endpoint)
        return dropped(found)

    def _run_handler(self, d: _Decoded, slot: Slot, body: str, dequeue_count: int,
                     ack: Callable[[], None], *, token: Token | None,
                     ) -> tuple[list[TableOp], OutboxRecord] | None:
        """Step 5: the state changes and the outbox record to commit, or None when the
        message was poisoned (raises HandlerFailed when it is to be retried)."""
        generation = token.generation if token is not None else 0
        try:
            operations, ctx = self._run(d, slot, dequeue_count, generation)
            record = OutboxRecord(
                endpoint=self.endpoint, message_id=d.envelope.message_id,
                attempt_id=d.envelope.attempt_id, payload_ref=d.envelope.payload_ref,
                outgoing=ctx.outgoing, committed_at=self._clock(),
                deferred_signal=body if ctx.deferred else None, generation=generation,
                releases=tuple(Release(endpoint=e, message_id=m) for e, m in ctx.releases))
            self._outbox.check_size(record)  # too big: the handler's fault, before any token
            return operations, record
        except (StorageError, ClaimLost):
            raise  # infrastructure or a lost race, not the handler's fault
        except Exception as exc:  # the handler's own failure, or what it asked for (too big)
            if dequeue_count < self._max_delivery_count and not isinstance(exc, Reject):
                delay = (exc.seconds if isinstance(exc, RetryAfter)
                         else d.route.retry.delay_after(dequeue_count))
                raise HandlerFailed(f"{d.route.contract.message_type} handler raised "
                                    f"{exc!r}", delay) from exc
            self._poison_failed(body, d.envelope, exc, dequeue_count, ack)
            return None

    def _commit(self, slot: Slot, operations: list[TableOp], record: OutboxRecord) -> Slot:
        """Step 6; a lost claim withdraws the tokens created for it (none will be signalled).

        The partition leaves the slot cache first: whatever this commit's outcome, the slot
        is remembered again only once the record is complete (``_remember``)."""
        self._slots.forget(slot.partition)
        try:
            return self._outbox.commit(slot, operations, record,
                                       cas=self._safeguards.claim_cas)
        except ClaimLost:
            self._slots.lost(slot)
            self._dispatcher.withdraw(record)
            raise

    def _slot(self, d: _Decoded) -> Slot:
        """Step 3: the partition's slot (and declared rows) as this process's last commit of
        it left them, if it remembers that commit (``slotcache``), else as read now."""
        return self._slots.lookup(d.partition, d.reads) or self._outbox.load(d.partition,
                                                                            d.reads)

    def _remember(self, committed: Slot, claimed: Slot, operations: list[TableOp]) -> None:
        """Keep a completed commit's slot for the partition's next claim: only a record in
        phase SENDING (or with nothing to send), whose slot completing did not rewrite."""
        record = committed.record
        if record is not None and (record.phase is Phase.SENDING or not record.outgoing):
            self._slots.remember(committed, claimed, operations)

    def _run(self, d: _Decoded, slot: Slot, dequeue_count: int,
             generation: int) -> tuple[list[TableOp], Context]:
        """Step 5 with the route's immediate retries: every attempt starts from fresh reads
        and an empty outbox, so a failed attempt leaves nothing behind."""
        policy = d.route.retry
        retrying = Retrying(
            stop=stop_after_attempt(policy.immediate),
            wait=self._backoff(policy),
            retry=retry_if_exception(_retried_at_once),
            sleep=self._sleep, reraise=True)
        handle = self._chains[d.envelope.message_type]
        ctx = self._context(d, slot, dequeue_count, generation)
        for attempt in retrying:
            with attempt:
                if self._safeguards.fresh_retry_state:  # off: the "dirty-retry" break
                    ctx = self._context(d, slot, dequeue_count, generation)
                handle(d.message, ctx)
                operations = ctx.state.operations()
        return operations, ctx

    def _context(self, d: _Decoded, slot: Slot, dequeue_count: int,
                 generation: int) -> Context:
        # The rows read with the claim are as of the slot's ETag, which the commit checks.
        state = PartitionState(self._tables, self._state_table, d.partition, slot.rows)
        return Context(self.endpoint, d.envelope, dequeue_count, state, self._addressing, [],
                       _sending=self._middleware, deferrals=generation)

    def _backoff(self, policy: RetryPolicy) -> Callable[[RetryCallState], float]:
        return backoff(policy.backoff_initial, policy.backoff_max, self._random)

    # -- poison ---------------------------------------------------------------------------
    def give_up(self, body: str, deliveries: int, cause: StorageError) -> Outcome:
        """Poison a signal (its body as on the queue) after storage errors on each of its
        ``deliveries`` deliveries, ``cause`` the last: no more are allowed
        (``bus.hosting.settlement``). Same poison queue and token parking as a failing
        handler, so the dead-letter tools list and replay it - unless its token says there
        is nothing to poison: gone (a delivery processed it and the error came after),
        parked (poisoned already), fenced or deferred. Raises a StorageError when poisoning
        fails too.

        A message committed by one of those deliveries whose completion kept failing is
        poisoned as well (its token is still live): the partition's next message completes
        the record and consumes the token, after which the entry reads as stale and a replay
        removes it; a replay before that completes the record itself. Exactly once either way.
        """
        try:
            envelope = decode_signal(body)
        except BadSignal as exc:  # its poisoning met the errors
            return self._poison_bad(body, None, str(exc), deliveries, _no_ack)
        token = self._inbox.read(self.endpoint, envelope.attempt_id)
        found = verdict(token)
        if found is not Verdict.PROCESS:
            return dropped(found)
        reason = f"storage errors on {deliveries} deliveries (max delivery count)"
        self._poison.put(body, reason=reason, dequeue_count=deliveries, now=self._clock(),
                         envelope=envelope, exception=f"{type(cause).__name__}: {cause}")
        self._park(token)
        log.warning("poisoned %s at %s: %s, the last %s", envelope.message_id, self.endpoint,
                    reason, cause)
        return Outcome.POISONED

    def _poison_bad(self, body: str, envelope: Envelope | None, reason: str,
                    dequeue_count: int, ack: Callable[[], None]) -> Outcome:
        token = None
        if envelope is not None:
            token = self._inbox.read(self.endpoint, envelope.attempt_id)
            found = verdict(token)
            # No token poisons all the same: a foreign or broken signal may never have had one.
            if found not in (Verdict.PROCESS, Verdict.CONSUMED):
                ack()  # parked already, fenced (never really sent) or deferred
                return dropped(found)
        self._poison.put(body, reason=reason, dequeue_count=dequeue_count, now=self._clock(),
                         envelope=envelope)
        self._park(token)
        ack()
        log.warning("poisoned a signal at %s: %s", self.endpoint, reason)
        return Outcome.POISONED

    def _poison_failed(self, body: str, envelope: Envelope, exc: Exception,
                       dequeue_count: int, ack: Callable[[], None]) -> None:
        reason = (f"rejected: {exc}" if isinstance(exc, Reject)
                  else f"handler failed {dequeue_count} times (max delivery count)")
        self._poison.put(body, reason=reason, dequeue_count=dequeue_count, now=self._clock(),
                         envelope=envelope, exception=f"{type(exc).__name__}: {exc}")
        self._park(self._inbox.read(self.endpoint, envelope.attempt_id))
        ack()
        log.warning("poisoned %s at %s: %s", envelope.message_id, self.endpoint, reason)

    def _park(self, token: Token | None) -> None:
        if token is not None and verdict(token) is Verdict.PROCESS:
            self._inbox.park(token, self._clock())
