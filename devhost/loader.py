"""Index a function app the way the Python worker does.

The worker imports the script file, requires exactly one top-level FunctionRegister (a
FunctionApp or a DFApp), calls ``get_functions()`` once and sends each function's raw bindings
(JSON) to the host. We do the same and keep what the host would need to invoke them.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import azure.functions as func


class IndexingError(Exception):
    """The app cannot be indexed; the message says why (as the worker would)."""


@dataclass(frozen=True)
class Function:
    name: str
    trigger_type: str
    trigger: dict[str, Any]
    bindings: list[dict[str, Any]]
    user_function: Any
    is_async: bool

    def binding(self, kind: str) -> dict[str, Any] | None:
        return next((b for b in self.bindings if b["type"] == kind), None)


@dataclass
class AppIndex:
    module: ModuleType
    app: func.FunctionRegister
    functions: list[Function] = field(default_factory=list)

    def of_type(self, trigger_type: str) -> list[Function]:
        return [f for f in self.functions if f.trigger_type == trigger_type]

    def named(self, name: str) -> Function:
        for function in self.functions:
            if function.name == name:
                return function
        raise KeyError(name)


def load_app(script_root: Path, module_name: str = "function_app") -> AppIndex:
    """Import ``<script_root>/<module_name>.py`` and index its functions."""
    root = str(script_root.resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    sys.modules.pop(module_name, None)  # a fresh import, as in a new worker process
    module = importlib.import_module(module_name)
    registers = [v for v in vars(module).values() if isinstance(v, func.FunctionRegister)]
    if len(registers) != 1:
        raise IndexingError(f"{module_name}.py must define exactly one FunctionApp or DFApp at "
                            f"module level; found {len(registers)}")
    index = AppIndex(module, registers[0])
    for function in registers[0].get_functions():
        bindings = [json.loads(raw) for raw in function.get_raw_bindings()]
        trigger = next(b for b in bindings if b["type"].endswith("Trigger"))
        user = function.get_user_function()
        index.functions.append(Function(
            name=function.get_function_name() or user.__name__, trigger_type=trigger["type"],
            trigger=trigger, bindings=bindings, user_function=user, is_async=_is_async(user)))
    return index


def _is_async(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)
