"""``bus.connect``: a bus over the storage a connection names, or the app's settings name."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bus.adapters.select import (
    connection_setting,
    has_connection,
    open_storage,
    storage_from_settings,
)
from bus.appsettings import LocalSettings
from bus.bus import Bus
from bus.endpoint import Endpoint
from bus.errors import ConfigurationError
from bus.settings import Settings


def connect(connection: str | None = None, endpoints: Sequence[Endpoint] = (), *,
            root: str | os.PathLike[str] | None = None, **options: Any) -> Bus:
    """A bus over the storage ``connection`` names, or the app's settings name.

    ``connection``: an Azure Storage connection string (``UseDevelopmentStorage=true`` for
    Azurite) or ``memory:`` (``bus.adapters.select``). Without one, the bus is built as the
    Functions app builds its own, from the app's settings - the environment over the
    ``Values`` of ``local.settings.json`` in ``root`` (default: the current folder): the
    connection (``AzureWebJobsStorage``, or the setting ``BUS_CONNECTION`` names; an identity
    with ``<setting>__accountName``), ``BUS_PREFIX``, and every ``BUS_<NAME>`` setting of
    ``bus.Settings`` (signing keys included) over ``settings=``. So a script next to the app
    talks to the same queues, in the same way, as the app.

    ``endpoints`` and ``options``: as ``Bus`` takes them (``prefix``, ``routes``,
    ``settings``, ...). Raises ConfigurationError saying what to set when the settings name
    no storage or hold an invalid value. No storage request is made.
    """
    if connection is not None:
        return Bus(open_storage(connection, name="the connection"), endpoints, **options)
    local = LocalSettings.of(Path(root) if root is not None else Path.cwd())
    values = local.merged()
    problems: list[str] = []
    settings = Settings.read(values, problems, base=options.pop("settings", None))
    if problems:
        raise ConfigurationError(f"the settings in {local.source()} are invalid:\n  - "
                                 + "\n  - ".join(problems))
    if not has_connection(values):
        name = connection_setting(values)
        raise ConfigurationError(
            f"no storage connection in {local.source()}: set {name} (a connection string: "
            f"UseDevelopmentStorage=true for Azurite) in local.settings.json's Values or the "
            f"environment, or pass one: connect(\"UseDevelopmentStorage=true\")")
    options.setdefault("prefix", values.get("BUS_PREFIX", ""))
    return Bus(storage_from_settings(values), endpoints, settings=settings, **options)
