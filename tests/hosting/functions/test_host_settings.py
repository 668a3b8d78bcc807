"""The devhost reads app settings as the host does: connections (a connection string or an
identity), ``%NAME%`` references, host.json."""

from __future__ import annotations

import pytest
from azure.identity import DefaultAzureCredential

from bus.hosting.local.appsettings import resolve
from bus.hosting.local.host import hub_name, queue_options
from bus.hosting.local.hostio import Connection


def test_an_identity_based_connection_uses_the_account_and_default_credential() -> None:
    connection = Connection.from_settings("AzureWebJobsStorage", {
        "AzureWebJobsStorage__accountName": "acct", "AzureWebJobsStorage__clientId": "cid"})
    queues, blobs = connection.queue_service(), connection.blob_service()  # no request made
    assert queues.url.startswith("https://acct.queue.core.windows.net")
    assert blobs.url.startswith("https://acct.blob.core.windows.net")
    assert isinstance(queues.credential, DefaultAzureCredential)
    assert connection.client_id == "cid"


def test_service_uris_name_the_endpoints() -> None:
    connection = Connection.from_settings("Store", {
        "Store__queueServiceUri": "https://q.example", "Store__blobServiceUri": "https://b.example"})
    assert connection.queue_service().url.startswith("https://q.example")


def test_a_missing_connection_says_what_to_set() -> None:
    with pytest.raises(SystemExit, match="AzureWebJobsStorage__accountName"):
        Connection.from_settings("AzureWebJobsStorage", {})


def test_setting_references_resolve_or_name_the_missing_setting() -> None:
    assert resolve("%BUS_DURABLE_HUB%", {"BUS_DURABLE_HUB": "Hub1"}) == "Hub1"
    assert hub_name({"extensions": {"durableTask": {"hubName": "%H%"}}}, {"H": "X"}) == "X"
    with pytest.raises(SystemExit, match="%H%"):
        resolve("%H%", {})


def test_function_timeout_from_host_json() -> None:
    assert queue_options({"functionTimeout": "00:10:00"}).function_timeout == 600.0
    assert queue_options({"functionTimeout": "-1"}).function_timeout is None
    assert queue_options({}).function_timeout == 1800.0  # the host's default
