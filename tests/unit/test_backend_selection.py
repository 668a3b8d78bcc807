"""One setting chooses the storage backend, the same way in the Functions app, the Spark
options and the command line (bus.adapters.select)."""

from __future__ import annotations

import pytest

from bus.adapters.azure import AzureStorage
from bus.adapters.memory import InMemoryStorage
from bus.adapters.select import open_storage
from bus.errors import ConfigurationError
from bus.hosting.functions.config import AppConfig
from bus.integrations.spark.options import Connection, OptionError


def test_memory_names_a_store_shared_in_the_process() -> None:
    first = open_storage("memory:select-a")
    assert isinstance(first, InMemoryStorage)
    assert open_storage("memory:select-a") is first
    assert open_storage("memory:select-b") is not first


def test_a_connection_string_chooses_azure() -> None:
    assert isinstance(open_storage("UseDevelopmentStorage=true"), AzureStorage)


def test_development_storage_is_azurite_on_its_default_ports() -> None:
    """With every SDK release the bus supports (the queue and blob SDKs learnt the shorthand
    late: requirements-py310.txt pins older ones)."""
    storage = AzureStorage.from_connection_string("usedevelopmentstorage=TRUE;")
    services = [vars(port)["_service"] for port in (storage.blobs, storage.queues, storage.tables)]
    assert [s.url.rstrip("/") for s in services] == [
        f"http://127.0.0.1:{port}/devstoreaccount1" for port in (10000, 10001, 10002)]


@pytest.mark.parametrize(("value", "says"), [
    ("", "is empty"), ("   ", "is empty"),
    ("no such thing", "is not an Azure Storage connection string")])
def test_anything_else_says_what_to_give(value: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as raised:
        open_storage(value, name="app setting 'X'")
    assert "app setting 'X'" in str(raised.value) and "memory:" in str(raised.value)


def test_the_functions_settings_and_the_spark_options_choose_the_same_way() -> None:
    config = AppConfig.from_environment({"AzureWebJobsStorage": "memory:select-app"}, None)
    assert config.storage() is open_storage("memory:select-app")
    assert Connection(connection_string="memory:select-app").storage() is config.storage()
    with pytest.raises(OptionError, match="option 'connection_string' is not an Azure"):
        Connection(connection_string="nonsense").storage()
