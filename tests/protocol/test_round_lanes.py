"""A claim round's independent requests go side by side (``bus.protocol.receive.lanes``): the
commits of a round's partitions, and its acknowledgements, meet at a barrier that one-at-a-time
requests would never reach together."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bus import Bus, Command, Context, Endpoint, Settings
from bus.adapters.memory import InMemoryStorage
from bus.hosting.worker import Worker
from bus.protocol.receive.lanes import Lanes
from bus.storage import QueueMessage, Storage, TableOp, TransientError
from bus.testing.transport import ForwardingQueues

ROUND = 4


class Deposit(Command):
    account: str


class MeetingTables:
    """Tables whose transactions on ``table`` wait until ``parties`` of them are under way."""

    def __init__(self, inner: Any, parties: int) -> None:
        self._inner = inner
        self.limits = inner.limits
        self.table = ""
        self.barrier = threading.Barrier(parties, timeout=5)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def transact(self, table: str, ops: list[TableOp]) -> list[str]:
        if table == self.table:
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:  # storage trouble, as far as the bus knows
                raise TransientError("nobody met at the barrier") from None
        result: list[str] = self._inner.transact(table, ops)
        return result


class MeetingQueues(ForwardingQueues):
    def __init__(self, inner: Any, parties: int) -> None:
        super().__init__(inner)
        self.barrier = threading.Barrier(parties, timeout=5)

    def delete(self, queue: str, message: QueueMessage) -> None:
        self.barrier.wait()
        self._inner.delete(queue, message)


def build(storage: Storage, concurrency: int) -> Bus:
    bank = Endpoint("bank")

    @bank.handles(Deposit, partition=lambda m: m.account)
    def deposit(message: Deposit, ctx: Context) -> None:
        row = ctx.state.get("count") or {"n": 0}
        ctx.state.put("count", {"n": int(row["n"] or 0) + 1})

    bus = Bus(storage, [bank], settings=Settings(round_concurrency=concurrency))
    bus.provision()
    return bus


def one_round(bus: Bus) -> dict[str, int]:
    for account in range(ROUND):
        bus.send(Deposit(account=f"a{account}"))
    worker = Worker(bus, "bank", batch_size=16, renew_leases=False, in_process_tries=1)
    worker.poll_once()
    return worker.outcomes


def test_a_rounds_commits_go_side_by_side() -> None:
    plain = InMemoryStorage()
    tables = MeetingTables(plain.tables, ROUND)
    bus = build(Storage(queues=plain.queues, blobs=plain.blobs,
                        tables=tables), ROUND)  # type: ignore[arg-type]
    tables.table = bus.names.state_table("bank")
    assert one_round(bus) == {"processed": ROUND}


def test_one_at_a_time_they_never_meet() -> None:
    """The check above can fail: with ``round_concurrency=1`` the first commit waits alone
    at the barrier, gives up, and the round's messages are left to a redelivery."""
    plain = InMemoryStorage()
    tables = MeetingTables(plain.tables, ROUND)
    tables.barrier = threading.Barrier(ROUND, timeout=0.5)
    bus = build(Storage(queues=plain.queues, blobs=plain.blobs,
                        tables=tables), 1)  # type: ignore[arg-type]
    tables.table = bus.names.state_table("bank")
    assert one_round(bus).get("processed", 0) == 0


def test_a_rounds_acknowledgements_go_side_by_side() -> None:
    plain = InMemoryStorage()
    queues = MeetingQueues(plain.queues, ROUND)
    bus = build(Storage(queues=queues, blobs=plain.blobs, tables=plain.tables), ROUND)
    assert one_round(bus) == {"processed": ROUND}
    assert plain.queues.depth(bus.names.queue("bank")) == 0


def test_lanes_keep_the_order_and_run_at_once() -> None:
    lanes = Lanes(lambda n: ThreadPoolExecutor(max_workers=n), 3)
    meet = threading.Barrier(3, timeout=5)

    def task(n: int) -> int:
        meet.wait()
        return n * 10

    assert lanes.run([lambda n=n: task(n) for n in range(3)]) == [0, 10, 20]


def test_one_lane_runs_on_the_callers_thread() -> None:
    def refuse(workers: int) -> ThreadPoolExecutor:
        raise AssertionError("no pool for one lane")

    me = threading.get_ident()
    assert Lanes(refuse, 1).run([threading.get_ident, threading.get_ident]) == [me, me]


def test_a_failing_task_raises_once_every_task_ended() -> None:
    lanes = Lanes(lambda n: ThreadPoolExecutor(max_workers=n), 2)
    ran: list[int] = []

    def boom() -> None:
        raise ValueError("first")

    with pytest.raises(ValueError, match="first"):
        lanes.run([boom, lambda: ran.append(1), lambda: ran.append(2)])
    assert sorted(ran) == [1, 2]
    with pytest.raises(ValueError):
        Lanes(lambda n: ThreadPoolExecutor(max_workers=n), 0)
