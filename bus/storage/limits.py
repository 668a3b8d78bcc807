"""What a storage service accepts: declared by each adapter, read by the protocol.

Every port carries ``limits`` (a :class:`StorageLimits`). The protocol sizes what it writes by
them - signals, outbox records, inbox tokens, transactions, the rows a claim reads - instead
of carrying numbers of its own, and checks a write before making it, so that a message that
cannot be stored is poisoned with a reason instead of failing on every delivery.

Sizes are counted the way Azure Storage counts them (``../docs/protocol.md``, "Limits and
horizons"):

- a queue message is its text as stored (the bus writes base64, so one byte per character);
- a table string is UTF-16: two bytes per character, four outside the Basic Multilingual
  Plane; an entity's size follows the service's published formula (:func:`entity_size`);
- an entity-group transaction's limit is on the request's payload, the JSON of its entities
  inside a multipart body (:func:`transaction_size` is an upper bound of it).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bus.errors import Refused, TooLarge
from bus.storage.ports import Entity, EntityValue, TableOp

_FORBIDDEN_KEY_CHARACTER = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")
"""What Table Storage refuses in a key: / \\ # ? and the control characters (one regular
expression: ten times faster than testing each character in Python, and every row sent pays
it)."""
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class StorageLimits:
    """The limits of one storage service. The defaults are Azure Storage's (and Azurite's
    declared ones: Azurite enforces fewer, which the adapter then enforces itself)."""

    queue_message_chars: int = 65_536
    """A queue message's text as stored (64 KiB)."""
    messages_per_receive: int = 32
    """The most messages one receive (or peek) returns."""
    visibility_seconds: int = 7 * 24 * 3600
    """The longest visibility delay or lease a queue accepts."""
    key_bytes: int = 1_024
    """A PartitionKey or RowKey, UTF-16."""
    property_bytes: int = 65_536
    """One string (UTF-16) or binary property."""
    entity_bytes: int = 1_048_576
    """One entity, counted as :func:`entity_size` counts it."""
    entity_properties: int = 255
    """Properties of one entity, PartitionKey, RowKey and Timestamp included."""
    transaction_operations: int = 100
    transaction_bytes: int = 4_194_304
    """An entity-group transaction's payload, bounded by :func:`transaction_size`."""
    keys_per_read: int = 14
    """Row keys one ``get_many`` request holds (a filter holds 15 comparisons)."""
    query_page: int = 1_000
    """Entities per page of a query; the pages of a query are not one snapshot."""
    etag_chars: int = 64
    """The longest ETag the service returns (a table's are about 45 characters)."""

    @property
    def user_properties(self) -> int:
        """Properties an entity may carry besides PartitionKey, RowKey and Timestamp."""
        return self.entity_properties - 3

    @property
    def string_chars(self) -> int:
        """Characters of the BMP one string property holds."""
        return self.property_bytes // 2

    @property
    def longest_delay(self) -> float:
        """The longest delay the bus asks a queue for: the visibility limit less a minute,
        so that rounding and clock differences never cross it."""
        return float(self.visibility_seconds - 60)

    @property
    def signal_bytes(self) -> int:
        """Bytes of envelope JSON one queue message carries once base64-encoded."""
        return self.queue_message_chars // 4 * 3


AZURE = StorageLimits()
"""Azure Storage's limits, as Microsoft documents them."""


def utf16_bytes(text: str) -> int:
    """The size of ``text`` as Table Storage counts it."""
    return len(text.encode("utf-16-le", "surrogatepass"))


def split_text(text: str, max_bytes: int) -> list[str]:
    """``text`` in pieces of at most ``max_bytes`` each as Table Storage counts them
    (UTF-16), never splitting a surrogate pair; none for an empty text."""
    encoded = text.encode("utf-16-le", "surrogatepass")
    pieces: list[str] = []
    start, step = 0, max_bytes - max_bytes % 2
    while start < len(encoded):
        end = min(start + step, len(encoded))
        if end < len(encoded) and 0xD8 <= encoded[end - 1] <= 0xDB:
            end -= 2  # the first half of a pair: keep the pair together
        pieces.append(encoded[start:end].decode("utf-16-le", "surrogatepass"))
        start = end
    return pieces


