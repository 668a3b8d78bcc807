"""Message contracts: typed classes users declare for their commands and events.

A command has one destination endpoint, known to the sender. An event is published to a topic
and every subscribed endpoint receives its own copy. Both are pydantic models, so an incoming
payload is validated against its contract before a handler ever sees it.

Contracts evolve while both sides run (docs/contracts.md): a field the contract does not know
is ignored (``class PlaceOrder(Command, extra="forbid")`` refuses it instead); ``aliases``
names the types a contract was known by, so copies sent under an earlier name are still its
own; ``upcast`` turns what an older producer sent into what the contract reads now.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from bus.errors import ConfigurationError, MessageKindError

_RECEIVED: ContextVar[tuple[type[Message], str] | None] = ContextVar("received", default=None)
"""The contract being decoded from a copy, and the message type the copy was sent as."""


class Message(BaseModel):
    """Base class of message contracts. Do not subclass directly: use Command or Event.

    ``message_type`` is the name that travels in the envelope; it defaults to the class name.
    Set it explicitly (``message_type: ClassVar[str] = "orders.PlaceOrder"``) when two
    services must agree on it without sharing code.

    A payload field the contract does not declare is ignored, so a producer may add an
    optional field before its consumers know it. A strict contract refuses it instead (the
    copy is poisoned, naming the field): ``class PlaceOrder(Command, extra="forbid")``.

    ``aliases``: message types this contract was known by before (a renamed class, an
    ``orders.PlaceOrder.v1``): copies sent under one are handled as this contract, and an
    event's subscribers receive what is still published to its old topic.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    message_type: ClassVar[str] = ""
    message_kind: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "message_type" not in cls.__dict__:
            cls.message_type = cls.__name__
        if "aliases" not in cls.__dict__:
            cls.aliases = ()  # an alias is the class's own, not its subclasses'
        _check_aliases(cls)

    @classmethod
    def upcast(cls, data: dict[str, Any], sent_as: str) -> dict[str, Any]:
        """Turn a received payload into what this contract reads now, before it is validated.

        ``data``: the payload's fields as the producer sent them; ``sent_as``: the message
        type it was sent as - this contract's ``message_type`` or one of its ``aliases``.
        Override it when a change is more than an added optional field (a field renamed, a
        unit changed); the default returns ``data`` as it is. It runs for received copies
        only (never on construction), and an exception it raises poisons the copy, the
        reason naming the exception's type (not its message: it may quote the payload)."""
        return data

    @model_validator(mode="before")
    @classmethod
    def _upcast_received(cls, data: Any) -> Any:
        # Through a module function: a contract defined in a notebook travels to Spark's
        # executors pickled by value, with the globals of this validator, and a ContextVar
        # cannot be pickled (a module function is pickled by reference).
        received = received_now()
        if received is None or received[0] is not cls or not isinstance(data, dict):
            return data
        try:
            return cls.upcast(dict(data), received[1])
        except Exception as exc:
            # Its type only: the message may quote the payload's values (a decrypted one's),
            # and the reason goes to the poison queue, the log and the dashboard.
            raise ValueError(f"upcast from {received[1]!r} raised {type(exc).__name__}") from exc


def received_now() -> tuple[type[Message], str] | None:
    """The contract being decoded from a copy, and the type it was sent as (``received_as``);
    None outside a decoding."""
    return _RECEIVED.get()


@contextmanager
def received_as(contract: type[Message], message_type: str) -> Iterator[None]:
    """While a copy sent as ``message_type`` is decoded into ``contract``: its ``upcast``
    runs on the payload first."""
    token = _RECEIVED.set((contract, message_type))
    try:
        yield
    finally:
        _RECEIVED.reset(token)


def _check_aliases(cls: type[Message]) -> None:
    """Fail when the class is defined, not when a copy arrives."""
    aliases = cls.aliases
    if not isinstance(aliases, tuple) or not all(
            isinstance(a, str) and 0 < len(a) <= 256 for a in aliases):
        raise ConfigurationError(
            f"{cls.__name__}.aliases must be a tuple of message type names (1 to 256 "
            f"characters), not {aliases!r}")
    if cls.message_type in aliases:
        raise ConfigurationError(
            f"{cls.__name__}.aliases names its own message type {cls.message_type!r}")


class Command(Message):
    """A request to one endpoint to do something. Name it in the imperative: PlaceOrder."""

    message_kind: ClassVar[str] = "command"


class Event(Message):
    """A fact that happened, published to every subscriber. Name it in the past: OrderPlaced."""

    message_kind: ClassVar[str] = "event"


def require_command(message: Message, call: str) -> None:
    """``send`` and ``send_once`` take commands (one destination)."""
    if not isinstance(message, Command):
        publish = call.replace("send", "publish")
        raise MessageKindError(
            f"{message.message_type} is not a command: if it is an event, publish it "
            f"({publish}) and every subscriber gets a copy; {call} is for commands, which "
            "have one destination")


def require_event(message: Message, call: str) -> None:
    """``publish`` and ``publish_once`` take events (every subscriber gets a copy)."""
    if not isinstance(message, Event):
        send = call.replace("publish", "send")
        raise MessageKindError(
            f"{message.message_type} is not an event: if it is a command, send it ({send}) "
            f"to the endpoint that handles it; {call} is for events, which every subscriber "
            "receives")


def topic_of(event_type: type[Event]) -> str:
    """The topic an event type is published to: its message type name."""
    return event_type.message_type
