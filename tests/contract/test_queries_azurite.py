"""The adapter's own reading of entity queries (bus/adapters/azure/queries.py) against the
SDK's ``query_entities``: the same request on the wire, the same entities, on a real
Azurite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import EdmType, EntityProperty, TableClient, TableServiceClient

from bus.adapters.azure import queries
from bus.adapters.azure.store import AzureStorage
from bus.storage import Missing, Throttled

pytestmark = pytest.mark.azurite

FILTER = "PartitionKey eq @pk and ( RowKey eq @r0 or RowKey eq @r1 or RowKey eq @r2 )"


class Recording(RequestsTransport):
    """The SDK's own transport, remembering each query it sent (method, URL, headers)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, dict[str, str]]] = []

    def send(self, request: Any, **kwargs: Any) -> Any:
        if request.method == "GET":
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() not in ("x-ms-date", "authorization",
                                            "x-ms-client-request-id", "user-agent")}
            self.sent.append((request.method, request.url, headers))
        return super().send(request, **kwargs)


@pytest.fixture
def table(azurite_connection: str) -> Iterator[tuple[TableClient, Recording]]:
    transport = Recording()
    service = TableServiceClient.from_connection_string(
        azurite_connection, transport=transport, retry_total=0)
    name = f"t{uuid.uuid4().hex[:12]}"
    client = service.create_table(name)
    client.create_entity({"PartitionKey": "p 'one'", "RowKey": "a'b", "text": "x \u00e9 'y'",
                          "count": EntityProperty(2**40, EdmType.INT64), "small": 7,
                          "ratio": 0.25, "flag": True, "blob": b"\x00\xff",
                          "when": datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc),
                          "id": uuid.UUID(int=5)})
    client.create_entity({"PartitionKey": "p 'one'", "RowKey": "plain", "text": ""})
    yield client, transport


def _parameters() -> dict[str, Any]:
    return {"pk": "p 'one'", "r0": "a'b", "r1": "plain", "r2": "absent"}


def test_the_request_is_the_sdks(table: tuple[TableClient, Recording]) -> None:
    client, transport = table
    next(client.query_entities(FILTER, parameters=_parameters()).by_page())
    queries.query(client, FILTER, _parameters())
    sdk, ours = transport.sent
    assert ours == sdk


def test_the_entities_are_the_sdks(table: tuple[TableClient, Recording]) -> None:
    client, _ = table
    theirs = list(next(client.query_entities(FILTER, parameters=_parameters()).by_page()))
    page = queries.query(client, FILTER, _parameters())
    assert not page.more
    assert len(page.rows) == len(theirs) == 2
    for mine, sdk in zip(page.rows, theirs, strict=True):
        assert dict(mine) == dict(sdk)
        assert mine.metadata == sdk.metadata


def test_errors_map_onto_the_port(azure_storage: AzureStorage) -> None:
    with pytest.raises(Missing):
        azure_storage.tables.get_many("nosuchtable", "p", ["a", "b"])


def test_a_busy_answer_is_throttling() -> None:
    """503 with Retry-After, as Azure answers past a partition's target."""
    from bus.adapters.azure.store import _mapped

    mapped = _mapped(queries.QueryRejected(503, "ServerBusy", "busy", "3"))
    assert isinstance(mapped, Throttled) and mapped.retry_after == 3.0
