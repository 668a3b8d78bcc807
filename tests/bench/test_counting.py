"""The counting wrapper: transparent (passes the storage contract), exact, thread-safe."""

from __future__ import annotations

import inspect
import threading
import time

import pytest

from bench.workload import HOP_FROM, Ping, hop_endpoints
from bus import Bus
from bus.hosting.worker import Worker
from bus.storage import Blobs, Entity, NotFound, Queues, Storage, Tables
from bus.storage.observed import ObservedBlobs, ObservedQueues, ObservedTables
from bus.testing import InMemoryStorage, OpCounter, counting_storage
from bus.testing.contract import StorageContract


class TestCountingStorageKeepsTheContract(StorageContract):
    @pytest.fixture
    def storage(self) -> Storage:
        return counting_storage(InMemoryStorage())[0]


def _members(protocol: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(protocol, inspect.isfunction)
            if not name.startswith("_")}


@pytest.mark.parametrize(("port", "wrapper"), [(Queues, ObservedQueues), (Blobs, ObservedBlobs),
                                               (Tables, ObservedTables)])
def test_every_port_method_is_wrapped(port: type, wrapper: type) -> None:
    # A port method the wrapper lacks would go uncounted (or fail): add it to counting.py.
    assert _members(port) <= _members(wrapper)


def test_each_call_is_counted_by_service_and_operation() -> None:
    storage, counter = counting_storage(InMemoryStorage())
    storage.queues.create_queue("q1")
    assert storage.queues.receive("q1", max_messages=16, lease=30) == []
    storage.queues.send("q1", "Ym9keQ==")
    [message] = storage.queues.receive("q1", max_messages=16, lease=30)
    storage.queues.delete("q1", message)
    storage.tables.create_table("t1")
    storage.tables.insert("t1", Entity("p", "r", {"n": 1}))
    with pytest.raises(NotFound):
        storage.tables.get("t1", "p", "missing")
    storage.blobs.create_container("c1")
    storage.blobs.write("c1", "b", b"x")
    storage.blobs.read("c1", "b")
    assert counter.snapshot() == {
        ("queue", "create_queue"): 1, ("queue", "receive_empty"): 1, ("queue", "send"): 1,
        ("queue", "receive"): 1, ("queue", "delete"): 1, ("table", "create_table"): 1,
        ("table", "insert"): 1, ("table", "get"): 1, ("blob", "create_container"): 1,
        ("blob", "write"): 1, ("blob", "read"): 1}
    assert counter.errors() == {("table", "get", "NotFound"): 1}
    assert counter.total(exclude=[("queue", "receive_empty")]) == 10
    counter.reset()
    assert counter.snapshot() == {} and counter.errors() == {}


def test_counts_are_exact_under_threads() -> None:
    counter = OpCounter()

    def work() -> None:
        for _ in range(2000):
            counter.add("table", "get")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.snapshot() == {("table", "get"): 16000}


def test_an_exactly_once_hop_is_counted_on_the_consuming_side_only() -> None:
    storage, counter = counting_storage(InMemoryStorage())
    bus = Bus(storage, hop_endpoints())
    bus.provision()
    client = Bus(storage, hop_endpoints())
    client.send(Ping(seq=1, key="p1", sent_at=time.time()))
    counter.reset()  # what the client did is not part of the hop
    assert Worker(bus, HOP_FROM).poll_once() == 1
    ops = counter.snapshot()
    # Protocol-independent facts of one hop: one receive, one ack, one outgoing signal,
    # one atomic commit at least. The rest is what the benchmark is there to show.
    assert ops[("queue", "receive")] == 1
    assert ops[("queue", "delete")] == 1
    assert ops[("queue", "send")] == 1
    assert ops.get(("table", "transact"), 0) >= 1
