"""Message contracts of the Spark tests (imported by the Spark workers too: keep it tiny)."""

from __future__ import annotations

from pydantic import VERSION, BaseModel, ConfigDict

from bus import Command, Event


class RecordSale(Command):
    sale_id: str
    amount: int
    note: str | None = None


class SaleRecorded(Event):
    sale_id: str
    amount: int


BASE64_BYTES = tuple(map(int, VERSION.split(".")[:2])) >= (2, 9)


class Line(BaseModel):
    """A nested model: a struct column."""

    sku: str
    quantity: int


class Shipment(Command):
    """Nested models, lists, maps and bytes: read back as structs, arrays, maps, binary."""

    # Any bytes, not only UTF-8 text: base64 in the message's JSON (pydantic 2.9+ reads it back;
    # with older ones a bytes field holds UTF-8 text only).
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64") \
        if BASE64_BYTES else ConfigDict()

    shipment_id: str
    lines: list[Line]
    address: dict[str, str]
    label: bytes
    first: Line | None = None


LABEL = b"\xff\x00" if BASE64_BYTES else b"label"
"""A label any Shipment can carry on the installed pydantic."""
