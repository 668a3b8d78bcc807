"""Entity-group transactions, encoded without the ``email`` package.

A transaction is one ``POST $batch`` whose body is a ``multipart/mixed`` document (the OData
batch format: a batch holding one changeset holding one ``application/http`` part per
operation). azure-data-tables writes that body and reads the response with the standard
library's ``email`` package, which parses every header through its header registry: on the
bench machine that is 5.5 of the 9.4 ms of Python CPU a two-operation transaction costs
(cProfile), three times a point read, and the protocol commits one per message.

This module writes the same body with string formatting and reads the response by splitting
on its boundaries. It also writes each operation's request line and headers itself, as the
SDK's ``TableBatchOperations`` would (method, URL with the keys quoted, ``If-Match``), which
the SDK does through a generic request builder and serializer at about a third of a
transaction's Python CPU; the entity's JSON, with its EDM type annotations, is still the SDK's
(``_add_entity_properties``), and the table client's own pipeline signs and sends the batch.
The pieces of the SDK used here are private, so ``azure-data-tables`` is pinned and
``tests/contract/test_transactions_azurite.py`` checks this encoding against the SDK's own,
request and response, byte for byte, on every run.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any
from urllib.parse import quote

from azure.core.rest import HttpRequest
from azure.core.serialization import AzureJSONEncoder
from azure.data.tables import TableClient
from azure.data.tables._serialize import _add_entity_properties

_CRLF = "\r\n"
_STATUS_LINE = re.compile(rb"^HTTP/\d\.\d (\d{3})[^\r\n]*\r\n", re.MULTILINE)


Operation = tuple[str, Mapping[str, Any], "str | None"]
"""One operation of a transaction: kind ("insert", "replace" or "delete"), the row
(``PartitionKey``, ``RowKey`` and properties, an Int64 as the SDK's ``EntityProperty``) and
the ETag it must match (None: insert, replace whatever is there, delete whatever is there)."""

_MINIMAL = "application/json;odata=minimalmetadata"


@dataclass(frozen=True)
class SubRequest:
    """One operation's request inside the changeset."""

    method: str
    url: str
    headers: dict[str, str]
    body: str


@dataclass(frozen=True)
class PartResponse:
    """One operation's answer inside a batch response."""

    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


class BatchRejected(Exception):
    """The service refused the batch as a whole (not one of its operations)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:500]}")
        self.status = status


class PayloadTooLarge(Exception):
    """The batch's body is over the service's limit: not sent (Azurite would accept it)."""


def submit(client: TableClient, operations: Sequence[Operation], *,
           max_bytes: int) -> list[PartResponse]:
    """Send ``operations`` (of one partition) as one transaction, unless its body is over
    ``max_bytes`` (PayloadTooLarge: the service's limit, which Azurite does not enforce).

    Returns one response per operation when every operation succeeded; when one failed the
    service applies none and answers with that operation's error alone, returned as the only
    element (the caller looks at its status). Raises BatchRejected for an answer that is not
    a batch response, and the SDK's transport errors as the SDK would.
    """
    # Private attributes of the pinned SDK (see the module docstring).
    table_url = f"{client.scheme}://{client._primary_hostname}/{quote(client.table_name, safe='')}"
    version = client._client._config.version
    requests = [build(table_url, version, *operation) for operation in operations]
    batch, changeset = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
    content = encode(requests, batch=batch, changeset=changeset)
    if len(content) > max_bytes:
        raise PayloadTooLarge(f"a transaction of {len(content)} bytes; the service takes at "
                              f"most {max_bytes}")
    request = HttpRequest(
        "POST", f"{client.scheme}://{client._primary_hostname}/$batch",
        headers={
            "x-ms-version": client.api_version,
            "DataServiceVersion": "3.0",
            "MaxDataServiceVersion": "3.0;NetFx",
            "Content-Type": f"multipart/mixed; boundary={batch}",
            "Accept": "application/json",
        },
        content=content,
    )
    # stream=True as the SDK does: the pipeline's content decoder knows no multipart.
    response = client._client.send_request(request, stream=True)
    body = response.read()
    if response.status_code != 202:
        raise BatchRejected(response.status_code, body.decode("utf-8", "replace"))
    return decode(response.headers.get("Content-Type", ""), body)


def build(table_url: str, version: str, kind: str, row: Mapping[str, Any],
          etag: str | None) -> SubRequest:
    """An operation's request as ``TableBatchOperations`` writes it: insert is a POST to the
    table, replace a PUT and delete a DELETE to the entity (keys with ``'`` doubled, then
    percent-quoted), with ``If-Match`` when there is an ETag (always on a delete: ``*``)."""
    common = {"x-ms-version": version, "DataServiceVersion": "3.0"}
    if kind == "insert":
        body = _json(row)
        return SubRequest("POST", table_url, {**_content(body), **common, "Accept": _MINIMAL},
                          body)
    url = f"{table_url}(PartitionKey='{_key(row['PartitionKey'])}',RowKey='{_key(row['RowKey'])}')"
    if kind == "delete":
        return SubRequest("DELETE", url, {**common, "Accept": _MINIMAL, "If-Match": etag or "*"},
                          "")
    if kind != "replace":
        raise ValueError(f"unknown transaction operation {kind!r}")
    body = _json(row)
    headers = {**_content(body), **common, "Accept": "application/json"}
    if etag is not None:
        headers["If-Match"] = etag
    return SubRequest("PUT", url, headers, body)


def _json(row: Mapping[str, Any]) -> str:
    # As azure.core.rest.HttpRequest(json=...) serializes a body.
    return json.dumps(_add_entity_properties(row), cls=AzureJSONEncoder)


def _content(body: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "Content-Length": str(len(body.encode()))}


def _key(value: object) -> str:
    return quote(str(value).replace("'", "''"), safe="")


def encode(requests: Sequence[SubRequest], *, batch: str, changeset: str,
           date: str | None = None) -> bytes:
    """The ``multipart/mixed`` body of a batch holding one changeset of ``requests``."""
    date = date or formatdate(usegmt=True)
    parts = [_part(index, request, date) for index, request in enumerate(requests)]
    changeset_body = "".join(f"--{changeset}{_CRLF}{part}{_CRLF}" for part in parts)
    text = (f"--{batch}{_CRLF}"
            f"Content-Type: multipart/mixed; boundary={changeset}{_CRLF}{_CRLF}"
            f"{changeset_body}--{changeset}--{_CRLF}{_CRLF}"
            f"--{batch}--{_CRLF}")
    return text.encode("utf-8")


def _part(index: int, request: SubRequest, date: str) -> str:
    text = request.body
    headers = {**request.headers, "x-ms-date": date, "Date": date}
    head = "".join(f"{name}: {value}{_CRLF}" for name, value in headers.items())
    return (f"Content-Type: application/http{_CRLF}"
            f"Content-Transfer-Encoding: binary{_CRLF}"
            f"Content-ID: {index}{_CRLF}{_CRLF}"
            f"{request.method} {request.url} HTTP/1.1{_CRLF}{head}{_CRLF}{text}")


def decode(content_type: str, body: bytes) -> list[PartResponse]:
    """The operation responses of a batch response (``multipart/mixed``, nested once)."""
    responses: list[PartResponse] = []
    for part in _split(body, _boundary(content_type)):
        head, _, inner = part.partition(b"\r\n\r\n")
        headers = _headers(head)
        if headers.get("content-type", "").startswith("multipart/mixed"):
            responses.extend(_operation(p) for p in _split(inner, _boundary(
                headers["content-type"])))
        else:
            responses.append(_operation(inner))
    return responses


def _boundary(content_type: str) -> bytes:
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.strip().partition("=")
        if name.lower() == "boundary":
            return value.strip('"').encode("ascii")
    raise BatchRejected(202, f"no boundary in the batch response's content type {content_type!r}")


def _split(body: bytes, boundary: bytes) -> list[bytes]:
    """The parts between ``--boundary`` lines, up to the closing ``--boundary--``."""
    delimiter = b"--" + boundary
    pieces = body.split(delimiter)
    parts: list[bytes] = []
    for piece in pieces[1:]:
        if piece.startswith(b"--"):
            break  # the closing delimiter
        parts.append(piece.removeprefix(b"\r\n").removesuffix(b"\r\n"))
    return parts


def _operation(part: bytes) -> PartResponse:
    """An ``application/http`` part: MIME headers, then the response from its status line
    (found by its shape: Azurite puts a stray line before it when it refuses a batch)."""
    found = _STATUS_LINE.search(part)
    if found is None:
        raise BatchRejected(202, f"unreadable part in a batch response: {part[:200]!r}")
    rest = part[found.end():]
    head, _, body = (b"", b"", rest[2:]) if rest.startswith(b"\r\n") else rest.partition(
        b"\r\n\r\n")
    return PartResponse(int(found.group(1)), _headers(head), body.strip())


def _headers(block: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in block.decode("utf-8", "replace").split("\r\n"):
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return headers


def error_of(part: PartResponse) -> tuple[str, str]:
    """(error code, message) of a failed operation's JSON body, as far as it says."""
    try:
        error = json.loads(part.body)["odata.error"]
        return str(error.get("code", "")), str(error.get("message", {}).get("value", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "", part.body.decode("utf-8", "replace")
