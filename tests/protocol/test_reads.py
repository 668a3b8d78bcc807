"""Declared reads (``Endpoint.handles(reads=)``): the state rows a handler names are fetched
with the partition's outbox slot in one request, and are never stale - in-memory and Azurite."""

from __future__ import annotations

import pytest

from bus import Bus, Command, ConfigurationError, Context, Endpoint
from bus.storage import NotFound, Storage, Tables
from bus.testing import drain


class Deposit(Command):
    account: str
    amount: int
    reads: list[str] = ["balance", "limits"]


def build(storage: Storage, prefix: str, *, declare: bool = True) -> Bus:
    bank = Endpoint("bank")

    def named(message: Deposit) -> list[str]:
        return message.reads

    @bank.handles(Deposit, partition=lambda m: m.account, reads=named if declare else None)
    def deposit(message: Deposit, ctx: Context) -> None:
        limits = ctx.state.get("limits")  # never written: read as missing
        assert limits is None
        row = ctx.state.get("balance") or {"n": 0}
        ctx.state.put("balance", {"n": int(row["n"] or 0) + message.amount})
        history = ctx.state.get("history") or {"n": 0}  # not declared: read when asked
        ctx.state.put("history", {"n": int(history["n"] or 0) + 1})

    bus = Bus(storage, [bank], prefix=prefix)
    bus.provision()
    return bus


def balance(bus: Bus, account: str, key: str = "balance") -> int:
    try:
        row = bus.storage.tables.get(bus.names.state_table("bank"), account, key)
    except NotFound:
        return 0
    return int(row.properties["n"])  # type: ignore[arg-type]


class StateReads:
    """Counts the read requests made to one table (the bank's state table)."""

    def __init__(self, inner: Tables) -> None:
        self._inner = inner
        self.table = ""
        self.requests: list[tuple[str, tuple[str, ...]]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def get(self, table: str, partition_key: str, row_key: str) -> object:
        if table == self.table and row_key != "~pause":  # the worker's pause check
            self.requests.append(("get", (row_key,)))
        return self._inner.get(table, partition_key, row_key)

    def get_many(self, table: str, partition_key: str, row_keys: list[str]) -> object:
        if table == self.table:
            self.requests.append(("get_many", tuple(row_keys)))
        return self._inner.get_many(table, partition_key, row_keys)


def counted_bus(storage: Storage, prefix: str, *, declare: bool) -> tuple[Bus, StateReads]:
    reads = StateReads(storage.tables)
    bus = build(Storage(queues=storage.queues, blobs=storage.blobs,
                        tables=reads), prefix, declare=declare)  # type: ignore[arg-type]
    reads.table = bus.names.state_table("bank")
    return bus, reads


def test_declared_rows_come_with_the_claim(storage: Storage, prefix: str) -> None:
    bus, reads = counted_bus(storage, prefix, declare=True)
    bus.send(Deposit(account="a", amount=5))
    drain(bus)
    # The slot with "balance" and "limits" in one request; "history" was not declared.
    assert reads.requests == [("get_many", ("~bus.outbox", "balance", "limits")),
                              ("get", ("history",))]
    bus.send(Deposit(account="a", amount=7))
    drain(bus)
    assert balance(bus, "a") == 12
    assert balance(bus, "a", "history") == 2


def test_without_reads_every_row_is_its_own_request(storage: Storage, prefix: str) -> None:
    bus, reads = counted_bus(storage, prefix, declare=False)
    bus.send(Deposit(account="a", amount=5))
    drain(bus)
    assert reads.requests == [("get", (key,)) for key in
                              ("~bus.outbox", "limits", "balance", "history")]
    assert balance(bus, "a") == 5


class Interleaving:
    """Tables that let another worker commit in the partition right after a claim's read:
    the first delivery's prefetched balance is then stale and its commit must fail."""

    def __init__(self, inner: Tables) -> None:
        self._inner = inner
        self.meanwhile: list[object] = []
        self.fired = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def get_many(self, table: str, partition_key: str, row_keys: object) -> object:
        found = self._inner.get_many(table, partition_key, row_keys)  # type: ignore[arg-type]
        if not self.fired and "balance" in row_keys:  # type: ignore[operator]
            self.fired = True
            for action in self.meanwhile:
                action()  # type: ignore[operator]
        return found


def test_a_prefetched_row_that_went_stale_loses_the_claim(storage: Storage,
                                                          prefix: str) -> None:
    tables = Interleaving(storage.tables)
    bus = build(Storage(queues=storage.queues, blobs=storage.blobs,
                        tables=tables), prefix)  # type: ignore[arg-type]
    other = build(storage, prefix)  # a second worker process on the same storage

    def deposit_meanwhile() -> None:  # commits 100 between our claim's read and its commit
        other.send(Deposit(account="a", amount=100))
        drain(other)

    tables.meanwhile.append(deposit_meanwhile)
    bus.send(Deposit(account="a", amount=1))
    drain(bus)
    assert tables.fired
    assert balance(bus, "a") == 101  # not 1: the stale read was caught by the slot's ETag


@pytest.mark.parametrize(("reads", "reason"), [
    (["~bus.outbox"], "state keys are strings not starting with '~'"),
    (["a/b"], "state key"),
])
def test_bad_reads_poison_the_message(storage: Storage, prefix: str, reads: list[str],
                                      reason: str) -> None:
    bus = build(storage, prefix)
    bus.send(Deposit(account="a", amount=5, reads=reads))
    drain(bus, fail_fast=False)
    (letter,) = bus.poisoned("bank").entries()
    assert reason in letter.entry.reason
    assert balance(bus, "a") == 0


def test_reads_must_be_a_function() -> None:
    endpoint = Endpoint("bank")
    with pytest.raises(ConfigurationError, match="reads= for Deposit must be a function"):
        endpoint.handles(Deposit, partition=lambda m: m.account,
                         reads=["balance"])  # type: ignore[arg-type]
