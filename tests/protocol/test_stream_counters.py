"""A handler partition's sequence counters - one per destination and session it numbers sends
in, kept in its outbox record - have a documented room (``MAX_COUNTER_CHARS``): a handler
that would need one more is refused with an error that says so, and the partition goes on
with everything else. Before, the counters grew until the partition's record no longer fit a
table row, and every later message of the partition was poisoned, blamed on one handler
call."""

from __future__ import annotations

import time

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.adapters.memory import InMemoryStorage
from bus.protocol.sessions.order import COUNTER_OVERHEAD_CHARS, MAX_COUNTER_CHARS
from bus.testing import drain


class Open(Command):
    n: int


class Tally(Command):
    session: str


class Ping(Command):
    n: int


def build() -> Bus:
    """``b`` opens a session at ``s`` per Open, all from one partition; the session keys are
    of the longest length, so the room fills after some 480 of them."""
    b = Endpoint("b", retry=RetryPolicy(delays=(0.0,)))
    s = Endpoint("s")

    @b.handles(Open, partition=lambda m: "one")
    def open_(message: Open, ctx: Context) -> None:
        ctx.send(Tally(session=f"{message.n:0>256}"))

    @b.handles(Ping, partition=lambda m: "one")
    def ping(message: Ping, ctx: Context) -> None:
        ctx.state.put("ping", {"n": message.n})

    @s.handles(Tally, partition=lambda m: m.session, session=lambda m: m.session)
    def tally(message: Tally, ctx: Context) -> None:
        pass

    bus = Bus(InMemoryStorage(), [b, s], prefix="t",
              settings=Settings(max_delivery_count=1, signal_bundles=False))
    bus.provision()
    return bus


def test_a_partition_refuses_a_counter_beyond_its_room_and_goes_on() -> None:
    bus = build()
    opens = 2_000
    started = time.monotonic()
    for n in range(opens):
        bus.send(Open(n=n))
        outcomes = drain(bus, endpoints=["b"], fail_fast=False).total()
        if outcomes != {"processed": 1}:
            break
    fitted = n  # sessions the partition numbers in
    assert outcomes == {"poisoned": 1}, f"{fitted} sessions in {time.monotonic() - started:.0f} s"
    each = len("s/") + 256 + COUNTER_OVERHEAD_CHARS
    assert fitted > 400 and fitted * each <= MAX_COUNTER_CHARS < (fitted + 1) * each
    [letter] = bus.poisoned("b").entries()
    assert letter.entry.exception is not None
    assert letter.entry.exception.startswith("StateError: stream 'b/one' numbers its sends in "
                                             f"{fitted} sessions already")
    # The partition goes on: a message that numbers nothing, one to a session it numbers in.
    bus.send(Ping(n=1))
    bus.send(Open(n=0))
    assert drain(bus, endpoints=["b"]).total() == {"processed": 2}
