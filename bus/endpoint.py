"""Endpoints and their handlers: the part of the API users write against.

    orders = Endpoint("orders")

    @orders.handles(PlaceOrder, partition=lambda m: m.order_id)
    def place_order(message: PlaceOrder, ctx: Context) -> None:
        ctx.state.put("order", {"amount": message.amount})
        ctx.publish(OrderPlaced(order_id=message.order_id))

``partition`` maps a message to the state partition its handler reads and writes; the handler's
state changes and outgoing messages commit atomically within that partition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from bus.context import Context
from bus.messages import Command, Event, Message
from bus.naming import check_endpoint
from bus.retry import DEFAULT_RETRY, RetryPolicy

M = TypeVar("M", bound=Message)
HandlerFn = Callable[[M, Context], None]


class ConfigurationError(ValueError):
    """The bus is set up wrongly; the message says what to fix. Raised at start-up."""


@dataclass(frozen=True)
class Route:
    contract: type[Message]
    handler: Callable[[Any, Context], None]
    partition: Callable[[Any], str]
    retry: RetryPolicy = DEFAULT_RETRY


class Endpoint:
    """A named service with one queue, one state table and a handler per message type.

    ``retry``: what happens when its handlers raise (``bus.retry``); a policy given to
    ``handles`` wins for that message type.
    """

    def __init__(self, name: str, *, retry: RetryPolicy | None = None) -> None:
        self.name = check_endpoint(name)
        self.routes: dict[str, Route] = {}
        self.retry = retry or DEFAULT_RETRY

    def handles(self, contract: type[M], *,
                partition: Callable[[M], str] | None = None,
                retry: RetryPolicy | None = None,
                ) -> Callable[[HandlerFn[M]], HandlerFn[M]]:
        if not (isinstance(contract, type) and issubclass(contract, (Command, Event))):
            raise ConfigurationError(
                f"{self.name}: handles() takes a Command or Event subclass, got {contract!r}")
        if partition is None or not callable(partition):
            raise ConfigurationError(
                f"{self.name}: the handler for {contract.message_type} needs partition=, a "
                "function from the message to its state partition key")
        if contract.message_type in self.routes:
            raise ConfigurationError(
                f"{self.name}: {contract.message_type} already has a handler")

        def register(handler: HandlerFn[M]) -> HandlerFn[M]:
            assert partition is not None
            self.routes[contract.message_type] = Route(contract, handler, partition,
                                                       retry or self.retry)
            return handler

        return register

    def route(self, message_type: str) -> Route | None:
        return self.routes.get(message_type)

    def commands(self) -> list[type[Message]]:
        return [r.contract for r in self.routes.values() if issubclass(r.contract, Command)]

    def events(self) -> list[type[Message]]:
        return [r.contract for r in self.routes.values() if issubclass(r.contract, Event)]

    def __repr__(self) -> str:
        return f"Endpoint({self.name!r}, handles={sorted(self.routes)})"
