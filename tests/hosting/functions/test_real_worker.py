"""function_app.py under Microsoft's Python worker (azure-functions-runtime): indexing,
parameter validation and loading are the worker's own code, as in Azure."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bus.hosting.local.worker import AppIndex, IndexingError, Worker, worker_version

ROOT = Path(__file__).resolve().parents[3]
REFUSED_APP = Path(__file__).resolve().parent / "refused_app"


@pytest.fixture
def settings() -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(AzureWebJobsStorage="UseDevelopmentStorage=true",
                      AzureWebJobsScriptRoot=str(ROOT))
    yield
    os.environ.clear()
    os.environ.update(saved)
    sys.modules.pop("function_app", None)


def _start(script_root: Path) -> AppIndex:
    worker = Worker(script_root)
    try:
        return asyncio.run(worker.start())
    finally:
        worker.stop()


def test_the_worker_loads_every_function_of_the_app(settings: None) -> None:
    index = _start(ROOT)
    sys.modules.pop("function_app")  # a fresh copy: get_functions() works once per app
    defined = importlib.import_module("function_app").app.get_functions()
    assert sorted(f.name for f in index.functions) == sorted(
        f.get_function_name() for f in defined)
    assert len(index.functions) == 8
    assert {f.trigger_type for f in index.functions} == {
        "queueTrigger", "orchestrationTrigger", "activityTrigger", "timerTrigger"}


def test_the_worker_refuses_an_app_it_cannot_load(settings: None) -> None:
    """The rule the app once broke: one refused function and no function loads."""
    with pytest.raises(IndexingError, match=r"refused.*invalid non-type annotation"):
        _start(REFUSED_APP)


def test_the_pinned_worker_is_the_one_running() -> None:
    pinned = next(line.split("==")[1].strip() for line in (ROOT / "requirements.txt")
                  .read_text().splitlines() if line.startswith("azure-functions-runtime=="))
    assert importlib.metadata.version("azure-functions-runtime") == pinned
    assert worker_version() == f"azure-functions-runtime {pinned}"


def test_raw_bindings_reach_the_host_as_the_worker_sends_them(settings: None) -> None:
    index = _start(ROOT)
    queue = index.named("bus_endpoint_orders")
    assert queue.trigger == {"direction": "IN", "type": "queueTrigger", "name": "msg",
                             "queueName": "orders", "connection": "AzureWebJobsStorage"}
    assert json.dumps(queue.binding("durableClient")) == json.dumps(
        {"direction": "IN", "type": "durableClient", "name": "client"})
