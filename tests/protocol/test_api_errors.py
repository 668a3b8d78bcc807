"""Misuse gets an error that says what to do: an event sent, a command published, a send
before the bus's storage exists - in-memory and Azurite."""

from __future__ import annotations

import pytest

from bus import (
    Bus,
    Command,
    ConfigurationError,
    Context,
    Endpoint,
    Event,
    MessageKindError,
    NotProvisioned,
    RetryPolicy,
)
from bus.storage import Storage
from bus.testing import MessagesPoisoned, drain


class Ship(Command):
    order_id: str


class Shipped(Event):
    order_id: str


def build(storage: Storage, prefix: str, *, provision: bool = True) -> Bus:
    shipping = Endpoint("shipping", retry=RetryPolicy(delays=(0.0,)))

    @shipping.handles(Ship, partition=lambda m: m.order_id)
    def ship(message: Ship, ctx: Context) -> None:
        ctx.send(Shipped(order_id=message.order_id))  # type: ignore[arg-type] - the misuse

    @shipping.handles(Shipped, partition=lambda m: m.order_id)
    def shipped(message: Shipped, ctx: Context) -> None:
        pass

    bus = Bus(storage, [shipping], prefix=prefix)
    if provision:
        bus.provision()
    return bus


def test_sending_an_event_says_to_publish_it(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    with pytest.raises(MessageKindError, match=r"Shipped is not a command.*bus\.publish"):
        bus.send(Shipped(order_id="o1"))  # type: ignore[arg-type]
    with pytest.raises(MessageKindError, match=r"bus\.publish_once"):
        bus.send_once(Shipped(order_id="o1"), message_id="m1")  # type: ignore[arg-type]


def test_publishing_a_command_says_to_send_it(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix)
    with pytest.raises(MessageKindError, match=r"Ship is not an event.*bus\.send\)"):
        bus.publish(Ship(order_id="o1"))  # type: ignore[arg-type]


def test_a_handler_sending_an_event_fails_with_the_reason(storage: Storage,
                                                          prefix: str) -> None:
    bus = build(storage, prefix)
    bus.send(Ship(order_id="o1"))
    with pytest.raises(MessagesPoisoned, match=r"(?s)MessageKindError.*ctx\.publish"):
        drain(bus)


def test_sending_before_provisioning_says_to_provision(storage: Storage, prefix: str) -> None:
    bus = build(storage, prefix, provision=False)
    for send in (lambda: bus.send(Ship(order_id="o1")),
                 lambda: bus.send_once(Ship(order_id="o1"), message_id="m1"),
                 lambda: bus.publish(Shipped(order_id="o1"))):
        with pytest.raises(NotProvisioned, match=r"(?s)does not exist.*bus\.provision\(\)"):
            send()


def test_a_handler_without_a_partition_is_refused() -> None:
    """``partition=`` is required in the type, and checked at run time for untyped callers."""
    desk = Endpoint("desk")
    with pytest.raises(TypeError, match="partition"):
        desk.handles(Ship)(lambda message, ctx: None)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="needs partition="):
        desk.handles(Ship, partition="order_id")  # type: ignore[arg-type]
