"""Admission: R1-R2 of receiving a signal (``bus.protocol.steps``), before its partition is
claimed - for every reader of an endpoint's queue, the receiver and a Spark read alike.

R1. ``authenticate``: decode the envelope and check its signature (``sealing``: before anything
   reads or writes on the copy's behalf; a copy that fails is poisoned with the reason, its
   token untouched); route it (``Routing``: addressed here, a content type and message type
   this reader takes; anything else is poisoned with the reason);
R2. ``screen``: a copy whose time-to-live ended (``expires_at`` past, by this reader's clock)
   is poisoned as expired, its token poisoned - unless its token says it is a duplicate
   (``Poisoning.expired``) - by a reader that claims no partition (a Spark read); the
   receiver checks it once it has claimed the partition (``receiver``: an unfinished record of
   the message is completed first, so a message whose handler ran is never called expired),
   and here only when the payload is gone with it. A scheduled copy that arrived early goes
   back on the queue with its remaining delay; otherwise fetch the payload (confined to the
   bus's container; claim check; checked against the signed digest, decrypted) and let the
   routing decode it: for an endpoint, validate the message against the route's contract and
   map it to its state partition and the state rows its route reads (``EndpointRouting``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Generic, Protocol, TypeVar

from bus.context import check_key
from bus.endpoint import Endpoint, Route
from bus.envelope import BadSignal, Envelope, decode_signal
from bus.errors import PayloadError, StateError
from bus.messages import Message, received_as
from bus.naming import RESERVED_PARTITION_PREFIX, RESERVED_PREFIX
from bus.protocol.copies.courier import due_in
from bus.protocol.copies.payloads import Payloads
from bus.protocol.copies.sealing import Sealer, Tampered
from bus.protocol.delivery import Incoming, Outcome, dropped
from bus.protocol.poison.poisoning import Poisoning
from bus.protocol.safeguards import Safeguards
from bus.protocol.sessions.order import check_session, session_row_key, stream_of_another
from bus.protocol.tokens.inbox import Inbox
from bus.protocol.tokens.verdict import Verdict, verdict
from bus.serialization import Serializer
from bus.storage import Queues
from bus.storage.limits import StorageLimits

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class Routing(Protocol[T_co]):
    """What a reader of an endpoint's queue takes: which copies (``refusal``) and what it
    makes of an admitted copy's payload (``decode``)."""

    def refusal(self, envelope: Envelope) -> str | None:
        """Why this reader does not take the copy (it is poisoned with that reason), or
        None."""
        ...

    def decode(self, envelope: Envelope, payload: bytes) -> T_co:
        """The admitted copy, its payload opened (verified and decrypted).

        Raises:
            BadSignal: the payload is not what this reader takes (the copy is poisoned).
        """
        ...


@dataclass(frozen=True)
class Admitted:
    """A signal ready to claim its partition: its message decoded and routed."""

    envelope: Envelope
    route: Route
    message: Message
    partition: str
    reads: tuple[str, ...] = ()  # state rows to fetch with the claim (Route.reads)
    session: str | None = None  # the message's session key (Route.session)

    @property
    def claimed(self) -> tuple[str, ...]:
        """The rows the claim reads with the slot: the session row first, then ``reads``."""
        if self.session is None:
            return self.reads
        return (session_row_key(self.session), *self.reads)


