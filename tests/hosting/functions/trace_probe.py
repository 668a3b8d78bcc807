"""One order through the sample app with an OpenTelemetry SDK installed globally, as in a
deployed app, every function invoked through Microsoft's worker: the orders queue trigger
(given the invocation's trace context as the host sends it, its record handed off to the
Durable client), the outbox orchestration through the real Durable replay engine and its
activities, then billing and shipping by polling workers. Prints each finished span as a JSON
line. Run in a process of its own (``tests/hosting/functions/test_trace_durable.py``): a global
tracer provider can be set once per process.

    python -m tests.hosting.functions.trace_probe CONNECTION PREFIX
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parents[3]
INVOCATION = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
"""The orders invocation's trace context, as the host passes it (Activity.Current.Id)."""


async def one_order(connection: str, prefix: str) -> None:
    from azure.storage.queue import QueueClient

    import bus.hosting.local.worker
    from bus.hosting.functions.app import trigger_function_name
    from bus.hosting.local import bindings
    from bus.hosting.local.durable import DurableApi, DurableRuntime
    from bus.hosting.local.hostio import Connection
    from bus.testing import drain

    bus.hosting.local.worker._traceparent = lambda: INVOCATION  # what the host would send
    worker = bus.hosting.local.worker.Worker(ROOT)
    index = await worker.start()
    try:
        module = sys.modules["function_app"]
        bus = module.bus_functions.bus
        bus.provision()
        bus.send(module.PlaceOrder(order_id="t1", customer="c1", amount_cents=250))
        runtime = DurableRuntime(index, worker, Connection("AzureWebJobsStorage", connection),
                                 f"h{prefix}")
        runtime.provision()
        started: list[str] = []
        start = runtime.start

        def recorded(name: str, instance: str, input_json: str | None) -> tuple[int, Any]:
            started.append(instance)
            return start(name, instance, input_json)

        runtime.start = recorded  # type: ignore[method-assign]
        api = DurableApi(runtime)
        await api.start()
        queue = QueueClient.from_connection_string(connection, bus.names.queue("orders"))
        [message] = list(queue.receive_messages(max_messages=1, visibility_timeout=60))
        body = base64.b64decode(message.content).decode()
        trigger, metadata = bindings.queue_trigger(message, body)
        await worker.invoke(index.named(trigger_function_name("orders")),
                            {"msg": trigger, "client": bindings.durable_client(
                                api.client_binding())}, metadata)
        queue.delete_message(message)  # the host deletes it once the function returned
        [instance] = started
        await runtime.drive(instance)
        await api.stop()
        await asyncio.to_thread(drain, bus, ["billing", "shipping"])
    finally:
        worker.stop()


def main(connection: str, prefix: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    os.environ.update(AzureWebJobsStorage=connection, BUS_PREFIX=prefix,
                      BUS_INLINE_DISPATCH_MAX="0", AzureWebJobsScriptRoot=str(ROOT))
    asyncio.run(one_order(connection, prefix))
    for span in exporter.get_finished_spans():
        print(span.to_json(indent=None))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
