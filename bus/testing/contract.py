"""The storage contract: what every backend must do for the protocol to be correct.

Subclass :class:`StorageContract` and provide a ``storage`` fixture; pytest runs every check
against your backend, each on fresh queue, container and table names::

    class TestMine(StorageContract):
        @pytest.fixture
        def storage(self): return MyStorage()
"""

from __future__ import annotations

import time
import uuid

import pytest

from bus.storage import (
    Conflict,
    Entity,
    EntityValue,
    Missing,
    NotFound,
    PreconditionFailed,
    Refused,
    Storage,
    TableOp,
    TooLarge,
)
from bus.storage.limits import StorageLimits


class StorageContract:
    @pytest.fixture
    def name(self) -> str:
        return "c" + uuid.uuid4().hex[:12]

    @pytest.fixture
    def table(self) -> str:
        return "t" + uuid.uuid4().hex[:12]

    # -- what is not provisioned ------------------------------------------------------------
    def test_a_missing_queue_table_or_container_is_missing(self, storage: Storage,
                                                          name: str, table: str) -> None:
        """Not an absent item: the resource itself. The protocol never reads it as "no row
        yet", and a send says to provision."""
        with pytest.raises(Missing):
            storage.queues.send(name, "eA==")
        with pytest.raises(Missing):
            storage.tables.get(table, "p", "r")
        with pytest.raises(Missing):
            storage.tables.insert(table, Entity("p", "r", {"n": 1}))
        with pytest.raises(Missing):
            storage.tables.transact(table, [TableOp("insert", Entity("p", "r", {"n": 1}))])
        with pytest.raises(Missing):
            storage.blobs.write(name, "b", b"x")
        storage.tables.create_table(table)
        with pytest.raises(NotFound) as absent_row:
            storage.tables.get(table, "p", "r")
        assert not isinstance(absent_row.value, Missing)

    # -- queues -------------------------------------------------------------------------------
    def test_queue_send_receive_delete(self, storage: Storage, name: str) -> None:
        storage.queues.create_queue(name)
        storage.queues.send(name, "aGVsbG8=")
        [message] = storage.queues.receive(name, max_messages=5, lease=30)
        assert (message.body, message.dequeue_count) == ("aGVsbG8=", 1)
        assert storage.queues.receive(name, max_messages=5, lease=30) == []
        storage.queues.delete(name, message)
        assert storage.queues.depth(name) == 0

    def test_queue_release_redelivers_with_higher_dequeue_count(self, storage: Storage,
                                                               name: str) -> None:
        storage.queues.create_queue(name)
        storage.queues.send(name, "Ym9keQ==")
        [first] = storage.queues.receive(name, max_messages=1, lease=30)
        storage.queues.extend(name, first, lease=0)
        [again] = storage.queues.receive(name, max_messages=1, lease=30)
        assert again.dequeue_count == 2

    def test_queue_stale_pop_receipt_is_not_found(self, storage: Storage, name: str) -> None:
        storage.queues.create_queue(name)
        storage.queues.send(name, "eA==")
        [message] = storage.queues.receive(name, max_messages=1, lease=30)
        renewed = storage.queues.extend(name, message, lease=30)
        assert renewed.pop_receipt != message.pop_receipt
        with pytest.raises(NotFound):
            storage.queues.delete(name, message)
        storage.queues.delete(name, renewed)

    def test_queue_send_with_delay_is_invisible(self, storage: Storage, name: str) -> None:
        storage.queues.create_queue(name)
        storage.queues.send(name, "eA==", delay=60)
        assert storage.queues.receive(name, max_messages=1, lease=30) == []
        assert storage.queues.depth(name) == 1
        assert storage.queues.oldest(name) is None  # nothing visible

    def test_queue_oldest_is_the_front_message_s_time(self, storage: Storage,
                                                      name: str) -> None:
        storage.queues.create_queue(name)
        assert storage.queues.oldest(name) is None
        before = time.time()
        storage.queues.send(name, "eA==")
        storage.queues.send(name, "eQ==")
        oldest = storage.queues.oldest(name)
        assert oldest is not None and before - 2 <= oldest <= time.time() + 2  # clocks differ
        assert len(storage.queues.receive(name, max_messages=2, lease=30)) == 2  # unchanged
        assert storage.queues.oldest(name) is None  # both leased

    def test_queue_peek_shows_the_visible_bodies_and_leases_none(self, storage: Storage,
                                                                 name: str) -> None:
        storage.queues.create_queue(name)
        assert storage.queues.peek(name, max_messages=32) == []
        for body in ("eA==", "eQ==", "eg=="):
            storage.queues.send(name, body)
        storage.queues.send(name, "dw==", delay=60)
        assert storage.queues.peek(name, max_messages=2) == ["eA==", "eQ=="]
        assert storage.queues.peek(name, max_messages=32) == ["eA==", "eQ==", "eg=="]
        leased = storage.queues.receive(name, max_messages=3, lease=30)  # peeks leased none
        assert [m.body for m in leased] == ["eA==", "eQ==", "eg=="]
        assert [m.dequeue_count for m in leased] == [1, 1, 1]
        assert storage.queues.peek(name, max_messages=32) == []  # leased ones are not shown

    # -- blobs --------------------------------------------------------------------------------
    def test_blob_create_only_conflicts(self, storage: Storage, name: str) -> None:
        storage.blobs.create_container(name)
        etag = storage.blobs.write(name, "a/b", b"one", create_only=True)
        with pytest.raises(Conflict):
            storage.blobs.write(name, "a/b", b"two", create_only=True)
        assert storage.blobs.read(name, "a/b") == type(storage.blobs.read(name, "a/b"))(
            b"one", etag)

    def test_blob_compare_and_swap(self, storage: Storage, name: str) -> None:
        storage.blobs.create_container(name)
        first = storage.blobs.write(name, "t.json", b"1")
        second = storage.blobs.write(name, "t.json", b"2", etag=first)
        with pytest.raises(PreconditionFailed):
            storage.blobs.write(name, "t.json", b"3", etag=first)
        assert storage.blobs.read(name, "t.json").etag == second

    def test_a_bounded_read_stops_one_byte_past_the_limit(self, storage: Storage,
                                                          name: str) -> None:
        storage.blobs.create_container(name)
        storage.blobs.write(name, "big", b"x" * 5_000)
        storage.blobs.write(name, "small", b"abc")
        storage.blobs.write(name, "empty", b"")
        assert storage.blobs.read(name, "big", max_bytes=1_000).data == b"x" * 1_001
        assert storage.blobs.read(name, "small", max_bytes=1_000).data == b"abc"
        assert storage.blobs.read(name, "empty", max_bytes=1_000).data == b""

    def test_blob_delete_and_list(self, storage: Storage, name: str) -> None:
        storage.blobs.create_container(name)
        storage.blobs.write(name, "x/1", b"")
        storage.blobs.write(name, "y/2", b"")
        assert storage.blobs.list(name, "x/") == ["x/1"]
        storage.blobs.delete(name, "x/1")
        with pytest.raises(NotFound):
            storage.blobs.read(name, "x/1")
        with pytest.raises(NotFound):
            storage.blobs.delete(name, "x/1")

    # -- tables -------------------------------------------------------------------------------
    def test_table_insert_conflicts(self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        storage.tables.insert(table, Entity("p", "r", {"n": 1}))
        with pytest.raises(Conflict):
            storage.tables.insert(table, Entity("p", "r", {"n": 2}))
        assert storage.tables.get(table, "p", "r").properties["n"] == 1

    def test_table_replace_with_stale_etag_fails(self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        etag = storage.tables.insert(table, Entity("p", "r", {"n": 1}))
        storage.tables.replace(table, Entity("p", "r", {"n": 2}), etag=etag)
        with pytest.raises(PreconditionFailed):
            storage.tables.replace(table, Entity("p", "r", {"n": 3}), etag=etag)
        with pytest.raises(PreconditionFailed):
            storage.tables.delete(table, "p", "r", etag=etag)
        storage.tables.delete(table, "p", "r")
        storage.tables.delete(table, "p", "r")  # deleting nothing is not an error
        with pytest.raises(NotFound):
            storage.tables.get(table, "p", "r")

    def test_table_values_round_trip(self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        values: dict[str, EntityValue] = {"small": 7, "big": 2**40, "negative": -(2**35),
                                          "flag": True, "ratio": 0.25, "text": "h\u00e9"}
        storage.tables.insert(table, Entity("p", "a", values))
        storage.tables.transact(table, [TableOp("insert", Entity("p", "b", values))])
        for key in ("a", "b"):
            assert storage.tables.get(table, "p", key).properties == values

    def test_table_transaction_is_all_or_nothing(self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        etag = storage.tables.insert(table, Entity("p", "slot", {"v": 1}))
        storage.tables.replace(table, Entity("p", "slot", {"v": 2}))  # etag is now stale
        with pytest.raises(PreconditionFailed):
            storage.tables.transact(table, [
                TableOp("replace", Entity("p", "state", {"n": 1})),
                TableOp("replace", Entity("p", "slot", {"v": 3}), etag)])
        with pytest.raises(NotFound):
            storage.tables.get(table, "p", "state")
        fresh = storage.tables.get(table, "p", "slot").etag
        etags = storage.tables.transact(table, [
            TableOp("insert", Entity("p", "state", {"n": 1})),
            TableOp("replace", Entity("p", "slot", {"v": 3}), fresh)])
        assert etags[1] == storage.tables.get(table, "p", "slot").etag
        with pytest.raises(Conflict):
            storage.tables.transact(table, [TableOp("insert", Entity("p", "state", {}))])

    def test_table_get_many_returns_the_existing_rows(self, storage: Storage,
                                                      table: str) -> None:
        storage.tables.create_table(table)
        for pk, rk in (("a", "1"), ("a", "2"), ("b", "3")):
            storage.tables.insert(table, Entity(pk, rk, {"s": f"{pk}{rk}"}))
        found = storage.tables.get_many(table, "a", ["2", "3", "1", "x"])
        assert {rk: e.properties["s"] for rk, e in found.items()} == {"1": "a1", "2": "a2"}
        assert found["1"].etag == storage.tables.get(table, "a", "1").etag
        assert storage.tables.get_many(table, "b", ["3"])["3"].properties["s"] == "b3"
        assert storage.tables.get_many(table, "b", ["1"]) == {}
        assert storage.tables.get_many(table, "a", []) == {}
        many = [f"k{i:02d}" for i in range(40)]  # more than one request's worth of keys
        for key in many[::3]:
            storage.tables.insert(table, Entity("m", key, {}))
        assert sorted(storage.tables.get_many(table, "m", many)) == many[::3]

    def test_table_query_partition(self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        for pk, rk in (("a", "1"), ("a", "2"), ("b", "1")):
            storage.tables.insert(table, Entity(pk, rk, {"s": f"{pk}{rk}"}))
        assert sorted(e.row_key for e in storage.tables.query(table, "a")) == ["1", "2"]
        assert len(storage.tables.query(table)) == 3
        assert sorted(e.partition_key for e in storage.tables.query(table, row_key="1")) == [
            "a", "b"]
        assert [e.properties["s"] for e in storage.tables.query(table, "b", "1")] == ["b1"]

    def test_table_query_row_key_prefix(self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        for pk, rk in (("a", "~s~1"), ("a", "~s~2"), ("b", "~s~"), ("b", "~s"), ("b", "~t~"),
                       ("c", "x~s~")):
            storage.tables.insert(table, Entity(pk, rk, {}))
        found = storage.tables.query(table, row_key_prefix="~s~")
        assert sorted((e.partition_key, e.row_key) for e in found) == [
            ("a", "~s~1"), ("a", "~s~2"), ("b", "~s~")]
        assert [e.row_key for e in storage.tables.query(table, "a", row_key_prefix="~s~2")] == [
            "~s~2"]

    def test_table_query_after_a_row_key_and_a_limit(self, storage: Storage,
                                                     table: str) -> None:
        storage.tables.create_table(table)
        for pk, rk in (("a", "1"), ("a", "2"), ("a", "3"), ("b", "1"), ("b", "4")):
            storage.tables.insert(table, Entity(pk, rk, {}))
        keys = [(e.partition_key, e.row_key)
                for e in storage.tables.query(table, "a", row_key_after="1")]
        assert keys == [("a", "2"), ("a", "3")]
        assert [(e.partition_key, e.row_key) for e in storage.tables.query(
            table, row_key_after="2")] == [("a", "3"), ("b", "4")]
        assert [e.row_key for e in storage.tables.query(table, "a", limit=2)] == ["1", "2"]
        assert [(e.partition_key, e.row_key) for e in storage.tables.query(
            table, limit=4)] == [("a", "1"), ("a", "2"), ("a", "3"), ("b", "1")]
        assert [e.row_key for e in storage.tables.query(table, "b", row_key_after="1",
                                                        limit=5)] == ["4"]
        assert [(e.partition_key, e.row_key) for e in storage.tables.query(
            table, row_key_before="2")] == [("a", "1"), ("b", "1")]
        assert [e.row_key for e in storage.tables.query(
            table, "a", row_key_after="1", row_key_before="3")] == ["2"]

    # -- limits: each backend refuses what it declares (bus.storage.limits) ------------------
    def test_limits_are_declared(self, storage: Storage) -> None:
        assert isinstance(storage.queues.limits, StorageLimits)
        assert isinstance(storage.tables.limits, StorageLimits)

    def test_a_queue_message_over_the_limit_is_too_large(self, storage: Storage,
                                                        name: str) -> None:
        storage.queues.create_queue(name)
        most = storage.queues.limits.queue_message_chars
        storage.queues.send(name, "A" * most)
        with pytest.raises(TooLarge):
            storage.queues.send(name, "A" * (most + 1))
        assert storage.queues.depth(name) == 1

    def test_a_delay_beyond_the_visibility_limit_is_refused(self, storage: Storage,
                                                           name: str) -> None:
        storage.queues.create_queue(name)
        longest = storage.queues.limits.visibility_seconds
        storage.queues.send(name, "eA==", delay=longest)
        with pytest.raises(Refused):
            storage.queues.send(name, "eA==", delay=longest + 1)
        assert storage.queues.depth(name) == 1

    def test_a_property_is_counted_in_utf16(self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        chars = storage.tables.limits.string_chars
        storage.tables.insert(table, Entity("p", "a", {"s": "x" * chars}))
        with pytest.raises(TooLarge):
            storage.tables.insert(table, Entity("p", "b", {"s": "x" * (chars + 1)}))
        # Outside the BMP a character takes four bytes: half as many fit.
        storage.tables.insert(table, Entity("p", "c", {"s": "\U0001f600" * (chars // 2)}))
        with pytest.raises(TooLarge):
            storage.tables.insert(table, Entity("p", "d", {"s": "\U0001f600" * (chars // 2 + 1)}))
        assert sorted(e.row_key for e in storage.tables.query(table, "p")) == ["a", "c"]

    def test_an_entity_over_the_limit_is_too_large(self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        limits = storage.tables.limits
        piece = "x" * (limits.string_chars - 10)
        count = limits.entity_bytes // limits.property_bytes + 1
        with pytest.raises(TooLarge):
            storage.tables.replace(table, Entity("p", "a", {f"p{i}": piece
                                                           for i in range(count)}))
        with pytest.raises(TooLarge):
            storage.tables.transact(table, [TableOp("insert", Entity("p", "b", {
                f"p{i}": piece for i in range(count)}))])
        storage.tables.insert(table, Entity("p", "c", {f"p{i}": piece
                                                       for i in range(count - 2)}))
        assert [e.row_key for e in storage.tables.query(table, "p")] == ["c"]

    def test_too_many_properties_or_an_int_beyond_int64_are_refused(
            self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        most = storage.tables.limits.user_properties
        storage.tables.insert(table, Entity("p", "a", {f"p{i}": i for i in range(most)}))
        with pytest.raises(Refused):
            storage.tables.insert(table, Entity("p", "b", {f"p{i}": i for i in range(most + 1)}))
        with pytest.raises(Refused):
            storage.tables.insert(table, Entity("p", "c", {"n": 2**63}))

    def test_a_key_with_a_forbidden_character_or_too_long_is_refused(
            self, storage: Storage, table: str) -> None:
        storage.tables.create_table(table)
        chars = storage.tables.limits.key_bytes // 2
        storage.tables.insert(table, Entity("p", "k" * chars, {"n": 1}))
        with pytest.raises(TooLarge):
            storage.tables.insert(table, Entity("p", "k" * (chars + 1), {"n": 1}))
        for bad in ("a/b", "a#b", "a?b", "a\\b", "a\x07b"):
            with pytest.raises(Refused):
                storage.tables.insert(table, Entity("p", bad, {"n": 1}))

    def test_a_transaction_over_the_limits_is_refused_whole(self, storage: Storage,
                                                          table: str) -> None:
        storage.tables.create_table(table)
        limits = storage.tables.limits
        with pytest.raises(Refused):
            storage.tables.transact(table, [TableOp("insert", Entity("p", f"r{i}", {}))
                                            for i in range(limits.transaction_operations + 1)])
        piece = "x" * (limits.string_chars - 10)
        per_row = limits.entity_bytes // limits.property_bytes - 1
        rows = limits.transaction_bytes // (per_row * limits.string_chars) + 1
        with pytest.raises(TooLarge):
            storage.tables.transact(table, [
                TableOp("insert", Entity("p", f"big{r}", {f"p{i}": piece
                                                          for i in range(per_row)}))
                for r in range(rows)])
        assert storage.tables.query(table, "p") == []
