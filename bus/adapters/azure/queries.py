"""Entity queries read without the SDK's generic deserializer.

``TableClient.query_entities`` answers through the generated client's model deserializer,
which walks every property of every entity through a type-dispatching ``Deserializer`` before
the SDK converts the rows to entities (``_convert_to_entity``). On the bench machine that walk
was a fifth of the exactly-once hop's Python CPU (py-spy, the hop at Azure's latency), and the
receiver reads entities this way for every slot it loads and every round's tokens.

:func:`query` builds the request with the SDK's own request builder (the same URL, query and
headers), sends it through the table client's pipeline (signing, transport), parses the JSON
body with ``json.loads`` and converts each row with the SDK's ``_convert_to_entity``: the same
entities, without the walk. These pieces of the SDK are private, so ``azure-data-tables`` is
pinned and ``tests/contract/test_queries_azurite.py`` checks the request and the entities
against the SDK's own on every run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from azure.data.tables import TableClient
from azure.data.tables._deserialize import _convert_to_entity
from azure.data.tables._generated.operations._operations import (
    build_table_query_entities_request,
)
from azure.data.tables._serialize import _parameter_filter_substitution

_to_entity: Callable[[Any], Any] = _convert_to_entity  # untyped in the SDK
_CONTINUATION = ("x-ms-continuation-NextPartitionKey", "x-ms-continuation-NextRowKey")


class QueryRejected(Exception):
    """The service answered a query with an error status."""

    def __init__(self, status: int, code: str, text: str, retry_after: str | None) -> None:
        super().__init__(f"query failed with {status} {code}: {text[:500]}")
        self.status = status
        self.code = code
        self.retry_after = retry_after


@dataclass(frozen=True)
class Page:
    rows: list[Any]
    """The rows, as ``query_entities`` would yield them (``TableEntity``)."""
    more: bool
    """Whether the service holds more rows for a next page (a continuation)."""


def query(client: TableClient, query_filter: str, parameters: dict[str, Any]) -> Page:
    """The first page of ``query_filter`` (with ``@name`` parameters, as ``query_entities``
    takes them) over ``client``'s table."""
    request = build_table_query_entities_request(
        table=client.table_name,
        filter=_parameter_filter_substitution(parameters, query_filter),
        version=client._client._config.version)
    response = client._client.send_request(request)
    if response.status_code != 200:
        text = response.text()
        raise QueryRejected(response.status_code, _error_code(response.headers, text), text,
                            response.headers.get("Retry-After"))
    rows = [_to_entity(entry) for entry in json.loads(response.content)["value"]]
    return Page(rows, any(response.headers.get(name) for name in _CONTINUATION))


def _error_code(headers: Any, text: str) -> str:
    code = headers.get("x-ms-error-code")
    if code:
        return str(code)
    try:
        return str(json.loads(text)["odata.error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""
