"""One reader of the bus's settings: every field of ``Settings`` is the app setting
``BUS_<NAME>``, read by ``Settings.from_environment``, documented in docs/configuration.md, and
refused with its name and source when it cannot be used. The fields are enumerated from the
model, so a new field is covered the day it is added."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest

from bus.errors import ConfigurationError
from bus.hosting.functions.config import AppConfig
from bus.settings import OWN_SETTINGS, Settings, setting_name

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
FIELDS = [name for name in Settings.model_fields if name not in OWN_SETTINGS]
CONNECTED = {"AzureWebJobsStorage": "UseDevelopmentStorage=true"}


def shown(value: object) -> str:
    """A default as docs/configuration.md writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "off"
    if isinstance(value, tuple):
        return ",".join(shown(item) for item in value) if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def other_value(name: str) -> tuple[str, object]:
    """A setting's text for ``name`` that is valid and differs from the default, and the
    value it must give."""
    default = getattr(Settings(), name)
    annotation = Settings.model_fields[name].annotation
    if typing.get_origin(annotation) is typing.Literal:
        choice = next(c for c in typing.get_args(annotation) if c != default)
        return str(choice), choice
    if default is not None and type(None) in typing.get_args(annotation):
        return "off", None
    if isinstance(default, tuple):
        return "1.5, 90", (1.5, 90.0)
    if isinstance(default, bool):
        return ("false", False) if default else ("true", True)
    if isinstance(default, int):
        return str(default + 3), default + 3
    if isinstance(default, float):
        return str(default + 2.5), default + 2.5
    if isinstance(default, str):
        return default + "-other", default + "-other"
    if default is None and name == "alert_webhook":
        return "https://hooks.example.com/T0/B0", "https://hooks.example.com/T0/B0"
    raise AssertionError(f"no test value for Settings.{name} ({annotation}): add one")


def test_every_setting_is_in_the_doc_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(BUS_\w+)` \| ([^|]+?) \|", DOC.read_text(encoding="utf-8"),
                           re.M))
    expected = {setting_name(name): shown(getattr(Settings(), name)) for name in FIELDS}
    assert rows == expected


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_is_read_from_its_app_setting(name: str) -> None:
    text, value = other_value(name)
    assert getattr(Settings.from_environment({}), name) == getattr(Settings(), name)
    assert getattr(Settings.from_environment({setting_name(name): text}), name) == value
    assert getattr(Settings.from_environment({setting_name(name): f"  {text} "}), name) == value


@pytest.mark.parametrize("name", [n for n in FIELDS
                                  if not isinstance(getattr(Settings(), n), str)
                                  or typing.get_origin(Settings.model_fields[n].annotation)
                                  is typing.Literal])
def test_a_value_that_cannot_be_used_is_refused_with_its_name_and_source(name: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_environment({setting_name(name): "-7 parsecs"}, source="settings.json")
    assert f"{setting_name(name)}='-7 parsecs' is invalid" in str(refused.value)
    assert "settings.json" in str(refused.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_environment({"BUS_LEASE_SECONDS": "-3", "BUS_SEND_ATTEMPTS": "0",
                                   "BUS_SIGNING": "sometimes"})
    text = str(refused.value)
    assert all(name in text for name in ("BUS_LEASE_SECONDS", "BUS_SEND_ATTEMPTS",
                                         "BUS_SIGNING"))


def test_settings_given_in_code_are_kept_where_no_app_setting_is_set() -> None:
    code = Settings(lease_seconds=30.0, client_name="shop")
    read = Settings.from_environment({"BUS_CLIENT_NAME": "till"}, base=code)
    assert (read.lease_seconds, read.client_name) == (30.0, "till")


def test_the_functions_app_reads_the_bus_settings_there(tmp_path: Path) -> None:
    """AppConfig takes the bus's settings from Settings.read (app settings over code), and
    host.json's maxDequeueCount as the max delivery count."""
    host_json = tmp_path / "host.json"
    host_json.write_text('{"extensions": {"queues": {"maxDequeueCount": 3}}}')
    env: dict[str, Any] = {**CONNECTED, "BUS_PEEK_LEASE_SECONDS": "12"}
    config = AppConfig.from_environment(env, host_json, settings=Settings(send_attempts=2))
    assert (config.settings.peek_lease_seconds, config.settings.send_attempts,
            config.settings.max_delivery_count) == (12.0, 2, 3)
    with pytest.raises(ConfigurationError, match="BUS_MAX_DELIVERY_COUNT='9' disagrees"):
        AppConfig.from_environment({**env, "BUS_MAX_DELIVERY_COUNT": "9"}, host_json)
    assert AppConfig.from_environment({**env, "BUS_MAX_DELIVERY_COUNT": "3"},
                                      host_json).settings.max_delivery_count == 3
    with pytest.raises(ConfigurationError) as refused:
        AppConfig.from_environment({"BUS_LEASE_SECONDS": "soon"}, host_json)
    assert "AzureWebJobsStorage" in str(refused.value)  # reported together
    assert "BUS_LEASE_SECONDS='soon' is invalid" in str(refused.value)
