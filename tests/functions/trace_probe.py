"""One order through the sample app with an OpenTelemetry SDK installed globally, as in a
deployed app: the orders handler through the queue trigger's code (its record handed off),
the outbox orchestration through the real Durable replay engine with every activity invoked
through Microsoft's worker, then billing and shipping. Prints each finished span as a JSON
line. Run in a process of its own (``tests/functions/test_trace_durable.py``): a global
tracer provider can be set once per process.

    python -m tests.functions.trace_probe CONNECTION PREFIX
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parents[2]
INVOCATION = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
"""The orders invocation's trace context, as the host would pass it."""


def main(connection: str, prefix: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    os.environ.update(AzureWebJobsStorage=connection, BUS_PREFIX=prefix,
                      BUS_INLINE_DISPATCH_MAX="0", AzureWebJobsScriptRoot=str(ROOT))

    from bus.hosting.functions.app import ORCHESTRATOR, job_for
    from bus.hosting.functions.trigger import QueueTrigger
    from bus.testing import drain
    from devhost.durable import DurableRuntime
    from devhost.hostio import Connection
    from devhost.worker import Worker

    worker = Worker(ROOT)
    asyncio.run(worker.start())
    try:
        module = sys.modules["function_app"]
        bus = module.bus_functions.bus
        bus.provision()
        bus.send(module.PlaceOrder(order_id="t1", customer="c1", amount_cents=250))
        [message] = bus.storage.queues.receive(bus.names.queue("orders"), max_messages=1,
                                               lease=30)
        trigger = QueueTrigger(bus, "orders", max_dequeue_count=5, inline_dispatch_max=0)
        delivery = trigger.deliver(base64.b64decode(message.body), 1,
                                   {"traceparent": INVOCATION})
        bus.storage.queues.delete(bus.names.queue("orders"), message)
        assert delivery.handoff is not None, delivery
        runtime = DurableRuntime(worker.index, worker,
                                 Connection("AzureWebJobsStorage", connection), f"h{prefix}")
        runtime.provision()
        status, _ = runtime.start(ORCHESTRATOR, "t1", json.dumps(job_for(delivery.handoff)))
        assert status == 202, status
        asyncio.run(runtime.drive("t1"))
        drain(bus, ["billing", "shipping"])
    finally:
        worker.stop()
    for span in exporter.get_finished_spans():
        print(span.to_json(indent=None))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
