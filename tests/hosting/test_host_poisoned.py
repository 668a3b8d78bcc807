"""What the Functions host moves to a poison queue itself (a signal or a whole bundle,
unchanged, after maxDequeueCount deliveries; it would expire there after 7 days) is adopted by
the poison-queue tools: one entry of the bus's own per signal, with its envelope, its token
poisoned - listed, replayed exactly once - on the in-memory backend and Azurite."""

from __future__ import annotations

import base64

from bus import Bus, Command, Context, Endpoint, Settings
from bus.envelope import encode_bundle
from bus.protocol.poison.poisoned import ReplayResult
from bus.protocol.poison.queue import PoisonEntry
from bus.protocol.tokens.inbox import TokenState
from bus.storage import Storage
from bus.testing import drain

HOST_REASON = "moved to the poison queue by the host after its maximum dequeue count"


class Tick(Command):
    n: int


def build(storage: Storage, prefix: str) -> tuple[Bus, list[int]]:
    ticks = Endpoint("ticks")
    seen: list[int] = []

    @ticks.handles(Tick, partition=lambda m: str(m.n))
    def tick(message: Tick, ctx: Context) -> None:
        seen.append(message.n)

    bus = Bus(storage, [ticks], prefix=prefix,
              settings=Settings(crash_retry_delays=()))  # what the host moves: entries
    bus.provision()
    return bus, seen


def host_moves_a_bundle(bus: Bus, count: int) -> None:
    """Send ``count`` ticks, then do what the host does with a bundle whose function kept
    failing: copy the queue message unchanged to ``<queue>-poison`` and delete it."""
    for n in range(count):
        bus.send(Tick(n=n))
    queue = bus.names.queue("ticks")
    messages = bus.storage.queues.receive(queue, max_messages=32, lease=30)
    texts = [base64.b64decode(m.body).decode() for m in messages]
    bus.storage.queues.send(bus.names.poison_queue("ticks"), encode_bundle(texts))
    for message in messages:
        bus.storage.queues.delete(queue, message)


def test_a_bundle_the_host_poisoned_is_listed_and_replayed_per_signal(
        storage: Storage, prefix: str) -> None:
    bus, seen = build(storage, prefix)
    host_moves_a_bundle(bus, 2)
    letters = bus.poisoned("ticks").entries()
    assert [(letter.entry.reason, letter.token) for letter in letters] == [
        (HOST_REASON, TokenState.POISONED)] * 2
    assert all(letter.replayable for letter in letters)
    results = bus.poisoned("ticks").replay()
    assert sorted(results.values()) == [ReplayResult.REPLAYED] * 2
    drain(bus)
    assert sorted(seen) == [0, 1]
    assert bus.poisoned("ticks").entries() == []


def test_adopted_entries_are_the_bus_s_own(storage: Storage, prefix: str) -> None:
    bus, _ = build(storage, prefix)
    host_moves_a_bundle(bus, 3)
    assert bus.poisoned("ticks").adopt() == 3
    assert bus.poisoned("ticks").adopt() == 0  # nothing left of the host's
    leased = bus.storage.queues.receive(bus.names.poison_queue("ticks"), max_messages=32,
                                        lease=30)
    entries = [PoisonEntry.decode(m.body) for m in leased]  # the bus's format, no expiry
    assert [e.reason for e in entries] == [HOST_REASON] * 3
    assert all(e.envelope is not None for e in entries)
