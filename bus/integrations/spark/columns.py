"""The columns of a read: what Spark type each column has and how a staged message fills it.

Every row has the standard columns (``BASE_COLUMNS``); with ``message_type`` a read adds one
column per field of the contract, typed after the field:

* ``str``, ``int``, ``float``, ``bool``, ``datetime``, ``date``, ``bytes``: ``string``,
  ``bigint``, ``double``, ``boolean``, ``timestamp``, ``date``, ``binary``;
* a nested model: a ``struct`` of its fields, typed the same way;
* ``list[X]``, ``tuple[X, ...]``, ``set[X]``: ``array<X>``; ``dict[str, X]``: ``map<string,X>``;
* anything else (``Decimal``, enums, unions, ``UUID``, a model that contains itself): ``string``
  holding the field's JSON text.

A user-supplied schema (``spark.read.format("bus").schema(...)``, ``receive(schema=...)``)
picks columns by name, in its own order. Each must be one of these, of the same type - or
``string`` for any of them (the value's JSON text), and ``binary`` for ``payload`` (the
message's bytes, where the ``string`` column has the text or, for a binary payload, its
base64).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from bus.integrations.spark.options import OptionError
from bus.messages import Message
from bus.storage import EntityValue

_SIMPLE = {str: "string", int: "bigint", float: "double", bool: "boolean",
           dt.datetime: "timestamp", dt.date: "date", bytes: "binary"}


class Shape(Protocol):
    """How one value of a contract becomes a Spark value of the type ``simple``."""

    @property
    def simple(self) -> str:
        """The Spark type, as ``DataType.simpleString()`` spells it."""
        ...

    def ddl(self) -> str:
        """The Spark type in DDL (field names quoted)."""
        ...

    def value(self, python: Any, plain: Any) -> Any:
        """The Spark value of a field whose Python value is ``python`` and JSON value
        ``plain`` (``model_dump(mode="json")``)."""
        ...


@dataclass(frozen=True)
class _Plain:
    simple: str

    def ddl(self) -> str:
        return self.simple

    def value(self, python: Any, plain: Any) -> Any:
        return python


@dataclass(frozen=True)
class _Text:
    simple: str = "string"

    def ddl(self) -> str:
        return "string"

    def value(self, python: Any, plain: Any) -> Any:
        if plain is None or isinstance(plain, str):
            return plain
        return json.dumps(plain, ensure_ascii=False)


@dataclass(frozen=True)
class _Struct:
    fields: tuple[tuple[str, Shape], ...]

    @property
    def simple(self) -> str:
        return "struct<" + ",".join(f"{n}:{s.simple}" for n, s in self.fields) + ">"

    def ddl(self) -> str:
        return "struct<" + ",".join(f"`{n}`:{s.ddl()}" for n, s in self.fields) + ">"

    def value(self, python: Any, plain: Any) -> Any:
        if python is None:
            return None
        return {name: shape.value(getattr(python, name), plain[name])
                for name, shape in self.fields}


@dataclass(frozen=True)
class _Array:
    item: Shape

    @property
    def simple(self) -> str:
        return f"array<{self.item.simple}>"

    def ddl(self) -> str:
        return f"array<{self.item.ddl()}>"

    def value(self, python: Any, plain: Any) -> Any:
        if python is None:
            return None
        # A set's JSON list comes from iterating the same set: the orders match.
        return [self.item.value(p, j) for p, j in zip(list(python), plain, strict=True)]


@dataclass(frozen=True)
class _Map:
    item: Shape

    @property
    def simple(self) -> str:
        return f"map<string,{self.item.simple}>"

    def ddl(self) -> str:
        return f"map<string,{self.item.ddl()}>"

    def value(self, python: Any, plain: Any) -> Any:
        if python is None:
            return None
        return {key: self.item.value(python[key], plain[key]) for key in python}


def shape_of(annotation: Any, seen: frozenset[type] = frozenset()) -> Shape:
    """The shape of a field annotated ``annotation`` (see the module doc)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return shape_of(args[0], seen)
    if origin in (typing.Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        return shape_of(present[0], seen) if len(present) == 1 else _Text()
    # origin: on Python 3.10 ``isinstance(set[str], type)`` holds.
    if origin is None and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen or not annotation.model_fields:
            return _Text()
        return _Struct(tuple((name, shape_of(f.annotation, seen | {annotation}))
                             for name, f in annotation.model_fields.items()))
    if origin in (list, set, frozenset, Sequence) and len(args) == 1:
        return _Array(shape_of(args[0], seen))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _Array(shape_of(args[0], seen))
    if origin in (dict, Mapping) and len(args) == 2 and args[0] is str:
        return _Map(shape_of(args[1], seen))
    simple = _SIMPLE.get(annotation)
    return _Plain(simple) if simple is not None else _Text()


BASE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("message_id", "string"), ("message_type", "string"), ("correlation_id", "string"),
    ("causation_id", "string"), ("source", "string"), ("topic", "string"),
    ("sent_at", "timestamp"), ("headers", "map<string,string>"), ("payload", "string"))
