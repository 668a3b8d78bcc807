"""Which of Azure Storage's limits Azurite itself enforces, measured with the plain SDK.

The Azure adapter checks every limit it declares before sending (``bus.adapters.azure``), so
the storage contract holds on Azurite too; these probes bypass the adapter to record what the
emulator refuses on its own (docs/protocol.md, "Limits and horizons", has the table). When an
Azurite upgrade changes one of them, this test says which.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient

from bus.storage.limits import AZURE

pytestmark = pytest.mark.azurite


def _refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except HttpResponseError:
        return True
    except Exception:  # the SDK cannot parse Azurite's refusal of a batch
        return True
    return False


def test_what_azurite_enforces(azurite_connection: str) -> None:
    queues = QueueServiceClient.from_connection_string(azurite_connection)
    queue = queues.get_queue_client(f"q{uuid.uuid4().hex[:12]}")
    queue.create_queue()
    tables = TableServiceClient.from_connection_string(azurite_connection)
    table = tables.create_table(f"t{uuid.uuid4().hex[:12]}")
    chars = AZURE.string_chars
    big = "x" * (chars - 10)
    per_row = AZURE.entity_bytes // AZURE.property_bytes - 1
    measured = {
        "queue message over 64 KiB": _refused(
            lambda: queue.send_message("A" * (AZURE.queue_message_chars + 1))),
        "visibility delay over 7 days": _refused(
            lambda: queue.send_message("eA==", visibility_timeout=AZURE.visibility_seconds + 1)),
        "string property over 64 KiB": _refused(lambda: table.create_entity(
            {"PartitionKey": "p", "RowKey": "a", "s": "x" * (chars + 1)})),
        "string property over 64 KiB in UTF-16 only": _refused(lambda: table.create_entity(
            {"PartitionKey": "p", "RowKey": "b", "s": "\U0001f600" * (chars // 2 + 1)})),
        "entity over 1 MiB": _refused(lambda: table.create_entity(
            {"PartitionKey": "p", "RowKey": "c",
             **{f"p{i}": big for i in range(AZURE.entity_bytes // AZURE.property_bytes + 1)}})),
        "more than 255 properties": _refused(lambda: table.create_entity(
            {"PartitionKey": "p", "RowKey": "d",
             **{f"p{i}": i for i in range(AZURE.user_properties + 1)}})),
        "row key over 1 KiB": _refused(lambda: table.create_entity(
            {"PartitionKey": "p", "RowKey": "k" * (AZURE.key_bytes // 2 + 1)})),
        "transaction over 4 MiB": _refused(lambda: table.submit_transaction(
            [("create", {"PartitionKey": "q", "RowKey": f"r{r}",
                         **{f"p{i}": big for i in range(per_row)}})
             for r in range(AZURE.transaction_bytes // (per_row * chars) + 1)])),
        "transaction over 100 operations": _refused(lambda: table.submit_transaction(
            [("create", {"PartitionKey": "z", "RowKey": f"r{i}"}) for i in range(101)])),
    }
    assert measured == {
        "queue message over 64 KiB": True,
        "visibility delay over 7 days": True,
        "string property over 64 KiB": True,
        "string property over 64 KiB in UTF-16 only": True,
        "entity over 1 MiB": False,
        "more than 255 properties": False,
        "row key over 1 KiB": True,
        "transaction over 4 MiB": True,
        "transaction over 100 operations": True,
    }
