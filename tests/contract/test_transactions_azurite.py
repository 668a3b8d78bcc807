"""The adapter's own encoding of entity-group transactions (bus/adapters/azure/transactions.py)
against the SDK's: the same bytes on the wire, the same answers, on a real Azurite."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableServiceClient, UpdateMode

from bus.adapters.azure import transactions
from bus.adapters.azure.store import AzureStorage, _row
from bus.storage import (
    Conflict,
    Entity,
    NotFound,
    PreconditionFailed,
    Refused,
    TableOp,
    TransientError,
)

pytestmark = pytest.mark.azurite

_VOLATILE = [
    (re.compile(rb"(batch|changeset)(response)?_[0-9a-f-]{36}"), rb"\1_B"),
    (re.compile(rb"(x-ms-date|Date|If-Match): [^\r\n]+"), rb"\1: D"),
]


class Recording(RequestsTransport):
    """The SDK's own transport, remembering what it sent and received."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.received: list[tuple[str, bytes]] = []

    def send(self, request: Any, **kwargs: Any) -> Any:
        response = super().send(request, **kwargs)
        if request.url.endswith("$batch"):
            body = request.data if isinstance(request.data, bytes) else request.body
            self.sent.append(body if isinstance(body, bytes) else str(body).encode())
            self.received.append((response.headers["Content-Type"], response.body()))
        return response


@pytest.fixture
def recorded(azurite_connection: str) -> Iterator[tuple[Any, Recording]]:
    transport = Recording()
    service = TableServiceClient.from_connection_string(
        azurite_connection, transport=transport, retry_total=0)
    table = f"t{uuid.uuid4().hex[:12]}"
    service.create_table(table)
    yield service.get_table_client(table), transport


def _operation(op: TableOp) -> tuple[Any, ...]:
    """The SDK's ``submit_transaction`` tuple for ``op``, as the adapter means it."""
    row = _row(op.entity)
    conditions: dict[str, Any] = {}
    if op.etag is not None:
        conditions = {"etag": op.etag, "match_condition": MatchConditions.IfNotModified}
    if op.kind == "insert":
        return ("create", row)
    if op.kind == "delete":
        return ("delete", row, conditions)
    if op.etag is None:
        return ("upsert", row, {"mode": UpdateMode.REPLACE})
    return ("update", row, {"mode": UpdateMode.REPLACE, **conditions})


def _ours(op: TableOp) -> transactions.Operation:
    return (op.kind, _row(op.entity), op.etag)


def _normalised(body: bytes) -> bytes:
    for pattern, replacement in _VOLATILE:
        body = pattern.sub(replacement, body)
    return body


PK = "p \u00e9'+%"  # keys the URL must double-quote and percent-encode


def _ops(etags: dict[str, str]) -> list[TableOp]:
    return [
        TableOp("insert", Entity(PK, "new", {"n": 1, "f": 1.5, "b": True, "s": "h\u00e9 'q'",
                                            "raw": b"\x00\x01", "big": 2**40})),
        TableOp("replace", Entity(PK, "old 'x'", {"n": 2}), etags["old 'x'"]),
        TableOp("replace", Entity(PK, "any", {"n": 3})),
        TableOp("delete", Entity(PK, "gone \u00e9", {})),
        TableOp("delete", Entity(PK, "gone'2", {}), etags["gone'2"]),
    ]


def _existing(client: Any) -> dict[str, str]:
    """(Re)create the rows the operations expect; their ETags."""
    for key in ("old 'x'", "gone \u00e9", "gone'2"):
        client.upsert_entity({"PartitionKey": PK, "RowKey": key})
    return {key: client.get_entity(PK, key).metadata["etag"] for key in ("old 'x'", "gone'2")}


def test_the_body_is_the_sdks_byte_for_byte(recorded: tuple[Any, Recording]) -> None:
    client, transport = recorded
    client.submit_transaction([_operation(op) for op in _ops(_existing(client))])
    client.delete_entity(PK, "new")
    parts = transactions.submit(client, [_ours(op) for op in _ops(_existing(client))],
                                max_bytes=4 * 1024 * 1024)
    sdk, ours = transport.sent
    assert _normalised(ours) == _normalised(sdk)
    assert [p.status for p in parts] == [201, 204, 204, 204, 204]
    assert parts[0].headers["etag"] == client.get_entity(PK, "new").metadata["etag"]
    assert client.get_entity(PK, "new")["big"].value == 2**40