"""The columns of every row read from the bus; ``payload`` is the message as text (JSON), or
base64 for a binary payload."""


def contract_shapes(contract: type[Message] | None) -> list[tuple[str, Shape]]:
    """The parsed columns a read adds for ``message_type``: one per field of the contract."""
    if contract is None:
        return []
    taken = {name for name, _ in BASE_COLUMNS}
    columns: list[tuple[str, Shape]] = []
    for name, f in contract.model_fields.items():
        if name in taken:
            raise OptionError(f"{contract.message_type}.{name} has the name of a standard "
                              "column; read without message_type and parse 'payload' yourself")
        columns.append((name, shape_of(f.annotation)))
    return columns


def contract_columns(contract: type[Message] | None) -> list[tuple[str, str]]:
    """The parsed columns as (name, Spark type in DDL)."""
    return [(name, shape.ddl()) for name, shape in contract_shapes(contract)]


def schema_ddl(contract: type[Message] | None) -> str:
    """The read's schema in DDL: the standard columns, then the contract's."""
    return ", ".join(f"`{name}` {kind}" for name, kind in (*BASE_COLUMNS,
                                                            *contract_columns(contract)))


Selection = tuple[tuple[str, str], ...]
"""Columns a user-supplied schema asks for: (name, Spark type as ``simpleString()``)."""


def every_column(contract: type[Message] | None) -> Selection:
    """Every column of a read, as a selection (what Spark passes when the user gave no
    schema)."""
    return (*BASE_COLUMNS, *((name, shape.simple) for name, shape in contract_shapes(contract)))


def select(contract: type[Message] | None, wanted: Sequence[tuple[str, str]]) -> Selection:
    """Check a user-supplied schema against the columns a read has; returns it as a
    selection, or raises OptionError naming each column that cannot be given."""
    have = dict(every_column(contract))
    problems = []
    for name, kind in wanted:
        if name not in have:
            problems.append(f"no column {name!r}")
        elif kind != have[name] and kind != "string" and (name, kind) != ("payload", "binary"):
            problems.append(f"column {name!r} is {have[name]} (or string), not {kind}")
    if problems:
        columns = ", ".join(f"{n} {k}" for n, k in have.items())
        raise OptionError(f"the schema given does not fit the read: {'; '.join(problems)}. "
                          f"It can pick any of: {columns}")
    return tuple(wanted)


def row_of(values: Mapping[str, EntityValue], contract: type[Message] | None,
           selection: Selection | None = None) -> tuple[Any, ...]:
    """A staged message as a row: every column of ``schema_ddl(contract)`` in order, or the
    columns of ``selection``."""
    row, texts = _full_row(values, contract)
    if selection is None:
        return tuple(row.values())
    return tuple(_as(row[name], texts.get(name), kind, name, values)
                 for name, kind in selection)


def _full_row(values: Mapping[str, EntityValue], contract: type[Message] | None,
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's values by column, and the contract fields' JSON values (for ``_as``)."""
    row: dict[str, Any] = {
        "message_id": values["message_id"], "message_type": values["message_type"],
        "correlation_id": values["correlation_id"], "causation_id": values.get("causation_id"),
        "source": values["source"], "topic": values.get("topic"),
        "sent_at": dt.datetime.fromisoformat(str(values["sent_at"])),
        "headers": json.loads(str(values.get("headers") or "{}")),
        "payload": values["payload"]}
    if contract is None:
        return row, {}
    message = contract.model_validate_json(str(values["payload"]))
    plain = message.model_dump(mode="json")
    for name, shape in contract_shapes(contract):
        row[name] = shape.value(getattr(message, name), plain[name])
    return row, plain


def _as(value: Any, plain: Any, kind: str, name: str,
        values: Mapping[str, EntityValue]) -> Any:
    """A column's ``value`` as the type a user-supplied schema asked for (see ``select``);
    ``plain``: a contract field's JSON value."""
    if name == "payload" and kind == "binary":
        text = str(value)
        return base64.b64decode(text) if values.get("binary") else text.encode("utf-8")
    if kind != "string" or value is None or isinstance(value, str):
        return value
    if name == "sent_at":
        return str(values["sent_at"])
    if name == "headers":
        return json.dumps(value, ensure_ascii=False)
    return _Text().value(None, plain)
