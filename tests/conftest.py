from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from bus.adapters.azure import AzureStorage
from bus.storage import Storage
from bus.testing import InMemoryStorage
from devhost.azurite import azurite


@pytest.fixture(scope="session")
def azurite_connection() -> Iterator[str]:
    with azurite() as connection:
        yield connection


@pytest.fixture
def azure_storage(azurite_connection: str) -> AzureStorage:
    return AzureStorage.from_connection_string(azurite_connection)


@pytest.fixture(params=["memory", pytest.param("azurite", marks=pytest.mark.azurite)])
def storage(request: pytest.FixtureRequest) -> Storage:
    """Each test that takes ``storage`` runs twice: on the in-memory backend and on Azurite."""
    if request.param == "memory":
        return InMemoryStorage()
    return AzureStorage.from_connection_string(request.getfixturevalue("azurite_connection"))


@pytest.fixture
def prefix() -> str:
    """A fresh prefix per test: its own queues, tables and containers."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture(autouse=True)
def _quiet_azure_logs() -> None:
    logging.getLogger("azure").setLevel(logging.WARNING)
