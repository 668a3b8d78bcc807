"""An ``async def`` handler under the Functions app runs on the worker's event loop: the
trigger function hands the delivery to a thread, which hands the coroutine back
(``bus.coroutines``; the other hosts: tests/protocol/test_async_handlers.py)."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import azure.durable_functions as df
import azure.functions as func

from bus import Context, Endpoint
from bus.hosting.functions.app import BusFunctions, trigger_function_name
from tests.protocol.test_async_handlers import Pay

DURABLE_CLIENT = json.dumps({  # what the host binds; no orchestration starts here
    "taskHubName": "hub", "creationUrls": {}, "managementUrls": {},
    "baseUrl": "http://127.0.0.1:9/runtime/webhooks/durabletask",
    "rpcBaseUrl": "http://127.0.0.1:9/runtime/webhooks/durabletask",
    "requiredQueryStringParameters": ""})


def test_an_async_handler_runs_on_the_functions_workers_event_loop(tmp_path: Path) -> None:
    """The Functions app's trigger function (``BusFunctions``) is an async function on the
    worker's event loop that hands the delivery to a thread; the handler's coroutine comes
    back to that loop, as an async function of the app would run."""
    loops: list[asyncio.AbstractEventLoop] = []
    desk = Endpoint("desk")

    @desk.handles(Pay, partition=lambda m: m.ref)
    async def pay(message: Pay, ctx: Context) -> None:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        ctx.state.put("paid", {"cents": message.cents})

    (tmp_path / "host.json").write_text("{}")
    functions = BusFunctions([desk], environ={"AzureWebJobsStorage": "memory:async-handlers"},
                             host_json=tmp_path / "host.json")
    bus = functions.bus
    bus.provision()
    bus.send(Pay(ref="p3", cents=7))
    worker_loop = invoke_once(functions, "desk")
    assert loops == [worker_loop]
    assert bus.read_state("desk", "p3", "paid") == {"cents": 7}


def invoke_once(functions: BusFunctions, endpoint: str) -> asyncio.AbstractEventLoop:
    """Lease ``endpoint``'s next message and invoke its trigger function with it, as the
    worker does (on an event loop); the loop it ran on."""
    bus = functions.bus
    [signal] = bus.storage.queues.receive(bus.names.queue(endpoint), max_messages=1,
                                          lease=30.0)
    app = df.DFApp()
    app.register_functions(functions)
    [function] = [f for f in app.get_functions()
                  if f.get_function_name() == trigger_function_name(endpoint)]
    message = func.QueueMessage(body=base64.b64decode(signal.body))

    async def invocation() -> asyncio.AbstractEventLoop:
        await function.get_user_function()(msg=message, client=DURABLE_CLIENT, context=None)
        return asyncio.get_running_loop()

    return asyncio.run(invocation())
