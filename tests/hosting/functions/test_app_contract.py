"""What the Python worker would send the Functions host for function_app.py.

Core Tools cannot run here, so this pins the contract instead: the raw bindings each function
declares (the JSON the worker sends at indexing), and the signature rules the worker checks.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import azure.functions as func
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def function_app() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AzureWebJobsStorage", "UseDevelopmentStorage=true")
        mp.setenv("AzureWebJobsScriptRoot", str(ROOT))
        sys.modules.pop("function_app", None)
        yield importlib.import_module("function_app")


_FUNCTIONS: dict[int, list[Any]] = {}


def _functions(app: Any) -> list[Any]:
    # The worker calls get_functions() once; a second call raises (duplicate names).
    if id(app) not in _FUNCTIONS:
        _FUNCTIONS[id(app)] = app.get_functions()
    return _FUNCTIONS[id(app)]


def _bindings(app: Any) -> dict[str, list[dict[str, Any]]]:
    return {f.get_function_name(): [json.loads(b) for b in f.get_raw_bindings()]
            for f in _functions(app)}


def test_exactly_one_function_register(function_app: ModuleType) -> None:
    registers = [v for v in vars(function_app).values() if isinstance(v, func.FunctionRegister)]
    assert len(registers) == 1


def test_queue_triggers_bind_each_endpoint_queue(function_app: ModuleType) -> None:
    app, bus = function_app.app, function_app.bus_functions.bus
    bindings = _bindings(app)
    for endpoint in ("orders", "billing", "shipping"):
        declared = bindings[f"bus_endpoint_{endpoint}"]
        assert {"direction": "IN", "type": "queueTrigger", "name": "msg",
                "queueName": bus.names.queue(endpoint),
                "connection": "AzureWebJobsStorage"} in declared
        assert {"direction": "IN", "type": "durableClient", "name": "client"} in declared


def test_durable_and_timer_functions(function_app: ModuleType) -> None:
    bindings = _bindings(function_app.app)
    assert bindings["bus_outbox"] == [{"direction": "IN", "type": "orchestrationTrigger",
                                       "name": "context", "orchestration": "bus_outbox"}]
    for activity in ("bus_outbox_prepare", "bus_outbox_signal", "bus_outbox_finish"):
        assert bindings[activity] == [{"direction": "IN", "type": "activityTrigger",
                                       "name": "job", "activity": activity}]
    timer = bindings["bus_maintenance"][0]
    assert timer["type"] == "timerTrigger" and len(timer["schedule"].split()) == 6
    assert len(bindings) == 3 + 1 + 3 + 1


def test_signatures_match_bindings(function_app: ModuleType) -> None:
    """The worker refuses a function whose parameters do not match its binding names (but
    for ``context``, the invocation's, annotated func.Context: azure_functions_runtime's
    ``FunctionInfo.is_context_required``), and a queue trigger parameter annotated with
    anything but QueueMessage/str/bytes."""
    for function in _functions(function_app.app):
        names = {json.loads(b)["name"] for b in function.get_raw_bindings()}
        parameters = inspect.signature(function.get_user_function()).parameters
        assert set(parameters) - {"context"} == names - {"context"}, function.get_function_name()
        if "context" in parameters and "context" not in names:
            assert parameters["context"].annotation in (func.Context, "func.Context")
        trigger = function.get_trigger()
        if trigger.get_binding_name() == "queueTrigger":
            assert parameters["msg"].annotation in (func.QueueMessage, "func.QueueMessage")
            assert inspect.iscoroutinefunction(function.get_user_function())


def test_host_json_contract() -> None:
    host = json.loads((ROOT / "host.json").read_text())
    assert host["version"] == "2.0"
    assert host["extensionBundle"] == {"id": "Microsoft.Azure.Functions.ExtensionBundle",
                                       "version": "[4.*, 5.0.0)"}
    queues = host["extensions"]["queues"]
    assert queues["messageEncoding"] == "base64"
    assert 1 <= queues["batchSize"] <= 32
    settings = json.loads((ROOT / "local.settings.sample.json").read_text())["Values"]
    assert settings["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"
    assert settings["FUNCTIONS_WORKER_RUNTIME"] == "python"


def test_funcignore_keeps_tooling_out() -> None:
    ignored = (ROOT / ".funcignore").read_text().split()
    for entry in ("devhost/", "tests/", ".venv/", "node_modules/", "local.settings.json"):
        assert entry in ignored
