"""The settlement's rules, through the polling worker (the Functions trigger's are in
tests/hosting/functions/test_requeue.py): a copy's carried delivery count counts, storage errors
never poison a message on a host that poisons nothing on its own - on the in-memory backend and
Azurite."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import pytest

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.hosting.worker import Worker
from bus.storage import Storage, TableOp, TransientError
from bus.testing import MessagesPoisoned, drain

MAX = 3


class Job(Command):
    n: int
    fail: bool = False


def build(storage: Storage, prefix: str) -> tuple[Bus, list[int], list[int]]:
    """The bus, the jobs done and every handler run."""
    jobs = Endpoint("jobs", retry=RetryPolicy(immediate=1, delays=(0.0,)))
    done: list[int] = []
    runs: list[int] = []

    @jobs.handles(Job, partition=lambda m: str(m.n))
    def job(message: Job, ctx: Context) -> None:
        runs.append(message.n)
        if message.fail:
            raise RuntimeError(f"job {message.n} fails")
        done.append(message.n)

    bus = Bus(storage, [jobs], prefix=prefix, settings=Settings(max_delivery_count=MAX))
    bus.provision()
    return bus, done, runs


def carrying(bus: Bus, deliveries: int) -> None:
    """Re-queue the one signal on the queue as a copy carrying ``deliveries``."""
    queue = bus.names.queue("jobs")
    [message] = bus.storage.queues.receive(queue, max_messages=1, lease=30)
    document = json.loads(base64.b64decode(message.body))
    copy = json.dumps({**document, "deliveries": deliveries}).encode()
    bus.storage.queues.send(queue, base64.b64encode(copy).decode())
    bus.storage.queues.delete(queue, message)


def test_the_worker_counts_the_deliveries_a_copy_carries(storage: Storage,
                                                         prefix: str) -> None:
    bus, _, runs = build(storage, prefix)
    bus.send(Job(n=1, fail=True))
    carrying(bus, MAX - 1)  # its first delivery here is its last allowed
    with pytest.raises(MessagesPoisoned) as poisoned:
        drain(bus)
    [letter] = poisoned.value.letters
    assert letter.entry.reason == f"handler failed {MAX} times (max delivery count)"
    assert letter.entry.dequeue_count == MAX
    assert runs == [1]  # one delivery here: the copy had had MAX - 1 already


def test_storage_errors_never_poison_on_the_polling_worker(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bus, done, _ = build(storage, prefix)
    state, transact = bus.names.state_table("jobs"), storage.tables.transact
    outage = {"on": True}

    def failing(table: str, ops: Sequence[TableOp]) -> list[str]:
        if table == state and outage["on"]:
            raise TransientError("injected: the commit's request timed out")
        return transact(table, ops)

    monkeypatch.setattr(storage.tables, "transact", failing)
    bus.send(Job(n=7))
    worker = Worker(bus, "jobs", retry_delay=0, in_process_tries=1)
    for _ in range(2 * MAX):  # twice the max delivery count, every commit failing
        assert worker.poll_once() == 1
    assert worker.outcomes == {}  # released each time (the handler ran, nothing committed)
    outage["on"] = False
    assert worker.poll_once() == 1
    assert worker.outcomes == {"processed": 1} and done[-1] == 7
    assert bus.poisoned("jobs").entries() == []
