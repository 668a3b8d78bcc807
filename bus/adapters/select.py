"""Choosing the storage backend from one setting, the same way everywhere.

The Functions app (its connection app setting), the Spark options (``connection_string``) and
the command line (through the app's settings) all call ``open_storage`` with the setting's
value:

* ``memory:`` or ``memory:<name>`` - the in-memory backend (``bus.adapters.memory``): one store
  per name **per process**, shared by every Bus of that process that names it. For local runs
  and tests in one process (the devhost runs the app and its worker in one); a second process
  - another Functions worker, a Spark executor - has a store of its own and sees nothing;
* anything else - an Azure Storage connection string (``UseDevelopmentStorage=true`` for
  Azurite, or ``DefaultEndpointsProtocol=...;AccountName=...;...``): the Azure backend.

An account name with Entra ID has its own setting in each place (``<connection>__accountName``,
the Spark option ``account_name``) and always means Azure.
"""

from __future__ import annotations

import threading

from bus.adapters.memory import InMemoryStorage
from bus.errors import ConfigurationError
from bus.storage import Storage

MEMORY_SCHEME = "memory:"

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
