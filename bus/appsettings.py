"""App settings outside Azure: the environment, over ``local.settings.json``'s ``Values``.

Azure Functions Core Tools (``func start``) applies the ``Values`` of the app's
``local.settings.json`` as environment variables, and a variable already set in the environment
wins. The local host, the command line (``python -m bus``) and the dashboard read an app's
settings the same way, so that a user who followed the README (settings in
``local.settings.json``) is never told to set a value that is already set there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bus.errors import ConfigurationError

LOCAL_SETTINGS = "local.settings.json"


@dataclass(frozen=True)
class LocalSettings:
    """The ``Values`` of one app's ``local.settings.json`` (empty when it has none)."""

    values: Mapping[str, str]
    path: Path | None
    """The file read, or None when the app's folder has none."""

    @classmethod
    def of(cls, root: Path) -> LocalSettings:
        """The settings file in ``root``, read.

        Raises:
            ConfigurationError: the file is not JSON, or its ``Values`` is not an object of
                settings; the message names the file.
        """
        path = root / LOCAL_SETTINGS
        if not path.is_file():
            return cls({}, None)
        try:
            document = json.loads(path.read_text(encoding="utf-8-sig"))
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"{path} cannot be read as JSON: {exc}") from exc
        values = document.get("Values", {}) if isinstance(document, dict) else None
        if not isinstance(values, dict):
            raise ConfigurationError(f"{path}: 'Values' must be an object of app settings "
                                     "(name: value)")
        return cls({str(name): _text(value) for name, value in values.items()}, path)

    def source(self) -> str:
        """Where settings come from, for messages: the environment, and the file if any."""
        return f"the environment and {self.path}" if self.path else "the environment"

    def merged(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The app's settings: ``environ`` (default ``os.environ``) over the file's Values."""
        return {**self.values, **(os.environ if environ is None else environ)}

    @contextmanager
    def applied(self) -> Iterator[LocalSettings]:
        """The file's Values in ``os.environ`` where the environment has none, as ``func
        start`` sets them, and removed again on the way out."""
        added = [name for name in self.values if name not in os.environ]
        for name in added:
            os.environ[name] = self.values[name]
        try:
            yield self
        finally:
            for name in added:
                os.environ.pop(name, None)


def _text(value: object) -> str:
    # Core Tools takes JSON booleans and numbers as their text ("true", "5").
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)