class Admission(Generic[T]):
    """Admits the signals of one endpoint's queue, as ``routing`` takes them."""

    def __init__(self, *, endpoint: str, routing: Routing[T], inbox: Inbox, payloads: Payloads,
                 poisoning: Poisoning, queues: Queues, queue: str,
                 clock: Callable[[], float], safeguards: Safeguards,
                 sealer: Sealer | None = None, expire_early: bool = True) -> None:
        """``expire_early``: poison an expired copy before its payload is read (a reader
        that claims no partition); False leaves it to the caller after its claim."""
        self._expire_early = expire_early
        self._endpoint = endpoint
        self._routing = routing
        self._inbox = inbox
        self._payloads = payloads
        self._poisoning = poisoning
        self._queues = queues
        self._queue = queue
        self._clock = clock
        self._safeguards = safeguards
        self._sealer = sealer or Sealer()

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def now(self) -> float:
        return self._clock()

    @staticmethod
    def decode(item: Incoming) -> Envelope | BadSignal:
        """The signal's envelope, or why it has none (``admit`` poisons it)."""
        try:
            return decode_signal(item.body)
        except BadSignal as exc:
            return exc

    def admit(self, item: Incoming, decoded: Envelope | BadSignal | None = None,
              ) -> T | Outcome:
        """The admitted signal, or its outcome when it goes no further (acknowledged).
        ``decoded``: what ``decode`` made of it, when the caller has it already."""
        envelope = self.authenticate(item, self.decode(item) if decoded is None else decoded)
        if isinstance(envelope, Outcome):
            return envelope
        return self.screen(item, envelope)

    def authenticate(self, item: Incoming, decoded: Envelope | BadSignal) -> Envelope | Outcome:
        """R1: the copy's envelope, signed as its source's key requires and routed to this
        reader, or its outcome (poisoned, acknowledged)."""
        if isinstance(decoded, BadSignal):
            return self._poisoning.bad(item.body, None, str(decoded), item.dequeue_count,
                                       item.ack)
        forged = self._sealer.check(decoded)
        if forged is not None:
            return self._poisoning.unverified(item.body, decoded, forged, item.dequeue_count,
                                              item.ack)
        foreign = stream_of_another(decoded)
        if foreign is not None:
            return self._poisoning.foreign(item.body, decoded, foreign, item.dequeue_count,
                                           item.ack)
        problem = self._routing.refusal(decoded)
        if problem is not None:
            return self._poisoning.bad(item.body, decoded, problem, item.dequeue_count,
                                       item.ack)
        return decoded

    def screen(self, item: Incoming, envelope: Envelope) -> T | Outcome:
        """R2, for an authenticated copy: alive, due, its payload confined, present and
        opened, then decoded by the routing - or its outcome (acknowledged)."""
        expiry = expired(envelope, self._clock())
        if expiry is not None and self._expire_early:  # not handled: its payload is not read
            return self._poisoning.expired(item.body, envelope, expiry, item.dequeue_count,
                                           item.ack)
        if due_in(envelope, self._clock(), self._queues.limits.longest_delay) > 0:
            return self._not_yet(envelope, item)
        if not self._safeguards.ack_after_commit:
            item.ack()  # the "ack-before-commit" break: a crash from here on loses the message
        if not self._payloads.confined(envelope, self.endpoint):  # not signed: token untouched
            return self._poisoning.foreign(item.body, envelope,
                                           self._payloads.outside(envelope, self.endpoint),
                                           item.dequeue_count, item.ack)
        try:
            payload = self._payloads.of(envelope)
        except PayloadError as exc:  # a blob over the limit: not read
            return self._poisoning.bad(item.body, envelope, str(exc), item.dequeue_count,
                                       item.ack)
        if payload is None:
            if expiry is not None:  # gone with the payload a committed handler would have read
                return self._poisoning.expired(item.body, envelope, expiry, item.dequeue_count,
                                               item.ack)
            return self._payload_missing(envelope, item)
        try:
            return self._routing.decode(envelope, self._sealer.open(envelope, payload))
        except Tampered as exc:  # not what was signed: the token is left alone
            return self._poisoning.unverified(item.body, envelope, str(exc),
                                              item.dequeue_count, item.ack)
        except BadSignal as exc:
            return self._poisoning.bad(item.body, envelope, str(exc), item.dequeue_count,
                                       item.ack)

    def _not_yet(self, envelope: Envelope, item: Incoming) -> Outcome:
        """A scheduled copy that arrived early (its delay was longer than a queue allows):
        put the same signal back with the remaining delay, then drop this copy. The token
        is untouched, so whichever copy arrives when due is processed once."""
        found = verdict(self._inbox.read(self.endpoint, envelope.attempt_id))
        if found is not Verdict.PROCESS:
            item.ack()  # consumed, fenced, poisoned or deferred: nothing to wait for
            return dropped(found)
        self._queues.send(self._queue, item.body,
                          delay=due_in(envelope, self._clock(), self._queues.limits.longest_delay))
        item.ack()
        return Outcome.SCHEDULED

    def _payload_missing(self, envelope: Envelope, item: Incoming) -> Outcome:
        """A claim-check blob that is gone: garbage after the message was processed (a
        duplicate), else the signal cannot be processed."""
        found = verdict(self._inbox.read(self.endpoint, envelope.attempt_id))
        if found is Verdict.PROCESS:
            assert envelope.payload_ref is not None
            return self._poisoning.bad(
                item.body, envelope, f"payload blob {envelope.payload_ref.blob} is missing",
                item.dequeue_count, item.ack)
        item.ack()
        return dropped(found)