def test_responses_read_as_the_sdk_reads_them(recorded: tuple[Any, Recording]) -> None:
    client, transport = recorded
    client.upsert_entity({"PartitionKey": "p", "RowKey": "a", "n": 0}, mode=UpdateMode.REPLACE)
    ok = client.submit_transaction([("upsert", {"PartitionKey": "p", "RowKey": "a", "n": 1}),
                                    ("create", {"PartitionKey": "p", "RowKey": "b"})])
    with pytest.raises(Exception):  # noqa: B017 - the SDK's TableTransactionError
        client.submit_transaction([("create", {"PartitionKey": "p", "RowKey": "c"}),
                                   ("create", {"PartitionKey": "p", "RowKey": "b"})])
    (ok_type, ok_body), (bad_type, bad_body) = transport.received
    parts = transactions.decode(ok_type, ok_body)
    assert [p.headers["etag"] for p in parts] == [r["etag"] for r in ok]
    (failed,) = transactions.decode(bad_type, bad_body)
    assert failed.status == 409
    assert transactions.error_of(failed)[0] == "EntityAlreadyExists"


def test_a_documented_service_response_decodes() -> None:
    """The response of the Table service's "Performing entity group transactions" page
    (201 with the entity as a body, then 204s), line endings as on the wire."""
    body = (
        b"--batchresponse_7ab1c2a3\r\n"
        b"Content-Type: multipart/mixed; boundary=changesetresponse_3b5ca0d9\r\n\r\n"
        b"--changesetresponse_3b5ca0d9\r\n"
        b"Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-ID: 1\r\nContent-Type: application/json;"
        b"odata=minimalmetadata;streaming=true;charset=utf-8\r\n"
        b"ETag: W/\"datetime'2026-11-22T06%3A00%3A00.1Z'\"\r\n\r\n"
        b'{"odata.metadata":"x","PartitionKey":"p","RowKey":"1"}\r\n'
        b"--changesetresponse_3b5ca0d9\r\n"
        b"Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n"
        b"HTTP/1.1 204 No Content\r\nContent-ID: 2\r\n"
        b"ETag: W/\"datetime'2026-11-22T06%3A00%3A00.2Z'\"\r\n\r\n\r\n"
        b"--changesetresponse_3b5ca0d9--\r\n"
        b"--batchresponse_7ab1c2a3--\r\n")
    parts = transactions.decode("multipart/mixed; boundary=batchresponse_7ab1c2a3", body)
    assert [p.status for p in parts] == [201, 204]
    assert parts[1].headers["etag"].endswith("00.2Z'\"")
    assert parts[0].body.startswith(b'{"odata.metadata"')


def test_errors_map_onto_the_port(azure_storage: AzureStorage) -> None:
    tables = azure_storage.tables
    table = f"t{uuid.uuid4().hex[:12]}"
    tables.create_table(table)
    etag = tables.insert(table, Entity("p", "a", {"n": 1}))
    tables.replace(table, Entity("p", "a", {"n": 2}))
    with pytest.raises(Conflict):
        tables.transact(table, [TableOp("insert", Entity("p", "a", {}))])
    with pytest.raises(PreconditionFailed):
        tables.transact(table, [TableOp("replace", Entity("p", "a", {}), etag)])
    with pytest.raises(NotFound):
        tables.transact(table, [TableOp("replace", Entity("p", "missing", {}), etag)])
    with pytest.raises(Refused, match="maximum 100 changes"):
        tables.transact(table, [TableOp("insert", Entity("p", f"r{i}", {}))
                                for i in range(101)])  # the service's limit is 100
    assert tables.get(table, "p", "a").properties["n"] == 2


def test_a_sas_signature_never_reaches_an_error_text(azurite_connection: str) -> None:
    """An error the adapter raises carries no ``sig=`` of a SAS connection string: a refused
    connection's text names the URL, query string included."""
    import socket
    import traceback
    from datetime import datetime, timedelta, timezone

    from azure.storage.queue import (
        AccountSasPermissions,
        ResourceTypes,
        generate_account_sas,
    )

    parts = dict(p.split("=", 1) for p in azurite_connection.split(";") if "=" in p)
    sas = generate_account_sas(parts["AccountName"], parts["AccountKey"],
                               ResourceTypes(service=True, container=True, object=True),
                               AccountSasPermissions(read=True, write=True, add=True,
                                                     process=True, list=True),
                               expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{free.getsockname()[1]}/{parts['AccountName']}"
    connection = (f"BlobEndpoint={closed};QueueEndpoint={closed};TableEndpoint={closed};"
                  f"SharedAccessSignature={sas}")
    storage = AzureStorage.from_connection_string(connection)
    with pytest.raises(TransientError) as failed:
        storage.queues.send("q", "eA==")
    logged = "".join(traceback.format_exception(failed.value))  # as a log handler prints it
    assert "sig=REDACTED" in str(failed.value)
    assert "sig=" not in logged.replace("sig=REDACTED", "")
