"""Message contracts: typed classes users declare for their commands and events.

A command has one destination endpoint, known to the sender. An event is published to a topic
and every subscribed endpoint receives its own copy. Both are pydantic models, so an incoming
payload is validated against its contract before a handler ever sees it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from bus.errors import MessageKindError


class Message(BaseModel):
    """Base class of message contracts. Do not subclass directly: use Command or Event.

    ``message_type`` is the name that travels in the envelope; it defaults to the class name.
    Set it explicitly (``message_type: ClassVar[str] = "orders.PlaceOrder"``) when two
    services must agree on it without sharing code.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    message_type: ClassVar[str] = ""
    message_kind: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "message_type" not in cls.__dict__:
            cls.message_type = cls.__name__


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