def misaddressed(envelope: Envelope, endpoint: str) -> str | None:
    """Why a copy is not this endpoint's to take (its token is another endpoint's), or None."""
    if envelope.destination != endpoint:
        return f"signal addressed to {envelope.destination!r} arrived at {endpoint!r}"
    return None


def unreadable(envelope: Envelope, serializer: Serializer) -> str | None:
    """Why ``serializer`` cannot read the copy's payload (its content type), or None."""
    if envelope.content_type != serializer.content_type:
        return (f"content type {envelope.content_type!r} is not supported here "
                f"(expected {serializer.content_type!r})")
    return None


class EndpointRouting:
    """An endpoint's routing: copies addressed to it, in its serializer's content type, of a
    message type it handles; decoded into its route's contract, partition and reads."""

    def __init__(self, endpoint: Endpoint, serializer: Serializer,
                 limits: StorageLimits, *, refuse_reserved: bool = True) -> None:
        self._endpoint = endpoint
        self._serializer = serializer
        self._limits = limits
        self._refuse_reserved = refuse_reserved  # off only for the "admit-reserved-keys" break

    def refusal(self, envelope: Envelope) -> str | None:
        name = self._endpoint.name
        problem = misaddressed(envelope, name) or unreadable(envelope, self._serializer)
        if problem is not None:
            return problem
        if self._endpoint.route(envelope.message_type) is None:
            known = ", ".join(sorted(self._endpoint.routes)) or "nothing"
            return (f"unknown message type {envelope.message_type!r} for endpoint {name!r} "
                    f"(it handles {known})")
        return None

    def decode(self, envelope: Envelope, payload: bytes) -> Admitted:
        route = self._endpoint.route(envelope.message_type)
        assert route is not None  # refusal() saw to it
        try:
            with received_as(route.contract, envelope.message_type):
                message = self._serializer.loads(payload, route.contract)
        except PayloadError as exc:
            raise BadSignal(str(exc)) from exc
        try:
            partition = check_key("partition key", route.partition(message), self._limits)
        except StateError as exc:
            raise BadSignal(str(exc)) from exc
        except Exception as exc:
            raise BadSignal(f"the partition function raised {exc!r}") from exc
        if self._refuse_reserved and partition.startswith(RESERVED_PARTITION_PREFIX):
            raise BadSignal(f"partition key {partition[:80]!r} is reserved: keys starting with "
                            f"{RESERVED_PARTITION_PREFIX!r} name the bus's own partitions")
        return Admitted(envelope, route, message, partition,
                        _reads(route, message, self._limits),
                        _session(route, message, envelope, self._limits))


def _session(route: Route, message: Message, envelope: Envelope,
             limits: StorageLimits) -> str | None:
    """The message's session key by the route (checked like a key), or None when the route
    has no sessions; a copy numbered for another session than the route's is refused."""
    if route.session is None:
        return None
    try:
        session = check_session(route.session(message), limits)
    except StateError as exc:
        raise BadSignal(str(exc)) from exc
    except Exception as exc:
        raise BadSignal(f"the session function raised {exc!r}") from exc
    if envelope.session is not None and envelope.session != session:
        raise BadSignal(f"the copy was numbered for session {envelope.session!r}, but this "
                        f"endpoint's handler puts it in session {session!r}")
    return session


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def expired(envelope: Envelope, now: float) -> str | None:
    """Why the copy is not handled any more - its time-to-live ended by ``now`` (the
    receiver's clock, epoch seconds) - or None while it lives (or has no ``expires_at``). A
    time without a zone is taken as UTC, as in the signature's canonical form."""
    ends = envelope.expires_at
    if ends is None:
        return None
    if ends.tzinfo is None:
        ends = ends.replace(tzinfo=timezone.utc)
    if (ends - _EPOCH).total_seconds() > now:  # aware arithmetic: no year is out of range
        return None
    return (f"expired: its time-to-live ended at {_utc_text(ends)} (received at "
            f"{_utc_text(datetime.fromtimestamp(now, tz=timezone.utc))})")


def _utc_text(moment: datetime) -> str:
    """``2026-11-22T10:00:00Z``; a time with no UTC form (year 1 at +01:00) as written."""
    try:
        utc = moment.astimezone(timezone.utc).replace(tzinfo=None)
    except (OverflowError, ValueError):
        return moment.isoformat()
    return utc.isoformat(timespec="seconds") + "Z"


def _reads(route: Route, message: Message, limits: StorageLimits) -> tuple[str, ...]:
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
            check_key("state key", key, limits)
        except StateError as exc:
            raise BadSignal(str(exc)) from exc
    return keys
