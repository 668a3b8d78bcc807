"""Find the bus an app defines: import the app's module and take the one Bus in it.

An app reference is a module name (``function_app``), optionally followed by ``:attribute``
when the module defines several buses. The module is imported with the current directory (or
``root``) first on ``sys.path``, as the Functions host imports ``function_app.py``. A module-level
``BusFunctions`` counts as its ``.bus``. The app's settings are the environment's, over the
``Values`` of a ``local.settings.json`` in that directory, as ``func start`` applies them
(``bus.appsettings``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bus.appsettings import LocalSettings
from bus.bus import Bus
from bus.errors import ConfigurationError

DEFAULT_APP = "function_app"
OFFLINE_CONNECTION = "UseDevelopmentStorage=true"


class AppError(Exception):
    """The app cannot be imported, or does not define exactly one bus; the message says why."""


def load_bus(app: str = DEFAULT_APP, *, root: Path | None = None, offline: bool = False) -> Bus:
    """Import the app ``module[:attribute]`` and return its bus.

    The app's ``local.settings.json`` Values (in ``root``, default the current directory) are
    in the environment while it is imported, where the environment has none of its own.

    ``offline``: when no storage connection is configured, import the app with a placeholder
    connection to the local emulator. Building a bus makes no storage request, so commands
    that only read the topology work on a machine without settings.

    Raises:
        AppError: the module cannot be imported or fails at start-up, or it holds no bus,
            or several (name one with ``module:attribute``).
    """
    module_name, _, attribute = app.partition(":")
    module = _import(module_name, root or Path.cwd(), offline)
    candidates = {attribute: getattr(module, attribute, None)} if attribute else vars(module)
    found: dict[int, tuple[str, Bus]] = {}
    for name, value in sorted(candidates.items()):
        bus = _bus_of(value)
        if bus is not None:
            found.setdefault(id(bus), (name, bus))
    if not found:
        where = f"{module_name}.{attribute}" if attribute else f"module {module_name!r}"
        raise AppError(f"{where} holds no Bus or BusFunctions object; define one at module "
                       "level (bus_functions = BusFunctions([...])) or pass --app module:name")
    if len(found) > 1:
        names = ", ".join(name for name, _ in found.values())
        raise AppError(f"module {module_name!r} defines several buses ({names}): choose one "
                       f"with --app {module_name}:<name>")
    [(_, bus)] = found.values()
    return bus


def _import(module_name: str, root: Path, offline: bool) -> object:
    path = str(root.resolve())
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        local = LocalSettings.of(root)
    except ConfigurationError as exc:
        raise AppError(f"app {module_name!r} does not start: {exc}") from exc
    try:
        with local.applied(), _placeholder_connection(enabled=offline):
            return importlib.import_module(module_name)
    except ConfigurationError as exc:
        raise AppError(f"app {module_name!r} does not start (settings read from "
                       f"{local.source()}): {exc}") from exc
    except ImportError as exc:
        raise AppError(f"cannot import app module {module_name!r} from {path}: {exc}; run "
                       "from the app's root directory or pass --app") from exc


@contextmanager
def _placeholder_connection(*, enabled: bool) -> Iterator[None]:
    name = os.environ.get("BUS_CONNECTION", "AzureWebJobsStorage")
    if not enabled or os.environ.get(name) or os.environ.get(f"{name}__accountName"):
        yield
        return
    os.environ[name] = OFFLINE_CONNECTION
    try:
        yield
    finally:
        os.environ.pop(name, None)


def _bus_of(value: object) -> Bus | None:
    if isinstance(value, Bus):
        return value
    # Only an app that imported the Functions hosting can hold a BusFunctions; looking it up
    # here keeps azure-functions out of apps that do not use it.
    hosting = sys.modules.get("bus.hosting.functions.app")
    if hosting is not None and isinstance(value, hosting.BusFunctions):
        bus = getattr(value, "bus", None)
        return bus if isinstance(bus, Bus) else None
    return None
