"""The contracts file: every message contract of an app as JSON Schema, and what changed.

``python -m bus contracts export`` writes it from the app's code; ``python -m bus contracts
check OLD [NEW]`` compares two of them (NEW: the app's contracts as they are now, when
omitted) and fails on a change that breaks a rolling deploy - one where, for a while, copies
from producers on the old code reach consumers on the new one, and copies from the new code
reach consumers still on the old one (docs/contracts.md). Per message type:

* breaking: the type is gone (no contract names it, as its type or an alias); its kind changed
  (a command became an event); a field is required by one side and absent from, or optional
  in, the other (the new code requires a field old producers never send, or stops sending
  one old consumers require); a field's schema changed; a field one side sends and the other
  side's strict contract (``extra="forbid"``) refuses.
* compatible: a type added, renamed with the old name kept as an alias, an optional field
  added or removed, a required field made optional - each listed, so a reviewer sees them.

Which contracts: those the app's endpoints handle, and every Command and Event class its
module names (defines or imports: the ones it sends and publishes). The schema is pydantic's,
in validation mode (what a consumer accepts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from bus.bus import Bus
from bus.errors import ConfigurationError
from bus.messages import Command, Event, Message

FORMAT = 1
"""The version of the file's layout (``"format"``); a reader refuses a later one."""
DEFAULT_PATH = Path("contracts.json")
IGNORED_KEYS = frozenset({"title", "description", "examples", "default"})
"""Schema keys that document a field without changing what it accepts."""


class ContractsFileError(Exception):
    """A contracts file that cannot be read: the message says which and why."""


def contract_classes(bus: Bus, module: ModuleType | None = None) -> list[type[Message]]:
    """The contracts of an app, by message type: what ``bus``'s endpoints handle, and the
    Command and Event classes ``module`` (the app's) names."""
    handled = [route.contract for endpoint in bus.topology.endpoints.values()
               for route in endpoint.routes.values()]
    named = [value for value in vars(module).values()
             if isinstance(value, type) and issubclass(value, (Command, Event))
             and value not in (Command, Event)] if module is not None else []
    found: dict[str, type[Message]] = {}
    for cls in [*handled, *named]:
        other = found.setdefault(cls.message_type, cls)
        if other is not cls:
            raise ConfigurationError(
                f"{_qualified(other)} and {_qualified(cls)} both have the message type "
                f"{cls.message_type!r}: give one another message_type (or an alias)")
    return [found[name] for name in sorted(found)]


def export(classes: list[type[Message]]) -> dict[str, Any]:
    """The contracts file's document for ``classes``."""
    return {"format": FORMAT, "contracts": {cls.message_type: _describe(cls) for cls in classes}}


