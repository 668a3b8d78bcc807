"""Deferral: a handler sets its message aside; it is fetched by id and released later.

    @orders.handles(Ship, partition=lambda m: m.order_id)
    def ship(message: Ship, ctx: Context) -> None:
        if not (ctx.state.get("paid") or {}).get("yes"):
            ctx.state.put("waiting", {"ship": ctx.message_id})   # commits with the deferral
            ctx.defer()
            return
        ...

    @orders.handles(PaymentReceived, partition=lambda m: m.order_id)
    def paid(message: PaymentReceived, ctx: Context) -> None:
        ctx.state.put("paid", {"yes": True})
        waiting = ctx.state.get("waiting")
        if waiting:
            ctx.release_deferred(str(waiting["ship"]))            # once this commits

How it stays exactly-once:

1. ``ctx.defer()`` commits like any handler call (state changes, sends), with an outbox record
   that carries the message's signal and its token's *generation*. Finishing that record sets
   the token aside - state ``deferred``, signal kept on the row, an index row by message id, in
   one transaction - instead of consuming it. Copies that arrive meanwhile are duplicates.
2. A release (``Bus.deferred(endpoint).release(id)``, or ``ctx.release_deferred`` which runs
   after the releasing handler's commit) turns the token live again with the next generation
   (compare-and-swap) and sends the kept signal. The old record now belongs to an older
   generation, so nobody mistakes it for unfinished work; the message is processed once, by
   its handler, in its own partition - which may defer it again.
3. Releases are idempotent: a repeated release finds the token live (and sends the signal
   again, which deduplicates) or gone (processed: nothing to do). A handler's release request
   names the deferral it saw (the token's generation when the handler ran, ``seen``), so a
   completer that repeats the request after the message was released and deferred again does
   not release the later deferral.

A deferral has no expiry of its own, and a deferred message's claim-check payload is kept while
it waits. A message sent with a time-to-live (``expires_at``) keeps it while deferred: released
after it ended, it is poisoned as expired on arrival (``bus.protocol.receive.admission``).
"""

from __future__ import annotations

from dataclasses import dataclass

from bus.audit import Audit
from bus.envelope import Envelope, decode_signal
from bus.errors import Contention
from bus.protocol.copies.courier import Courier
from bus.protocol.records import OutboxRecord
from bus.protocol.tokens.inbox import Inbox, Token, TokenState, finished

_ROUNDS = 5


@dataclass(frozen=True)
class DeferredMessage:
    """A message set aside at ``endpoint``: what it is, since when, how often deferred."""

    endpoint: str
    message_id: str
    since: float
    deferrals: int
    envelope: Envelope

    @property
    def message_type(self) -> str:
        return self.envelope.message_type


class Deferrals:
    """The deferred messages of one endpoint: list, fetch by id, release."""

    def __init__(self, *, endpoint: str, courier: Courier, audit: Audit | None = None) -> None:
        """``audit``: records each release before it runs (``bus.audit``)."""
        self.endpoint = endpoint
        self._courier = courier
        self._audit = audit

    def list(self) -> list[DeferredMessage]:
        """Every message deferred at the endpoint, oldest first (scans its tokens)."""
        found = [_deferred(t) for t in self._courier.inbox.all(self.endpoint)
                 if t.state is TokenState.DEFERRED]
        return sorted(found, key=lambda d: d.since)

    def get(self, message_id: str) -> DeferredMessage | None:
        """The deferred message with this id (two reads), or None when it is not deferred."""
        token = self._courier.inbox.find(self.endpoint, message_id)
        if token is None or token.state is not TokenState.DEFERRED:
            return None
        return _deferred(token)

    def release(self, message_id: str, *, deferrals: int | None = None) -> bool:
        """Make the message processable again and send its signal. False when it is not
        deferred (never was, processed since, or in the poison queue).

        ``deferrals``: release it only if it is still the deferral you looked at (its
        ``DeferredMessage.deferrals``), not one made since it was released and deferred again.
        """
        if self._audit is not None:
            self._audit("release", self.endpoint, {
                "message_id": message_id,
                **({"deferrals": deferrals} if deferrals is not None else {})})
        return release(self._courier, self.endpoint, message_id, deferrals)


def release(courier: Courier, endpoint: str, message_id: str,
            generation: int | None = None) -> bool:
    """Release a deferred message (idempotent; see the module docstring) - only its deferral
    of ``generation`` when one is named."""
    for _ in range(_ROUNDS):
        token = courier.inbox.find(endpoint, message_id)
        if token is None:
            return False
        if token.state is TokenState.DEFERRED:
            if generation is not None and token.generation != generation:
                return False  # a later deferral: released and deferred again since
            released = courier.inbox.release(token, courier.now())
            if released is None:
                continue  # changed meanwhile: look again
            token = released
        if token.state is TokenState.LIVE and token.generation and token.signal:
            courier.resend(endpoint, token.signal)
            return True
        return False
    raise Contention(f"the token of {message_id} at {endpoint} kept changing")


def seen(inbox: Inbox, endpoint: str, message_id: str) -> int:
    """The generation of the deferral a release request made now is for: the message's token
    as the index finds it (two reads), 0 when it was never deferred."""
    token = inbox.find(endpoint, message_id)
    return token.generation if token is not None else 0


def set_aside(courier: Courier, record: OutboxRecord) -> None:
    """Finish a record whose handler deferred its message: the token becomes ``deferred``
    (unless that happened already, or the message was released since)."""
    assert record.deferred_signal is not None
    for _ in range(_ROUNDS):
        token = courier.inbox.read(record.endpoint, record.attempt_id)
        if finished(record, token):
            return
        assert token is not None
        if courier.inbox.defer(token, record.deferred_signal, courier.now()):
            return
    raise Contention(f"the token of {record.message_id} kept changing")


def _deferred(token: Token) -> DeferredMessage:
    assert token.signal is not None
    return DeferredMessage(token.endpoint, token.message_id, token.since, token.generation,
                           decode_signal(token.signal))
