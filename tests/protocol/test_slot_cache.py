"""The slot cache (``bus.protocol.receive.slotcache``): a partition's next claim in the same process
starts from the slot its last commit left, without reading it - and a slot someone else wrote
since is caught by the commit's compare-and-swap. In-memory and Azurite."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from bus import Bus, Command, Context, Endpoint, Settings
from bus.protocol.outbox.slot import Slot
from bus.protocol.receive.slotcache import REST, WINDOW, SlotCache
from bus.storage import Entity, Storage, TableOp
from tests.protocol.test_reads import StateReads, balance, drain


class Deposit(Command):
    account: str
    amount: int


def build(storage: Storage, prefix: str, *, cache: int = 1024) -> Bus:
    bank = Endpoint("bank")

    @bank.handles(Deposit, partition=lambda m: m.account, reads=lambda m: ["balance"])
    def deposit(message: Deposit, ctx: Context) -> None:
        row = ctx.state.get("balance") or {"n": 0}
        ctx.state.put("balance", {"n": int(row["n"] or 0) + message.amount})
        count = ctx.state.get("count") or {"n": 0}  # not declared
        ctx.state.put("count", {"n": int(count["n"] or 0) + 1})

    bus = Bus(storage, [bank], prefix=prefix, settings=Settings(slot_cache_size=cache))
    bus.provision()
    return bus


def counted(storage: Storage, prefix: str, *, cache: int = 1024) -> tuple[Bus, StateReads]:
    reads = StateReads(storage.tables)
    bus = build(Storage(queues=storage.queues, blobs=storage.blobs,
                        tables=reads), prefix, cache=cache)  # type: ignore[arg-type]
    reads.table = bus.names.state_table("bank")
    return bus, reads


def deposit(bus: Bus, account: str, amount: int) -> None:
    bus.send(Deposit(account=account, amount=amount))
    drain(bus)


def value(bus: Bus, key: str, account: str = "a") -> int:
    return balance(bus, account, key)


def test_the_next_claim_of_a_partition_reads_nothing(storage: Storage, prefix: str) -> None:
    bus, reads = counted(storage, prefix)
    deposit(bus, "a", 5)
    assert reads.requests == [("get_many", ("~bus.outbox", "balance")), ("get", ("count",))]
    reads.requests.clear()
    deposit(bus, "a", 7)
    assert reads.requests == []  # the slot, "balance" and "count" as the first commit left them
    assert (value(bus, "balance"), value(bus, "count")) == (12, 2)
    assert (bus.parts.receiver("bank").slots.hits, bus.parts.receiver("bank").slots.stale) == (1, 0)
    reads.requests.clear()
    deposit(bus, "b", 1)  # another partition: read
    assert reads.requests == [("get_many", ("~bus.outbox", "balance")), ("get", ("count",))]


def test_size_zero_turns_it_off(storage: Storage, prefix: str) -> None:
    bus, reads = counted(storage, prefix, cache=0)
    deposit(bus, "a", 5)
    reads.requests.clear()
    deposit(bus, "a", 7)
    assert reads.requests == [("get_many", ("~bus.outbox", "balance")), ("get", ("count",))]
    assert value(bus, "balance") == 12


def test_a_slot_another_process_wrote_since_loses_the_claim(storage: Storage,
                                                            prefix: str) -> None:
    bus = build(storage, prefix)
    other = build(storage, prefix)  # a second process: its own cache
    deposit(bus, "a", 1)
    deposit(other, "a", 100)
    deposit(bus, "a", 10)  # starts from the remembered slot: stale, caught by the ETag
    assert (value(bus, "balance"), value(bus, "count")) == (111, 3)
    assert (bus.parts.receiver("bank").slots.hits, bus.parts.receiver("bank").slots.stale) == (1, 1)
    deposit(bus, "a", 1000)  # read again, then remembered again
    assert value(bus, "balance") == 1111


def test_a_batch_claims_from_memory_too(storage: Storage, prefix: str) -> None:
    from bus.hosting.worker import Worker

    bus, reads = counted(storage, prefix)
    for account in "abc":
        bus.send(Deposit(account=account, amount=1))
    Worker(bus, "bank", retry_delay=0).poll_once()
    reads.requests.clear()
    for account in "abc":
        bus.send(Deposit(account=account, amount=2))
    worker = Worker(bus, "bank", retry_delay=0)
    assert worker.poll_once() == 3
    assert worker.outcomes == {"processed": 3}
    assert reads.requests == []
    assert [value(bus, "balance", account) for account in "abc"] == [3, 3, 3]


# -- the cache itself ------------------------------------------------------------------------
def _slot(partition: str = "p", etag: str = "e1", cached: bool = False) -> Slot:
    return Slot(partition, None, etag, {"balance": {"n": 1}}, cached)


def _put(key: str, **values: object) -> TableOp:
    return TableOp("replace", Entity("p", key, values))  # type: ignore[arg-type]


def test_it_remembers_exact_rows_only() -> None:
    cache = SlotCache(8)
    stamp = datetime(2026, 1, 1, tzinfo=timezone.utc)
    cache.remember(_slot(etag="e2"), _slot(), [_put("count", n=1), _put("seen", at=stamp),
                                              TableOp("delete", Entity("p", "old"))])
    assert cache.lookup("p", ["balance", "count", "old"]) is not None
    assert cache.lookup("p", ["seen"]) is None  # a datetime may come back changed: read it
    slot = cache.lookup("p", [])
    assert slot is not None and slot.cached and slot.etag == "e2"
    assert slot.rows == {"balance": {"n": 1}, "count": {"n": 1}, "old": None}


def test_the_least_recently_used_partition_goes_first() -> None:
    cache = SlotCache(2)
    for partition in "abc":
        cache.remember(_slot(partition), _slot(partition), [])
    assert [cache.lookup(p, []) is not None for p in "abc"] == [False, True, True]


def test_too_many_stale_claims_rest_the_cache() -> None:
    cache = SlotCache(8)
    for round_ in range(WINDOW):
        cache.remember(_slot(), _slot(), [])
        slot = cache.lookup("p", [])
        assert slot is not None, round_
        if round_ % 4 == 0:
            cache.lost(slot)  # a quarter of them stale: above the limit
    cache.remember(_slot(), _slot(), [])
    assert all(cache.lookup("p", []) is None for _ in range(REST))
    cache.remember(_slot(), _slot(), [])
    assert cache.lookup("p", []) is not None


def test_a_few_stale_claims_do_not() -> None:
    cache = SlotCache(8)
    for round_ in range(WINDOW * 3):
        cache.remember(_slot(), _slot(), [])
        slot = cache.lookup("p", [])
        assert slot is not None, round_
        if round_ % 10 == 0:
            cache.lost(slot)


@pytest.mark.parametrize("cached", [True, False])
def test_only_remembered_claims_count_as_stale(cached: bool) -> None:
    cache = SlotCache(8)
    cache.lost(_slot(cached=cached))
    assert cache.stale == int(cached)
