"""The partition-budget model: draws per budget, the ceiling, an endpoint in a chain."""

from __future__ import annotations

import pytest

from bench.partitions import (
    ACCOUNT,
    EndpointBudgets,
    LoadBook,
    ceiling,
    in_chain,
    recording,
)
from bus.adapters.memory import InMemoryStorage
from bus.storage.ports import Entity, TableOp

A = EndpointBudgets("q-a", "tokens", "a", "state-a")
B = EndpointBudgets("q-b", "tokens", "b", "state-b")


def test_requests_draw_entities_on_their_partition_and_messages_on_their_queue() -> None:
    book = LoadBook()
    storage = recording(InMemoryStorage(), book)
    storage.tables.create_table("tokens")
    storage.queues.create_queue("q-a")
    book.reset()
    storage.tables.transact("tokens", [TableOp("insert", Entity("a", f"r{i}")) for i in range(3)])
    storage.tables.get_many("tokens", "a", ["r0", "r1"])
    storage.queues.send("q-a", "x")
    storage.queues.send("q-a", "y")
    leased = storage.queues.receive("q-a", max_messages=32, lease=30)
    storage.queues.delete("q-a", leased[0])
    assert book.snapshot() == {("table", "tokens", "a"): 5, ("queue", "q-a"): 5, ACCOUNT: 6}


def test_the_ceiling_is_the_first_budget_to_reach_its_target() -> None:
    draws = {("table", "tokens", "a"): 400, ("queue", "q-a"): 100, ACCOUNT: 300}
    found = ceiling(draws, messages=100)
    assert found.budget == ("table", "tokens", "a")
    assert found.per_message == 4.0
    assert found.msgs_per_s == pytest.approx(500)
    assert found.account_msgs_per_s == pytest.approx(20_000 / 3)


def test_an_endpoint_in_a_chain_carries_what_it_draws_on_the_next_one() -> None:
    """A drew 2 per message on its own token partition (read, consume) and 2 on B's (place,
    release): in a chain of such endpoints, its upstream draws those 2 on A - 4 in all."""
    draws = {("table", "tokens", "a"): 200, ("table", "tokens", "b"): 200,
             ("queue", "q-a"): 50, ("queue", "q-b"): 20, ("table", "state-a", "p1"): 100,
             ("table", "other", "a"): 999, ACCOUNT: 300}
    chained = in_chain(draws, A, B)
    assert chained == {("table", "tokens", "a"): 400, ("queue", "q-a"): 70,
                       ("table", "state-a", "p1"): 100, ACCOUNT: 300}
    assert ceiling(chained, 100).msgs_per_s == pytest.approx(500)


def test_each_token_shard_is_a_budget_of_its_own_and_maps_to_the_same_shard_upstream() -> None:
    """Four shards share A's token draws: each carries a quarter, so the ceiling is four times
    one partition's; B's shard k is charged to A's shard k, never to another endpoint
    whose name only starts like A's."""
    draws: dict[tuple[str, ...], int] = {ACCOUNT: 300, ("table", "tokens", "ab"): 999}
    for shard, key in enumerate(["a", "a~1", "a~2", "a~3"]):
        draws[("table", "tokens", key)] = 50
        draws[("table", "tokens", "b" if shard == 0 else f"b~{shard}")] = 50
    chained = in_chain(draws, A, B)
    assert chained == {("table", "tokens", "a"): 100, ("table", "tokens", "a~1"): 100,
                       ("table", "tokens", "a~2"): 100, ("table", "tokens", "a~3"): 100,
                       ACCOUNT: 300}
    assert ceiling(chained, 100).msgs_per_s == pytest.approx(2_000)
