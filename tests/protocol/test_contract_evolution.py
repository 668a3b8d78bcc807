"""Contracts evolve while both sides run: a producer on a newer contract and a consumer on an
older one (and the other way round) share one storage account, as they do during a rolling
deploy. Each test builds the two sides as two buses of their own over the same storage."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import Bus, Command, ConfigurationError, Context, Endpoint, Event, RetryPolicy
from bus.storage import Storage
from bus.testing import InMemoryStorage, drain

ONCE = RetryPolicy(delays=(0.0,))


class PlaceOrderOld(Command):
    """The contract as the consumer on the old code has it."""

    message_type: ClassVar[str] = "PlaceOrder"
    order_id: str
    amount: int


class PlaceOrderNew(Command):
    """The producer's, one release later: an optional field added."""

    message_type: ClassVar[str] = "PlaceOrder"
    order_id: str
    amount: int
    gift_note: str = ""


class PlaceOrderStrict(Command, extra="forbid"):
    message_type: ClassVar[str] = "PlaceOrder"
    order_id: str
    amount: int


class SubmitOrder(Command):
    """PlaceOrder renamed, amounts in cents: copies sent as PlaceOrder are still its own."""

    aliases: ClassVar[tuple[str, ...]] = ("PlaceOrder",)
    order_id: str
    cents: int

    @classmethod
    def upcast(cls, data: dict[str, Any], sent_as: str) -> dict[str, Any]:
        if sent_as == "PlaceOrder":
            data["cents"] = int(data.pop("amount")) * 100
        return data


def consumer(storage: Storage, prefix: str, contract: type[Command]) -> tuple[Bus, list[Any]]:
    orders = Endpoint("orders", retry=ONCE)
    seen: list[Any] = []

    @orders.handles(contract, partition=lambda m: m.order_id)
    def handle(message: Any, ctx: Context) -> None:
        seen.append(message)
        ctx.state.put("order", message.model_dump())

    bus = Bus(storage, [orders], prefix=prefix)
    bus.provision()
    return bus, seen


def producer(storage: Storage, prefix: str, contract: type[Command]) -> Bus:
    return Bus(storage, [], prefix=prefix, routes={contract: "orders"})


def test_a_consumer_on_the_old_contract_handles_a_copy_from_the_new_one(
        storage: Storage, prefix: str) -> None:
    orders, seen = consumer(storage, prefix, PlaceOrderOld)
    producer(storage, prefix, PlaceOrderNew).send(
        PlaceOrderNew(order_id="o1", amount=5, gift_note="happy birthday"))
    assert drain(orders)["orders"] == {"processed": 1}
    assert seen == [PlaceOrderOld(order_id="o1", amount=5)]  # the unknown field ignored


def test_a_consumer_on_the_new_contract_handles_a_copy_from_the_old_one(
        storage: Storage, prefix: str) -> None:
    orders, seen = consumer(storage, prefix, PlaceOrderNew)
    producer(storage, prefix, PlaceOrderOld).send(PlaceOrderOld(order_id="o1", amount=5))
    assert drain(orders)["orders"] == {"processed": 1}
    assert seen == [PlaceOrderNew(order_id="o1", amount=5, gift_note="")]


def test_a_strict_contract_poisons_a_copy_with_a_field_it_does_not_know(
        storage: Storage, prefix: str) -> None:
    orders, seen = consumer(storage, prefix, PlaceOrderStrict)
    producer(storage, prefix, PlaceOrderNew).send(
        PlaceOrderNew(order_id="o1", amount=5, gift_note="hi"))
    drain(orders, fail_fast=False)
    [poisoned] = orders.poisoned("orders").entries()
    assert seen == [] and "gift_note: Extra inputs are not permitted" in poisoned.entry.reason


def test_a_copy_sent_under_an_alias_is_upcast_and_handled(storage: Storage,
                                                          prefix: str) -> None:
    orders, seen = consumer(storage, prefix, SubmitOrder)
    producer(storage, prefix, PlaceOrderOld).send(PlaceOrderOld(order_id="o1", amount=5))
    producer(storage, prefix, SubmitOrder).send(SubmitOrder(order_id="o2", cents=250))
    assert drain(orders)["orders"] == {"processed": 2}
    assert sorted(seen, key=lambda m: m.order_id) == [SubmitOrder(order_id="o1", cents=500),
                                                      SubmitOrder(order_id="o2", cents=250)]


