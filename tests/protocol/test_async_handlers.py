"""``async def`` handlers are awaited, on every host (the Spark jobs run no handlers; the
Functions app's trigger: tests/hosting/functions/test_async_trigger.py): their
effect commits exactly once, their failures are retried and poisoned like a plain handler's.
What the bus cannot await (async middleware, async partition/reads/session functions) is
refused when it is registered."""

from __future__ import annotations

import asyncio
import functools

import pytest

from bus import Bus, Command, ConfigurationError, Context, Endpoint, Middleware, RetryPolicy
from bus.settings import Settings
from bus.testing import InMemoryStorage, drain


class Pay(Command):
    ref: str
    cents: int
    fail: bool = False


class Receipt(Command):
    ref: str


def build() -> tuple[Bus, list[str]]:
    seen: list[str] = []
    till = Endpoint("till", retry=RetryPolicy(immediate=2, backoff_initial=0.0, delays=(0.0,)))
    ledger = Endpoint("ledger")

    @till.handles(Pay, partition=lambda m: m.ref)
    async def pay(message: Pay, ctx: Context) -> None:
        await asyncio.sleep(0)  # really suspends: a coroutine nobody awaits never gets here
        seen.append(message.ref)
        if message.fail:
            raise RuntimeError("card declined")
        ctx.state.put("paid", {"cents": message.cents})
        ctx.send(Receipt(ref=message.ref))

    async def receipt(message: Receipt, ctx: Context, *, note: str) -> None:
        await asyncio.sleep(0)
        ctx.state.put("receipt", {"note": note})

    ledger.handles(Receipt, partition=lambda m: m.ref)(
        functools.partial(receipt, note="kept"))  # not a coroutine function: returns one
    bus = Bus(InMemoryStorage(), [till, ledger], settings=Settings(max_delivery_count=2))
    bus.provision()
    return bus, seen


def paid(bus: Bus, ref: str) -> object:
    return bus.read_state("till", ref, "paid")


def test_an_async_handler_is_awaited_by_the_polling_worker() -> None:
    bus, seen = build()
    bus.send(Pay(ref="p1", cents=250))
    assert drain(bus).total() == {"processed": 2}
    assert seen == ["p1"]
    assert paid(bus, "p1") == {"cents": 250}
    assert bus.read_state("ledger", "p1", "receipt") == {"note": "kept"}


def test_an_async_handler_that_raises_is_retried_then_poisoned() -> None:
    bus, seen = build()
    bus.send(Pay(ref="p2", cents=1, fail=True))
    drain(bus, fail_fast=False)
    assert seen == ["p2"] * 4  # 2 immediate tries on each of 2 deliveries
    [entry] = bus.poisoned("till").entries()
    assert "card declined" in (entry.entry.exception or "")
    assert paid(bus, "p2") is None


def test_an_async_handler_runs_when_its_caller_is_inside_an_event_loop() -> None:
    """Delivered on a thread whose event loop is running (a drain called from async code):
    the handler cannot block that loop, so it runs on a loop of its own."""
    bus, seen = build()
    bus.send(Pay(ref="p4", cents=9))

    async def caller() -> dict[str, int]:
        return drain(bus).total()

    assert asyncio.run(caller()) == {"processed": 2}
    assert seen == ["p4"] and paid(bus, "p4") == {"cents": 9}


class AsyncMiddleware(Middleware):
    async def handle(self, message, ctx, call_next):  # type: ignore[no-untyped-def,override]
        call_next(message, ctx)


@pytest.mark.parametrize("option", ["partition", "reads", "session"])
def test_an_async_key_function_is_refused_when_registered(option: str) -> None:
    async def key(message: Pay) -> str:
        return message.ref

    till = Endpoint("till")
    options = {"partition": lambda m: m.ref, option: key}
    with pytest.raises(ConfigurationError, match=f"{option}=.*async"):
        till.handles(Pay, **options)  # type: ignore[arg-type]


def test_async_middleware_is_refused_when_registered() -> None:
    with pytest.raises(ConfigurationError, match="async"):
        Endpoint("till", middleware=[AsyncMiddleware()])
