"""Token shards (``bus.protocol.tokens.shards``): each attempt id names its token's partition,
a batch over several partitions is split into one request per partition, and what is found by
message id (deferrals, send marks) is found whatever the shards were."""

from __future__ import annotations

import itertools
import zlib

import pytest

from bus import Bus, Command, Context, Endpoint, Settings
from bus.adapters.memory import InMemoryStorage
from bus.protocol.tokens.inbox import Inbox, TokenState
from bus.protocol.tokens.shards import (
    SHARDS,
    ShardedIds,
    endpoint_of,
    in_shard,
    partition,
    shard_of,
    widest,
)
from bus.seams import Seams
from bus.storage import Storage
from bus.testing import drain
from bus.testing.counting import counting_storage
from bus.testing.seamed import seamed_bus


class Add(Command):
    key: str


class Hold(Command):
    key: str


def numbered_ids() -> ShardedIds:
    n = itertools.count()
    return ShardedIds(lambda: f"{next(n):032x}", 3, run=2)


def test_an_attempt_id_names_its_shard_and_an_id_from_before_shards_names_shard_0() -> None:
    assert [shard_of(in_shard("f" * 32, k)) for k in range(SHARDS)] == list(range(SHARDS))
    assert in_shard("abc", 0) == "abc" and partition("desk", "abc") == "desk"
    assert partition("desk", "abc_3") == "desk~3" and endpoint_of("desk~3") == "desk"
    # Only a digit of a shard there is counts: anything else is an id like any other.
    assert [shard_of(i) for i in ("abc_8", "abc_0", "abc-3", "abc_33", "_")] == [0] * 5
    assert endpoint_of("desk~8") == "desk~8" and endpoint_of("a.b_c-d") == "a.b_c-d"
    assert len(widest("f" * 32)) == len(widest(in_shard("f" * 32, 2))) == 34
    with pytest.raises(ValueError, match="shard 8 is not one of 0-7"):
        in_shard("abc", SHARDS)


