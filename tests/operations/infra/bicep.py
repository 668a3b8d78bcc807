"""Reading Bicep offline with pycep-parser, for the structural tests.

pycep turns a file into a dict with expressions left as syntax trees. Identifiers come back as
``BicepElement`` (a ``str`` subclass) and string literals as plain ``str``, so a test can tell
``principalId: appPrincipalId`` (a reference) from ``principalType: 'ServicePrincipal'``.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pycep import BicepParser
from pycep.transformer import BicepElement

ROOT = Path(__file__).resolve().parents[3]
INFRA = ROOT / "infra"
MAIN = INFRA / "main.bicep"
TOPOLOGY = INFRA / "topology.json"

_ACCESSORS = ("property_accessor", "nested_resource_accessor")


@cache
def parse(path: Path) -> dict[str, Any]:
    """The parsed file (cached: treat it as read-only)."""
    return BicepParser().parse(file_path=path)


def topology() -> dict[str, Any]:
    return json.loads(TOPOLOGY.read_text(encoding="utf-8"))


def is_ref(value: object) -> bool:
    """True for an identifier (parameter, variable, resource, module), False for a literal."""
    return isinstance(value, BicepElement)


def chain(expression: Any) -> tuple[str, ...]:
    """``a.b.c`` (or ``a::b``) as ``("a", "b", "c")``; raises ValueError for anything else."""
    if isinstance(expression, str):
        return (str(expression),)
    operator = expression.get("operator", {}) if isinstance(expression, dict) else {}
    if operator.get("type") in _ACCESSORS:
        operands = operator["operands"]
        return chain(operands["operand_1"]) + chain(operands["operand_2"])
    raise ValueError(f"not a reference chain: {expression!r}")


def function(expression: Any) -> tuple[str, dict[str, Any]] | None:
    """``(name, parameters)`` of a function call, or None."""
    if isinstance(expression, dict) and "function" in expression:
        call = expression["function"]
        return call["type"], call.get("parameters") or {}
    return None


@dataclass(frozen=True)
class Resource:
    """One resource (or module) declaration: its body, its loop when it is one, and its
    condition (``= if (cond) {...}`` or ``[for ...: if (cond) {...}]``) when it has one."""

    symbol: str
    type: str
    body: dict[str, Any]
    loop_item: str | None
    loop_source: tuple[str, ...] | None
    existing: bool
    condition: Any = None


def _loop_source(array_name: Any) -> tuple[str, ...]:
    # pycep 0.5 gives the array of an indexed loop (``for (x, i) in a.b``) as the str() of its
    # syntax tree; read it back.
    if isinstance(array_name, str) and array_name.startswith("{"):
        array_name = ast.literal_eval(array_name)
    return chain(array_name)


def resources(path: Path) -> dict[str, Resource]:
    """The resources a file declares, by symbolic name."""
    found = {}
    for symbol, declaration in parse(path).get("resources", {}).items():
        config = declaration["config"]
        loop = config.get("loop_type") if "loop_type" in config else None
        conditional = loop is None and set(config) == {"condition", "config"}
        body = config["config"] if loop is not None or conditional else config
        condition = config.get("condition") if loop is not None or conditional else None
        item = loop["detail"]["item_name"] if loop else None
        source = _loop_source(loop["detail"]["array_name"]) if loop else None
        found[symbol] = Resource(symbol, declaration["type"], body, item, source,
                                 declaration["existing"], condition)
    return found


def modules(path: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The modules a file calls: symbolic name -> (module file, params passed)."""
    found = {}
    for symbol, declaration in parse(path).get("modules", {}).items():
        assert declaration["type"] == "local", f"module {symbol} is not a local file"
        config = declaration["config"]
        if set(config) == {"condition", "config"}:  # module x '...' = if (cond) {...}
            config = config["config"]
        found[symbol] = (path.parent / declaration["detail"]["path"], config.get("params", {}))
    return found


def variable(path: Path, name: str) -> Any:
    return parse(path)["variables"][name]["value"]


def loaded_json(path: Path, name: str) -> Path | None:
    """The file a variable is ``loadJsonContent``-ed from, or None."""
    call = function(variable(path, name))
    if call is None or call[0] != "load_json_content":
        return None
    return (path.parent / call[1]["file_path"]).resolve()


def app_settings(site: Resource) -> dict[str, Any]:
    """A site's ``siteConfig.appSettings`` as name -> value expression."""
    settings = site.body["properties"]["siteConfig"]["appSettings"]
    return {str(entry["name"]): entry["value"] for entry in settings}