def to_json(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def read(path: Path) -> dict[str, Any]:
    """A contracts file's document, or ContractsFileError saying what is wrong with it."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ContractsFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ContractsFileError(f"{path}: not a JSON document ({exc})") from None
    return checked(document, str(path))


def checked(document: Any, where: str) -> dict[str, Any]:
    """``document`` when it has the contracts file's layout; ContractsFileError otherwise."""
    if not isinstance(document, dict) or not isinstance(document.get("contracts"), dict):
        raise ContractsFileError(f"{where}: not a contracts file (no \"contracts\" object; "
                                 "write one with `python -m bus contracts export`)")
    if document.get("format") != FORMAT:
        raise ContractsFileError(f"{where}: format {document.get('format')!r}, this bus "
                                 f"reads format {FORMAT}")
    for name, contract in document["contracts"].items():
        if not (isinstance(contract, dict) and contract.get("kind") in ("command", "event")
                and isinstance(contract.get("schema"), dict)
                and _strings(contract.get("aliases", []))):
            raise ContractsFileError(f"{where}: contract {name!r} lacks a kind (command or "
                                     "event), a schema or a list of aliases")
        schema = contract["schema"]
        if not (isinstance(schema.get("properties", {}), dict)
                and isinstance(schema.get("$defs", {}), dict)
                and _strings(schema.get("required", []))):
            raise ContractsFileError(f"{where}: contract {name!r} has a schema whose "
                                     "properties, $defs or required list is malformed")
    return document


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


@dataclass
class Comparison:
    """What changed from one contracts file to the next."""

    breaking: list[str] = field(default_factory=list)
    compatible: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.breaking


def compare(old: Mapping[str, Any], new: Mapping[str, Any]) -> Comparison:
    """The changes from ``old`` to ``new`` (two checked documents), breaking or not."""
    result = Comparison()
    before, after = old["contracts"], new["contracts"]
    known_as = {alias: name for name, c in after.items() for alias in c.get("aliases", [])}
    for name in sorted(before):
        now = name if name in after else known_as.get(name)
        if now is None:
            result.breaking.append(f"{name}: removed (copies still sent as {name}, or "
                                   "waiting in a queue, would be poisoned: keep it, or keep "
                                   "its name as an alias of the contract that replaces it)")
            continue
        if now != name:
            result.compatible.append(f"{name}: renamed {now} (an alias keeps the old name)")
        _compare_one(now, before[name], after[now], result)
    result.compatible.extend(f"{name}: added" for name in sorted(after)
                             if name not in before and not any(
                                 a in before for a in after[name].get("aliases", [])))
    return result


def _compare_one(name: str, old: Mapping[str, Any], new: Mapping[str, Any],
                 result: Comparison) -> None:
    if old["kind"] != new["kind"]:
        result.breaking.append(f"{name}: kind changed, {old['kind']} -> {new['kind']}")
        return
    was, now = _Fields.of(old["schema"]), _Fields.of(new["schema"])
    for field_name in sorted(set(was.schemas) | set(now.schemas)):
        result_of = _field_change(field_name, was, now)
        if result_of is None:
            continue
        breaking, text = result_of
        (result.breaking if breaking else result.compatible).append(f"{name}: {text}")


def _field_change(name: str, was: _Fields, now: _Fields) -> tuple[bool, str] | None:
    """(breaking, what) for one field, or None when it did not change."""
    if name not in was.schemas:
        if name in now.required:
            return True, (f"field {name!r} added as required: copies from producers on the "
                          "old code lack it and fail validation")
        if was.strict:
            return True, (f"field {name!r} added, and the old contract is strict: consumers "
                          "on the old code refuse copies that carry it")
        return False, f"field {name!r} added (optional)"
    if name not in now.schemas:
        if name in was.required:
            return True, (f"field {name!r} removed, but the old contract requires it: "
                          "consumers on the old code refuse copies without it")
        if now.strict:
            return True, (f"field {name!r} removed, and the new contract is strict: copies "
                          "from producers on the old code carry it and are refused")
        return False, f"field {name!r} removed (it was optional)"
    if was.schemas[name] != now.schemas[name]:
        return True, (f"field {name!r} changed: {_short(was.schemas[name])} -> "
                      f"{_short(now.schemas[name])}")
    if name in now.required and name not in was.required:
        return True, (f"field {name!r} became required: copies from producers on the old code "
                      "may lack it")
    if name in was.required and name not in now.required:
        return False, f"field {name!r} became optional"
    return None


@dataclass(frozen=True)
class _Fields:
    """A contract's fields: each one's schema (references resolved, documentation left out),
    which are required, and whether the contract refuses fields it does not declare."""

    schemas: dict[str, Any]
    required: frozenset[str]
    strict: bool

    @classmethod
    def of(cls, schema: Mapping[str, Any]) -> _Fields:
        definitions = schema.get("$defs", {})
        properties = schema.get("properties", {})
        return cls({name: _resolved(value, definitions) for name, value in properties.items()},
                   frozenset(schema.get("required", [])),
                   schema.get("additionalProperties") is False)


def _resolved(schema: Any, definitions: Mapping[str, Any], seen: frozenset[str] = frozenset(),
              ) -> Any:
    """``schema`` with each ``$ref`` to a definition replaced by it (once per path: a
    recursive model stays a reference) and the documenting keys left out."""
    if isinstance(schema, list):
        return [_resolved(item, definitions, seen) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        key = ref.removeprefix("#/$defs/")
        if key in definitions and key not in seen:
            return _resolved(definitions[key], definitions, seen | {key})
    return {k: _resolved(v, definitions, seen) for k, v in sorted(schema.items())
            if k not in IGNORED_KEYS}


def _short(schema: Any) -> str:
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(cls: type[Message]) -> dict[str, Any]:
    return {"kind": cls.message_kind, "class": _qualified(cls), "aliases": list(cls.aliases),
            "schema": cls.model_json_schema(mode="validation")}


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"