def test_ids_stay_in_a_shard_for_a_run_then_move_to_the_next_from_where_the_first_began() -> None:
    ids = numbered_ids()
    shards = [shard_of(ids()) for _ in range(8)]
    first = zlib.crc32(f"{0:032x}".encode()) % 3  # where the first id made starts it
    assert shards == [(first + k // 2) % 3 for k in range(8)]  # runs of 2 over 3 shards
    plain = ShardedIds(lambda: "f" * 32, 1)
    assert plain() == "f" * 32  # one shard: ids as before shards
    with pytest.raises(ValueError, match="token shards must be 1-8"):
        ShardedIds(lambda: "x", 9)


def test_a_batch_over_three_shards_is_one_request_per_shard(storage: Storage,
                                                             prefix: str) -> None:
    counted, count = counting_storage(storage)
    counted.tables.create_table(f"{prefix}tokens")
    inbox = Inbox(counted.tables, f"{prefix}tokens")
    ids = [in_shard(f"{n:032x}", n % 3) for n in range(9)]
    count.reset()
    etags = inbox.create_many("desk", [(i, f"m{n}") for n, i in enumerate(ids)], 1.0)
    assert len(etags) == 9 and all(etags)
    assert count.snapshot() == {("table", "transact"): 3}
    assert sorted(inbox.read_many("desk", ids)) == sorted(ids)
    assert sorted(t.attempt_id for t in inbox.all("desk")) == sorted(ids)
    assert {t.endpoint for t in inbox.all()} == {"desk"}
    count.reset()
    inbox.consume_many("desk", ids)
    assert count.snapshot() == {("table", "transact"): 3}
    assert inbox.all("desk") == []


def test_a_deferral_is_found_in_any_shard_and_the_deferred_copy_wins(storage: Storage,
                                                                      prefix: str) -> None:
    """A deferred copy superseded (fenced) and a later copy of the same message deferred in
    another shard: both shards index the message; the deferred token is the one found."""
    storage.tables.create_table(f"{prefix}tokens")
    inbox = Inbox(storage.tables, f"{prefix}tokens")
    old, new = in_shard("a" * 32, 5), in_shard("b" * 32, 2)
    inbox.create_many("desk", [(old, "m")], 1.0)
    token = inbox.read("desk", old)
    assert token is not None and inbox.defer(token, "signal", 2.0)
    inbox.fence("desk", old, "m", 3.0)
    inbox.create_many("desk", [(new, "m")], 4.0)
    token = inbox.read("desk", new)
    assert token is not None and inbox.defer(token, "signal", 5.0)
    found = inbox.find("desk", "m")
    assert found is not None and (found.attempt_id, found.state) == (new, TokenState.DEFERRED)
    assert inbox.find("desk", "other") is None


def sharded_bus(storage: Storage, shards: int, run: int, seen: list[str]) -> Bus:
    desk = Endpoint("desk")

    @desk.handles(Add, partition=lambda m: m.key)
    def add(message: Add, ctx: Context) -> None:
        seen.append(message.key)
        ctx.state.put("n", {"n": 1})

    @desk.handles(Hold, partition=lambda m: m.key)
    def hold(message: Hold, ctx: Context) -> None:
        if not seen.count(f"held {message.key}"):
            seen.append(f"held {message.key}")
            ctx.defer()
            return
        seen.append(message.key)

    return seamed_bus(Seams(shard_run=run), storage, [desk],
                      settings=Settings(token_shards=shards))


def test_messages_spread_over_the_shards_and_each_is_processed_once() -> None:
    storage, seen = InMemoryStorage(), []
    bus = sharded_bus(storage, SHARDS, 1, seen)
    bus.provision()
    keys = [f"k{i}" for i in range(16)]
    bus.send_many([Add(key=k) for k in keys])
    partitions = {row.partition_key for row in storage.tables.rows(bus.names.tokens_table)}
    assert partitions == {"desk", *(f"desk~{k}" for k in range(1, SHARDS))}
    assert drain(bus).total() == {"processed": 16}
    assert sorted(seen) == sorted(keys)
    assert list(storage.tables.rows(bus.names.tokens_table)) == []


def test_tokens_made_with_more_shards_are_processed_and_released_by_a_bus_with_one() -> None:
    """The number of shards changed between the send and the processing (a redeployment):
    each id still names its shard, deferrals are still found by message id."""
    storage, seen = InMemoryStorage(), []
    sender = sharded_bus(storage, SHARDS, 1, seen)
    sender.provision()
    # with a run of one id, two sends in a row name two neighbouring shards: one is not 0
    sender.send_many([Add(key="a"), Hold(key="h"), Hold(key="i")])
    receiver = sharded_bus(storage, 1, 100, seen)
    assert drain(receiver).total() == {"processed": 1, "deferred": 2}
    deferred = receiver.deferred("desk").list()
    assert {shard_of(d.envelope.attempt_id) for d in deferred} - {0}  # made with 8 shards
    for each in deferred:
        assert receiver.deferred("desk").release(each.envelope.message_id)
    assert drain(receiver).total() == {"processed": 2}
    assert sorted(seen) == ["a", "h", "held h", "held i", "i"]


def test_marked_sends_stay_in_shard_0_so_their_marks_are_found_whatever_the_shards() -> None:
    storage, seen = InMemoryStorage(), []
    bus = sharded_bus(storage, SHARDS, 1, seen)
    bus.provision()
    assert bus.send_once_many([(Add(key=f"k{i}"), f"m{i}") for i in range(5)]) == [True] * 5
    assert {row.partition_key for row in storage.tables.rows(bus.names.tokens_table)} == {
        "desk", "~marks"}  # and the marks' log
    again = sharded_bus(storage, 3, 1, seen)
    assert again.send_once_many([(Add(key=f"k{i}"), f"m{i}") for i in range(5)]) == [False] * 5
    # The second call found each mark, noted as signalled: it sent nothing again.
    assert drain(bus).total() == {"processed": 5}
    with pytest.raises(ValueError, match="must name no shard"):
        bus.parts.inbox.create_marked("desk", [(in_shard("c" * 32, 1), "m9", None)], 1.0)
