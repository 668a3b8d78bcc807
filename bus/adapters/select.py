"""Choosing the storage backend from one setting, the same way everywhere.

The Functions app (its connection app setting), the Spark options (``connection_string``) and
the command line (through the app's settings) all call ``open_storage`` with the setting's
value:

* ``memory:`` or ``memory:<name>`` - the in-memory backend (``bus.adapters.memory``): one store
  per name **per process**, shared by every Bus of that process that names it. For local runs
  and tests in one process (the local host runs the app and its worker in one); a second process
  - another Functions worker, a Spark executor - has a store of its own and sees nothing;
* anything else - an Azure Storage connection string (``UseDevelopmentStorage=true`` for
  Azurite, or ``DefaultEndpointsProtocol=...;AccountName=...;...``): the Azure backend.

An account name with Entra ID has its own setting in each place (``<connection>__accountName``,
the Spark option ``account_name``) and always means Azure.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from bus.adapters.memory import InMemoryStorage
from bus.errors import ConfigurationError
from bus.storage import Storage

MEMORY_SCHEME = "memory:"
DEFAULT_CONNECTION = "AzureWebJobsStorage"
"""The app setting that holds the storage connection, unless ``BUS_CONNECTION`` names another."""

_memory: dict[str, InMemoryStorage] = {}
_lock = threading.Lock()


def open_storage(setting: str, *, name: str = "the storage connection setting") -> Storage:
    """The backend ``setting`` chooses (no request is made). ``name`` is what the error calls
    the setting when it is not one."""
    value = setting.strip()
    if value.startswith(MEMORY_SCHEME):
        return _shared_memory(value[len(MEMORY_SCHEME):])
    if not value:
        raise ConfigurationError(f"{name} is empty: give an Azure Storage connection string "
                                 f"(UseDevelopmentStorage=true for Azurite) or "
                                 f"'{MEMORY_SCHEME}' for the in-memory backend")
    from bus.adapters.azure import AzureStorage  # the Azure SDK only when it is used

    try:
        return AzureStorage.from_connection_string(value)
    except ValueError as exc:
        raise ConfigurationError(
            f"{name} is not an Azure Storage connection string ({exc}): give one "
            f"(UseDevelopmentStorage=true for Azurite) or '{MEMORY_SCHEME}' for the in-memory "
            "backend") from None


def _shared_memory(store: str) -> InMemoryStorage:
    with _lock:
        if store not in _memory:
            _memory[store] = InMemoryStorage()
        return _memory[store]


def connection_setting(settings: Mapping[str, str]) -> str:
    """The name of the app setting that holds the storage connection."""
    return settings.get("BUS_CONNECTION", DEFAULT_CONNECTION)


def has_connection(settings: Mapping[str, str]) -> bool:
    """Whether ``settings`` name a storage account: a connection, or an identity's account."""
    name = connection_setting(settings)
    return bool(settings.get(name)) or bool(settings.get(f"{name}__accountName"))


def storage_from_settings(settings: Mapping[str, str]) -> Storage:
    """The backend an app's settings choose, as the Functions host reads them: the setting
    ``BUS_CONNECTION`` names (``AzureWebJobsStorage`` by default) through ``open_storage``, or
    ``<that>__accountName`` (with ``__clientId`` for a user-assigned identity) for the
    account with Entra ID. No request is made. Raises ConfigurationError when neither is set."""
    name = connection_setting(settings)
    value = settings.get(name)
    if value:
        return open_storage(value, name=f"app setting {name!r}")
    account = settings.get(f"{name}__accountName")
    if not account:
        raise ConfigurationError(
            f"app setting {name!r} is missing: set it to a storage connection string "
            f"(UseDevelopmentStorage=true for Azurite, in local.settings.json's Values), or "
            f"set '{name}__accountName' to use an identity")
    from bus.adapters.azure import AzureStorage

    client_id = settings.get(f"{name}__clientId")
    if not client_id:
        return AzureStorage.from_account(account)
    # A user-assigned identity, named the way the Functions host reads it.
    from azure.identity import DefaultAzureCredential

    credential = DefaultAzureCredential(managed_identity_client_id=client_id)
    return AzureStorage.from_account(account, credential)
