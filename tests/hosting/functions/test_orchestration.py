"""The outbox orchestration through the real Durable replay engine (devhost's runtime), every
function invoked through Microsoft's worker."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bus.hosting.functions.app import job_for, record_key
from bus.hosting.functions.trigger import QueueTrigger
from bus.hosting.local import bindings
from bus.hosting.local.durable import TASK_COMPLETED, TASK_SCHEDULED, DurableRuntime
from bus.hosting.local.hostio import Connection
from bus.hosting.local.worker import AppIndex, Worker
from bus.protocol.delivery import Outcome

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.azurite


@pytest.fixture
def worker(azurite_connection: str, prefix: str) -> Iterator[Worker]:
    saved = dict(os.environ)
    os.environ.update(AzureWebJobsStorage=azurite_connection, BUS_PREFIX=prefix,
                      BUS_INLINE_DISPATCH_MAX="0", AzureWebJobsScriptRoot=str(ROOT))
    worker = Worker(ROOT)
    asyncio.run(worker.start())
    yield worker
    worker.stop()
    os.environ.clear()
    os.environ.update(saved)
    sys.modules.pop("function_app", None)


def _call(worker: Worker, name: str, argument: Any) -> Any:
    """One activity invocation through the worker: its result, decoded."""
    function = worker.index.named(name)
    returned = asyncio.run(worker.invoke(function, {"job": bindings.activity_trigger(
        json.dumps(argument))}))
    return json.loads(bindings.returned_json(returned))


def _replay(worker: Worker, context: dict[str, Any]) -> dict[str, Any]:
    returned = asyncio.run(worker.invoke(worker.index.named("bus_outbox"), {
        "context": bindings.orchestration_trigger(context)}))
    state: dict[str, Any] = json.loads(bindings.returned_json(returned))
    return state


def test_outbox_orchestration_replays_and_survives_repeated_activities(
        worker: Worker, azurite_connection: str, prefix: str) -> None:
    module = sys.modules["function_app"]
    app: AppIndex = worker.index
    bus = module.bus_functions.bus
    bus.provision()
    bus.send(module.PlaceOrder(order_id="r1", customer="c1", amount_cents=250))
    [message] = bus.storage.queues.receive(bus.names.queue("orders"), max_messages=1, lease=30)
    trigger = QueueTrigger(bus, "orders", max_dequeue_count=5, inline_dispatch_max=0)
    import base64

    delivery = trigger.deliver(base64.b64decode(message.body), 1)
    assert delivery.outcome is Outcome.PROCESSED and delivery.handoff is not None
    assert bus.storage.queues.depth(bus.names.queue("billing")) == 0  # not dispatched yet

    runtime = DurableRuntime(app, worker, Connection("AzureWebJobsStorage", azurite_connection),
                             f"h{prefix}")
    runtime.provision()
    job = dict(job_for(delivery.handoff))
    assert record_key(job_for(delivery.handoff)) == delivery.handoff.key  # the job round trip
    old_job = {k: v for k, v in job.items() if k not in ("attempt_id", "generation")}
    assert record_key(old_job).attempt_id is None  # type: ignore[arg-type] - before the key
    # An activity runs at least once: run the whole fan-out by hand first, twice over.
    steps = ["bus_outbox_prepare", "bus_outbox_prepare", "bus_outbox_signal",
             "bus_outbox_signal", "bus_outbox_finish", "bus_outbox_finish",
             "bus_outbox_prepare", "bus_outbox_signal"]
    results = []
    for name in steps:
        arguments = {**job, "indexes": [0, 1]} if name.endswith("signal") else job
        results.append(_call(worker, name, arguments))
    # Two copies each time; the second finish and the late prepare see the record finished.
    assert results == [2, 2, 2, 2, True, False, None, 2]
    status, _ = runtime.start("bus_outbox", "i1", json.dumps(job))
    assert status == 202
    asyncio.run(runtime.drive("i1"))
    instance, _ = runtime.store.load("i1")  # type: ignore[misc]
    assert instance.status == "Completed" and instance.output == "finished elsewhere"

    # The copy to billing was signalled three times (a late signal activity re-sends: the
    # finished record stays in its slot); it is processed once.
    billing = bus.parts.receiver("billing")
    outcomes = [billing.handle(m.body, m.dequeue_count) for m in bus.storage.queues.receive(
        bus.names.queue("billing"), max_messages=32, lease=30)]
    assert sorted(o.value for o in outcomes) == ["duplicate", "duplicate", "processed"]
    assert bus.storage.tables.get(bus.names.state_table("billing"), "c1",
                                  "account").properties["invoices"] == 1

    # Replaying the final history schedules nothing new and gives the same result.
    context = {"history": instance.history, "instanceId": "i1", "isReplaying": True,
               "parentInstanceId": None, "input": instance.input, "upperSchemaVersion": 0}
    state = _replay(worker, context)
    assert state["isDone"] and state["output"] == "finished elsewhere"
    types = [e["EventType"] for e in instance.history]
    assert types.count(TASK_SCHEDULED) == types.count(TASK_COMPLETED) == 1  # prepare only

    # start_new with the id of a completed instance re-runs it; a running one is refused.
    assert runtime.start("bus_outbox", "i1", json.dumps(job))[0] == 202
    assert runtime.start("bus_outbox", "i1", json.dumps(job))[0] == 409
