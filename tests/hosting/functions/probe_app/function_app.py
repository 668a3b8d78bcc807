"""A one-function app for the devhost's listener tests: a queue trigger on ``PROBE_QUEUE`` that
records each call and then behaves as ``PROBE_MODE`` says (``ok``, ``fail``, ``sleep:<s>``)."""

from __future__ import annotations

import os
import time

import azure.functions as func

CALLS: list[tuple[str, int]] = []
"""(body, dequeue count) of every invocation, in order."""

app = func.FunctionApp()


@app.function_name("probe")
@app.queue_trigger(arg_name="msg", queue_name="%PROBE_QUEUE%", connection="AzureWebJobsStorage")
def probe(msg: func.QueueMessage) -> None:
    CALLS.append((msg.get_body().decode("utf-8"), msg.dequeue_count or 0))
    mode = os.environ.get("PROBE_MODE", "ok")
    if mode == "fail":
        raise RuntimeError("always fails")
    if mode.startswith("sleep:"):
        time.sleep(float(mode.removeprefix("sleep:")))
