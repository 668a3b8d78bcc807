"""The columns of a read without Spark: types after the contract's fields (structs, arrays,
maps, binary), a staged message as a row, and a user-supplied schema's columns checked."""

from __future__ import annotations

import base64
import datetime as dt
import enum
import json
from decimal import Decimal

import pytest
from pydantic import BaseModel

from bus import Bus, Command
from bus.adapters.memory import InMemoryStorage
from bus.integrations.spark.columns import every_column, row_of, select
from bus.integrations.spark.options import OptionError
from bus.integrations.spark.reader import Drainer, subscribe
from bus.integrations.spark.staging import MARKER, Staging
from bus.storage import EntityValue
from tests.integrations.spark.contracts import LABEL, Line, Shipment


class Colour(enum.Enum):
    RED = "red"


class Node(BaseModel):
    name: str
    children: list[Node] = []


class Note(Command):
    text: str


class Everything(Command):
    text: str
    count: int
    ratio: float
    flag: bool
    at: dt.datetime
    day: dt.date
    price: Decimal
    colour: Colour
    either: int | str
    maybe: int | None = None
    tags: set[str] = set()
    pair: tuple[int, ...] = ()
    tree: Node | None = None


def test_each_field_type_has_its_column_type() -> None:
    assert dict(every_column(Everything))["headers"] == "map<string,string>"
    assert dict(every_column(Everything)[9:]) == {
        "text": "string", "count": "bigint", "ratio": "double", "flag": "boolean",
        "at": "timestamp", "day": "date", "price": "string", "colour": "string",
        "either": "string", "maybe": "bigint", "tags": "array<string>",
        "pair": "array<bigint>",
        "tree": "struct<name:string,children:array<string>>"}  # Node inside Node: JSON text
    assert dict(every_column(Shipment)[9:]) == {
        "shipment_id": "string", "lines": "array<struct<sku:string,quantity:bigint>>",
        "address": "map<string,string>", "label": "binary",
        "first": "struct<sku:string,quantity:bigint>"}


def sink(**kwargs: object) -> Bus:
    return Bus(InMemoryStorage(), routes={"sink": "sink"}, **kwargs)  # type: ignore[arg-type]


def staged(bus: Bus, message: Command, contract: type[Command] | None = None,
           ) -> dict[str, EntityValue]:
    """``message`` sent to ``sink`` and staged by a reader: its staged values."""
    staging = Staging(bus.storage, "")
    staging.ensure()
    subscribe(bus, "sink")
    bus.send(message, to="sink")
    Drainer(bus, staging, "sink", contract=contract).stage("r~sink~x", 10, close_empty=True)
    [values] = [v for key, v in staging.rows("r~sink~x") if key != MARKER]
    return values


def test_a_staged_message_fills_structs_arrays_maps_and_binary() -> None:
    bus = sink()
    shipment = Shipment(shipment_id="s1", lines=[Line(sku="a", quantity=2)],
                        address={"city": "Oslo"}, label=LABEL,
                        first=Line(sku="b", quantity=1))
    row = row_of(staged(bus, shipment, Shipment), Shipment)
    assert row[9:] == ("s1", [{"sku": "a", "quantity": 2}], {"city": "Oslo"},
                       LABEL, {"sku": "b", "quantity": 1})
    assert json.loads(row[8])["shipment_id"] == "s1"  # payload: the JSON text


def test_values_of_fields_kept_as_json_text() -> None:
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    message = Everything(text="t", count=1, ratio=0.5, flag=True, at=at, day=at.date(),
                         price=Decimal("1.10"), colour=Colour.RED, either="x", tags={"a"},
                         pair=(1, 2), tree=Node(name="r", children=[Node(name="c")]))
    row = dict(zip([n for n, _ in every_column(Everything)],
                   row_of(staged(sink(), message, Everything), Everything), strict=True))
    assert (row["at"], row["day"], row["price"], row["colour"], row["either"]) == (
        at, at.date(), "1.10", "red", "x")
    assert (row["maybe"], row["tags"], row["pair"]) == (None, ["a"], [1, 2])
    assert row["tree"] == {"name": "r", "children": ['{"name": "c", "children": []}']}


def test_a_user_schema_picks_columns_by_name_and_may_ask_for_text_or_bytes() -> None:
    bus = sink()
    shipment = Shipment(shipment_id="s1", lines=[Line(sku="a", quantity=2)],
                        address={"city": "Oslo"}, label=LABEL)
    values = staged(bus, shipment, Shipment)
    selection = select(Shipment, [("label", "binary"), ("lines", "string"),
                                  ("payload", "binary"), ("message_id", "string"),
                                  ("sent_at", "string")])
    label, lines, payload, message_id, sent_at = row_of(values, Shipment, selection)
    assert (label, json.loads(lines)) == (LABEL, [{"sku": "a", "quantity": 2}])
    assert Shipment.model_validate_json(payload).label == LABEL
    assert message_id == values["message_id"] and sent_at == values["sent_at"]


def test_a_user_schema_that_does_not_fit_is_refused_with_the_columns_there_are() -> None:
    with pytest.raises(OptionError, match=r"no column 'sale'.*'label' is binary \(or string\), "
                                          r"not bigint.*It can pick any of: message_id string"):
        select(Shipment, [("sale", "string"), ("label", "bigint")])
    with pytest.raises(OptionError, match="'headers' is map<string,string>"):
        select(None, [("headers", "map<string,bigint>")])


def test_a_binary_payload_is_base64_in_text_and_its_bytes_in_binary() -> None:
    class Raw:
        content_type = "application/octet-stream"
        text = False

        def dumps(self, message: Command) -> bytes:
            return b"\x00\xfe" + message.model_dump_json().encode()

        def loads(self, data: bytes, contract: type[Command]) -> Command:
            return contract.model_validate_json(data[2:])

    values = staged(sink(serializer=Raw()), Note(text="hi"))
    [text] = row_of(values, None, (("payload", "string"),))
    [raw] = row_of(values, None, (("payload", "binary"),))
    assert raw.startswith(b"\x00\xfe") and base64.b64decode(text) == raw