def test_an_upcast_that_raises_poisons_the_copy_with_the_reason(storage: Storage,
                                                                prefix: str) -> None:
    orders, seen = consumer(storage, prefix, SubmitOrder)
    producer(storage, prefix, PlaceOrderNew).send(PlaceOrderNew(order_id="o1", amount=5))
    sender = Bus(storage, [], prefix=prefix, routes={"PlaceOrder": "orders"})
    sender.send(_Unamounted(order_id="o2"))
    drain(orders, fail_fast=False)
    [poisoned] = orders.poisoned("orders").entries()
    assert [m.order_id for m in seen] == ["o1"]
    assert "upcast from 'PlaceOrder' raised KeyError" in poisoned.entry.reason
    assert "amount" not in poisoned.entry.reason  # the exception's type, never its message


class _Unamounted(Command):
    """A PlaceOrder without the amount its upcast needs."""

    message_type: ClassVar[str] = "PlaceOrder"
    order_id: str


class ParcelShipped(Event):
    """Shipped renamed: subscribers still get what producers on the old code publish."""

    aliases: ClassVar[tuple[str, ...]] = ("Shipped",)
    parcel: str


class Shipped(Event):
    parcel: str


def test_an_event_published_under_an_alias_reaches_the_subscribers(storage: Storage,
                                                                    prefix: str) -> None:
    tracking = Endpoint("tracking", retry=ONCE)
    seen: list[str] = []

    @tracking.handles(ParcelShipped, partition=lambda m: m.parcel)
    def shipped(message: ParcelShipped, ctx: Context) -> None:
        seen.append(message.parcel)

    subscriber = Bus(storage, [tracking], prefix=prefix)
    subscriber.provision()  # the topic files: ParcelShipped's and Shipped's
    assert subscriber.topology.subscriptions["Shipped"] == ["tracking"]
    Bus(storage, [], prefix=prefix).publish(Shipped(parcel="p1"))
    Bus(storage, [], prefix=prefix).publish(ParcelShipped(parcel="p2"))
    assert drain(subscriber)["tracking"] == {"processed": 2}
    assert sorted(seen) == ["p1", "p2"]


def test_aliases_are_checked_when_the_contract_is_defined() -> None:
    with pytest.raises(ConfigurationError, match="must be a tuple of message type names"):
        class _Listed(Command):
            aliases: ClassVar[tuple[str, ...]] = ["Old"]  # type: ignore[assignment]
    with pytest.raises(ConfigurationError, match="names its own message type"):
        class _Itself(Command):
            aliases: ClassVar[tuple[str, ...]] = ("_Itself",)


def test_an_alias_is_the_contract_s_own_not_its_subclasses() -> None:
    class Special(SubmitOrder):
        pass

    assert Special.aliases == () and SubmitOrder.aliases == ("PlaceOrder",)


def test_one_handler_per_message_type_alias_or_not() -> None:
    orders = Endpoint("orders")
    orders.handles(SubmitOrder, partition=lambda m: m.order_id)(lambda m, ctx: None)
    with pytest.raises(ConfigurationError, match=r"PlaceOrder already has a handler, for "
                                                 r"SubmitOrder"):
        orders.handles(PlaceOrderOld, partition=lambda m: m.order_id)
    other = Endpoint("other")
    other.handles(PlaceOrderOld, partition=lambda m: m.order_id)(lambda m, ctx: None)
    with pytest.raises(ConfigurationError, match=r"PlaceOrder \(an alias of SubmitOrder\)"):
        other.handles(SubmitOrder, partition=lambda m: m.order_id)


def test_upcast_runs_for_received_copies_only() -> None:
    assert SubmitOrder(order_id="o", cents=1).cents == 1
    assert SubmitOrder.model_validate({"order_id": "o", "cents": 2}).cents == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.dictionaries(st.text(max_size=8), st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=20),
    st.lists(st.integers(), max_size=3)), max_size=4))
def test_whatever_an_aliased_copy_holds_it_ends_handled_or_poisoned(
        payload: dict[str, Any]) -> None:
    """A copy sent under an alias, its payload any JSON object: the upcast may raise or
    return anything, and still the copy is handled or poisoned with a reason - never lost,
    never a crash of the worker."""
    storage = InMemoryStorage()
    orders, seen = consumer(storage, "h", SubmitOrder)
    sender = Bus(storage, [], prefix="h", routes={"PlaceOrder": "orders"})
    sender.send(_Anything(order_id="o1", payload=payload))
    drain(orders, fail_fast=False)
    poisoned = orders.poisoned("orders").entries()
    assert len(seen) + len(poisoned) == 1
    assert all(p.entry.reason for p in poisoned)


class _Anything(Command):
    """A PlaceOrder as a producer with any payload at all might send it."""

    message_type: ClassVar[str] = "PlaceOrder"
    order_id: str
    payload: dict[str, Any]

    def model_dump_json(self, **kwargs: Any) -> str:  # type: ignore[override]
        import json

        return json.dumps({"order_id": self.order_id, **self.payload})
