"""App settings as the host applies them: ``local.settings.json`` and ``%NAME%`` references."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from bus.appsettings import LocalSettings
from bus.errors import ConfigurationError


def load_local_settings(script_root: Path) -> dict[str, str]:
    """``local.settings.json`` Values, as ``func start`` applies them (the environment wins);
    read as the command line reads them (``bus.appsettings``)."""
    try:
        return dict(LocalSettings.of(script_root).values)
    except ConfigurationError as exc:
        raise SystemExit(f"local host: {exc}") from exc


def resolve(value: str, environ: Mapping[str, str] | None = None) -> str:
    """``%NAME%`` references in a binding property or host.json value replaced by app
    settings, as the host resolves them; a missing setting stops the host with its name."""
    settings = os.environ if environ is None else environ

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in settings:
            raise SystemExit(f"local host: the app refers to app setting %{name}% which is not "
                             "set; add it to local.settings.json (Values) or the environment")
        return settings[name]

    return re.sub(r"%([^%]+)%", lookup, value)