def property_size(value: EntityValue) -> int:
    """A property value's size in the service's formula (its type's size)."""
    if isinstance(value, str):
        return 4 + utf16_bytes(value)
    if isinstance(value, bytes):
        return 4 + len(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return 4 if -(2**31) <= value < 2**31 else 8
    return 8  # float, datetime; None is not stored


def entity_size(entity: Entity) -> int:
    """The entity's size as Azure counts it: 4 bytes, the keys in UTF-16, and per property
    8 bytes, its name in UTF-16 and its value's size."""
    return 4 + utf16_bytes(entity.partition_key + entity.row_key) + sum(
        8 + utf16_bytes(name) + property_size(value)
        for name, value in entity.properties.items() if value is not None)


_OPERATION_OVERHEAD = 1_024
"""Bytes an operation adds to a transaction besides its entity's JSON and its keys in the
URL: MIME headers, request line, content type and length, ETag (506 for a replace with an
ETag, measured on the body ``bus.adapters.azure.transactions`` writes)."""


def transaction_size(ops: Sequence[TableOp]) -> int:
    """An upper bound of a transaction's payload: per operation its entity as JSON (non-ASCII
    escaped, as the SDK writes it), its keys percent-quoted in the URL, and the headers."""
    return sum(_OPERATION_OVERHEAD + 9 * len(op.entity.partition_key + op.entity.row_key)
               + (0 if op.kind == "delete" else _json_size(op.entity)) for op in ops)


def _json_size(entity: Entity) -> int:
    row = {name: _jsonable(value) for name, value in entity.properties.items()}
    row.update(PartitionKey=entity.partition_key, RowKey=entity.row_key)
    annotations = 40 * len(entity.properties)  # "<name>@odata.type": "Edm.Int64" and alike
    return len(json.dumps(row)) + annotations + 2 * sum(len(n) for n in entity.properties)


def _jsonable(value: EntityValue) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def check_entity(entity: Entity, limits: StorageLimits) -> None:
    """Raise TooLarge or Refused for an entity the service would refuse."""
    check_key("PartitionKey", entity.partition_key, limits)
    check_key("RowKey", entity.row_key, limits)
    if len(entity.properties) > limits.user_properties:
        raise Refused(f"entity {entity.row_key!r} has {len(entity.properties)} properties; at "
                      f"most {limits.user_properties} are allowed")
    for name, value in entity.properties.items():
        size = property_size(value) - 4 if isinstance(value, (str, bytes)) else 0
        if size > limits.property_bytes:
            raise TooLarge(f"property {name!r} of entity {entity.row_key!r} takes {size} "
                           f"bytes; a property holds at most {limits.property_bytes}")
        if (isinstance(value, int) and not isinstance(value, bool)
                and not INT64[0] <= value <= INT64[1]):
            raise Refused(f"property {name!r} of entity {entity.row_key!r}: {value} is "
                          "outside Int64")
    size = entity_size(entity)
    if size > limits.entity_bytes:
        raise TooLarge(f"entity {entity.row_key!r} takes {size} bytes; an entity holds at "
                       f"most {limits.entity_bytes}")


def check_key(kind: str, key: str, limits: StorageLimits) -> None:
    """Raise Refused for a PartitionKey or RowKey the service would refuse."""
    size = utf16_bytes(key)
    if size > limits.key_bytes:
        raise TooLarge(f"{kind} of {size} bytes; at most {limits.key_bytes}")
    if _FORBIDDEN_KEY_CHARACTER.search(key):
        raise Refused(f"{kind} {key[:80]!r} holds a character Table Storage forbids "
                      "(/ \\ # ? or a control character)")


def check_transaction(ops: Sequence[TableOp], limits: StorageLimits) -> None:
    """Raise TooLarge or Refused for a transaction the service would refuse (its entities
    included)."""
    if len(ops) > limits.transaction_operations:
        raise Refused(f"a transaction of {len(ops)} operations; at most "
                      f"{limits.transaction_operations}")
    for op in ops:
        if op.kind != "delete":
            check_entity(op.entity, limits)
    size = transaction_size(ops)
    if size > limits.transaction_bytes:
        raise TooLarge(f"a transaction of about {size} bytes; at most "
                       f"{limits.transaction_bytes}")


def transactions(ops: Sequence[TableOp], limits: StorageLimits) -> list[list[TableOp]]:
    """``ops`` (of one partition) in order, in as few transactions as the limits allow."""
    batches: list[list[TableOp]] = []
    size = 0
    for op in ops:
        one = transaction_size([op])
        if (not batches or len(batches[-1]) >= limits.transaction_operations
                or size + one > limits.transaction_bytes):
            batches.append([])
            size = 0
        batches[-1].append(op)
        size += one
    return batches


def check_message(body: str, limits: StorageLimits) -> None:
    """Raise TooLarge for a queue message the service would refuse."""
    if len(body.encode("utf-8")) > limits.queue_message_chars:
        raise TooLarge(f"a queue message of {len(body.encode('utf-8'))} bytes; at most "
                       f"{limits.queue_message_chars}")
