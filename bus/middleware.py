"""Middleware: your code around every handler call and every send.

    class Audit(Middleware):
        def handle(self, message, ctx, call_next):
            log.info("handling %s", ctx.message_id)
            call_next(message, ctx)          # skip this to drop the message (no effect)

        def send(self, outgoing, call_next):
            outgoing.headers["tenant"] = current_tenant()
            call_next(outgoing)              # skip this to drop the send

    bus = Bus(storage, endpoints, middleware=[Audit()])      # every endpoint and client send
    orders = Endpoint("orders", middleware=[Validate()])     # one endpoint's handlers and sends

One delivery goes through these stages, outermost first (``Bus.pipeline`` lists them)::

    decode -> route -> deduplicate -> claim -> retries -> [bus middleware -> endpoint middleware
    -> handler] -> commit -> dispatch -> acknowledge

and a send through ``[bus middleware -> endpoint middleware] -> outbox`` (from a handler) or
``[bus middleware] -> token + signal`` (from a client). Only the bracketed stages are yours: the
exactly-once steps around them are not in any list you can change, so no middleware can skip
the token check, the claim, the atomic commit or the outbox. A middleware that does not call
``call_next`` short-circuits: the message is then consumed with whatever the attempt wrote
(normally nothing), or the send does not happen. One that raises fails the attempt like a
handler (the retry policy applies; raise ``bus.Reject`` to poison the message at once).

Middleware runs once per handler *attempt* (immediate retries and redeliveries run it again),
so its own side effects (logs, metrics, calls) are at-least-once; only state changes and sends
are exactly-once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bus.messages import Message

if TYPE_CHECKING:
    from bus.context import Context

HandleNext = Callable[[Message, "Context"], None]
SendNext = Callable[["Outgoing"], None]


@dataclass
class Outgoing:
    """One ``send``/``publish`` call on its way through the sending middleware.

    Middleware may change ``message``, ``headers``, ``to``, ``delay`` and ``ttl`` before
    calling the next stage; ``message_id`` and ``source`` are fixed.
    """

    message: Message
    message_id: str
    source: str
    """The sending endpoint, or ``Settings.client_name`` outside a handler."""
    to: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    context: Context | None = None
    """The handler's context when the send comes from a handler."""
    ttl: float | None = None
    """Time-to-live in seconds, counted from when the message is due (None: never expires)."""


class Middleware:
    """Override ``handle``, ``send`` or both; the defaults just call the next stage."""

    def handle(self, message: Message, ctx: Context, call_next: HandleNext) -> None:
        call_next(message, ctx)

    def send(self, outgoing: Outgoing, call_next: SendNext) -> None:
        call_next(outgoing)

    @property
    def name(self) -> str:
        return type(self).__name__


def handling_chain(middleware: Sequence[Middleware], handler: HandleNext) -> HandleNext:
    """``handler`` wrapped in ``middleware`` (the first is outermost)."""
    chain = handler
    for layer in reversed(middleware):
        chain = _bind_handle(layer, chain)
    return chain


def sending_chain(middleware: Sequence[Middleware], terminal: SendNext) -> SendNext:
    """``terminal`` (the outbox, or token + signal) wrapped in ``middleware``."""
    chain = terminal
    for layer in reversed(middleware):
        chain = _bind_send(layer, chain)
    return chain


def _bind_handle(layer: Middleware, call_next: HandleNext) -> HandleNext:
    def run(message: Message, ctx: Context) -> None:
        layer.handle(message, ctx, call_next)

    return run


def _bind_send(layer: Middleware, call_next: SendNext) -> SendNext:
    def run(outgoing: Outgoing) -> None:
        layer.send(outgoing, call_next)

    return run

