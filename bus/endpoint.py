"""Endpoints and their handlers: the part of the API users write against.

    orders = Endpoint("orders")

    @orders.handles(PlaceOrder, partition=lambda m: m.order_id)
    def place_order(message: PlaceOrder, ctx: Context) -> None:
        ctx.state.put("order", {"amount": message.amount})
        ctx.publish(OrderPlaced(order_id=message.order_id))

``partition`` maps a message to the state partition its handler reads and writes; the handler's
state changes and outgoing messages commit atomically within that partition. ``reads``
(optional) names the state rows the handler reads: the receiver fetches them in the same
request as the partition's outbox slot, instead of one request per ``ctx.state.get``.

    @orders.handles(PayOrder, partition=lambda m: m.order_id, reads=lambda m: ["order"])
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from bus.context import Context
from bus.coroutines import completed, is_async
from bus.errors import ConfigurationError
from bus.messages import Command, Event, Message
from bus.middleware import Middleware
from bus.naming import check_endpoint
from bus.retry import DEFAULT_RETRY, RetryPolicy

M = TypeVar("M", bound=Message)
HandlerFn = Callable[[M, Context], "Awaitable[None] | None"]
"""A handler: a plain function, or an ``async def`` one (awaited to its end:
``bus.coroutines``)."""


@dataclass(frozen=True)
class Route:
    contract: type[Message]
    handler: Callable[[Any, Context], None]
    partition: Callable[[Any], str]
    retry: RetryPolicy = DEFAULT_RETRY
    reads: Callable[[Any], Sequence[str]] | None = None
    session: Callable[[Any], str] | None = None


class Endpoint:
    """A named service with one queue, one state table and a handler per message type.

    ``retry``: what happens when its handlers raise (``bus.retry``); a policy given to
    ``handles`` wins for that message type. ``middleware``: runs around this endpoint's
    handlers and their sends, inside the bus's own (``bus.middleware``).
    ``max_queue_depth``: senders are refused (and keep the message in their outbox) while the
    endpoint's queue holds this many messages (``bus.protocol.copies.backpressure``).
    ``reorder_window`` (seconds) and ``skip_gaps``: for handlers with sessions, how long a
    missing message may hold up the ones after it, and what happens then - the session blocks
    and is reported (the default), or with ``skip_gaps`` moves on past the gap, which is
    recorded (``bus.protocol.sessions.order``).
    """

    def __init__(self, name: str, *, retry: RetryPolicy | None = None,
                 middleware: Sequence[Middleware] = (),
                 max_queue_depth: int | None = None,
                 reorder_window: float = 300.0, skip_gaps: bool = False) -> None:
        self.name = check_endpoint(name)
        self.routes: dict[str, Route] = {}
        self._aliases: dict[str, str] = {}  # an earlier message type -> the contract's own
        self.retry = retry or DEFAULT_RETRY
        self.middleware = check_middleware(self.name, middleware)
        self.max_queue_depth = check_depth(self.name, max_queue_depth)
        if isinstance(reorder_window, bool) or not isinstance(reorder_window, (int, float)) \
                or not reorder_window >= 0:
            raise ConfigurationError(
                f"{self.name}: reorder_window must be 0 or more seconds, not {reorder_window!r}")
        self.reorder_window = float(reorder_window)
        self.skip_gaps = bool(skip_gaps)

    def handles(self, contract: type[M], *,
                partition: Callable[[M], str],
                retry: RetryPolicy | None = None,
                reads: Callable[[M], Sequence[str]] | None = None,
                session: Callable[[M], str] | None = None,
                ) -> Callable[[HandlerFn[M]], HandlerFn[M]]:
        """Register the handler of ``contract``.

        ``partition`` (required): the message's state partition key. ``retry``: this message
        type's retry policy. ``reads``: the state keys the handler will read (a hint: rows it
        reads without naming them are fetched when read; rows named but not read cost
        nothing extra). Up to 13 are fetched with the claim in one request on Azure (one
        request reads 14 rows: ``StorageLimits.keys_per_read``). ``session``: the message's
        session key - the messages of a session are handled in the order each sender sent
        them, with ``ctx.session`` (its state, ``close``); see ``bus.protocol.sessions.order``. The
        session's row lives in the message's partition and commits with its state.
        """
        if not (isinstance(contract, type) and issubclass(contract, (Command, Event))):
            raise ConfigurationError(
                f"{self.name}: handles() takes a Command or Event subclass, got {contract!r}")
        if not callable(partition):  # checked all the same: not every caller is type-checked
            raise ConfigurationError(
                f"{self.name}: the handler for {contract.message_type} needs partition=, a "
                "function from the message to its state partition key")
        if reads is not None and not callable(reads):
            raise ConfigurationError(
                f"{self.name}: reads= for {contract.message_type} must be a function from "
                f"the message to the state keys its handler reads, got {reads!r}")
        if session is not None and not callable(session):
            raise ConfigurationError(
                f"{self.name}: session= for {contract.message_type} must be a function from "
                f"the message to its session key, got {session!r}")
        for option, function in (("partition", partition), ("reads", reads),
                                 ("session", session)):
            if is_async(function):
                raise ConfigurationError(
                    f"{self.name}: {option}= for {contract.message_type} is an async function; "
                    "it must be a plain one (the key is needed before the handler runs)")
        self._check_names(contract)

        def register(handler: HandlerFn[M]) -> HandlerFn[M]:
            if not callable(handler):
                raise ConfigurationError(
                    f"{self.name}: the handler for {contract.message_type} must be a function "
                    f"(message, ctx), got {handler!r}")
            # An ``async def`` handler (or one returning an awaitable) is awaited to its end.
            self._check_names(contract)  # again: another may have registered meanwhile
            self.routes[contract.message_type] = Route(contract, completed(handler), partition,
                                                       retry or self.retry, reads, session)
            self._aliases.update(dict.fromkeys(contract.aliases, contract.message_type))
            return handler

        return register

    def _check_names(self, contract: type[Message]) -> None:
        """One handler per message type, whether it is a contract's own or an alias."""
        for name in (contract.message_type, *contract.aliases):
            owner = self.route(name)
            if owner is not None:
                alias = name != contract.message_type
                also = f" (an alias of {contract.__name__})" if alias else ""
                raise ConfigurationError(
                    f"{self.name}: {name}{also} already has a handler, for "
                    f"{owner.contract.__name__}")

    def route(self, message_type: str) -> Route | None:
        """The route of copies sent as ``message_type``: a contract's own, or an alias."""
        return self.routes.get(self._aliases.get(message_type, message_type))

    @property
    def has_sessions(self) -> bool:
        """Whether a handler of this endpoint declares sessions."""
        return any(route.session is not None for route in self.routes.values())

    def session_of(self, message_type: str) -> Callable[[Any], str] | None:
        """The session function of the handler of ``message_type`` (None: no sessions)."""
        route = self.route(message_type)
        return route.session if route is not None else None

    def commands(self) -> list[type[Message]]:
        return [r.contract for r in self.routes.values() if issubclass(r.contract, Command)]

    def events(self) -> list[type[Message]]:
        return [r.contract for r in self.routes.values() if issubclass(r.contract, Event)]

    def __repr__(self) -> str:
        return f"Endpoint({self.name!r}, handles={sorted(self.routes)})"


def check_middleware(owner: str, middleware: Sequence[object]) -> tuple[Middleware, ...]:
    """Fail at start-up, not at the first message, when something is not a Middleware."""
    checked: list[Middleware] = []
    for item in middleware:
        if not isinstance(item, Middleware):
            raise ConfigurationError(
                f"{owner}: middleware must be instances of bus.Middleware (subclass it and "
                f"override handle and/or send), got {item!r}")
        if is_async(item.handle) or is_async(item.send):
            raise ConfigurationError(
                f"{owner}: {type(item).__name__}.handle and .send must be plain methods, not "
                "async ones (they call call_next, which runs the handler to its end)")
        checked.append(item)
    return tuple(checked)


def check_depth(owner: str, depth: int | None) -> int | None:
    if depth is not None and (not isinstance(depth, int) or depth < 1):
        raise ConfigurationError(
            f"{owner}: max_queue_depth must be a positive number of messages (or None for no "
            f"limit), not {depth!r}")
    return depth
