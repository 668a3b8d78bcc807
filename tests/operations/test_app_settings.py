"""The command line reads an app's settings as ``func start`` does: the environment, over the
``Values`` of the ``local.settings.json`` beside the app (bus.appsettings)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bus.appsettings import LocalSettings
from bus.errors import ConfigurationError
from bus.operations.apps import AppError, load_bus

ROOT = Path(__file__).resolve().parents[2]
APP = '''
import os
from bus import Bus, Endpoint
from bus.adapters.select import open_storage

if not os.environ.get("AzureWebJobsStorage"):
    from bus.errors import ConfigurationError
    raise ConfigurationError("app setting 'AzureWebJobsStorage' is missing")
bus = Bus(open_storage(os.environ["AzureWebJobsStorage"]), [Endpoint("orders")],
          prefix=os.environ.get("BUS_PREFIX", ""))
'''


def _settings_file(folder: Path, values: dict[str, object]) -> Path:
    path = folder / "local.settings.json"
    path.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    return path


def test_the_environment_wins_over_the_file(tmp_path: Path) -> None:
    _settings_file(tmp_path, {"A": "from file", "B": "from file", "FLAG": True, "N": 5})
    local = LocalSettings.of(tmp_path)
    assert local.merged({"A": "from env"}) == {
        "A": "from env", "B": "from file", "FLAG": "true", "N": "5"}
    assert local.source() == f"the environment and {tmp_path / 'local.settings.json'}"
    assert LocalSettings.of(tmp_path / "nowhere").source() == "the environment"


def test_applied_values_fill_only_what_the_environment_lacks_and_go_away(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUS_TEST_A", "env")
    monkeypatch.delenv("BUS_TEST_B", raising=False)
    _settings_file(tmp_path, {"BUS_TEST_A": "file", "BUS_TEST_B": "file"})
    with LocalSettings.of(tmp_path).applied():
        assert (os.environ["BUS_TEST_A"], os.environ["BUS_TEST_B"]) == ("env", "file")
    assert os.environ["BUS_TEST_A"] == "env" and "BUS_TEST_B" not in os.environ


@pytest.mark.parametrize("content", ["{not json", '{"Values": ["a"]}'])
def test_a_broken_settings_file_is_named(tmp_path: Path, content: str) -> None:
    (tmp_path / "local.settings.json").write_text(content)
    with pytest.raises(ConfigurationError, match=str(tmp_path / "local.settings.json")):
        LocalSettings.of(tmp_path)


def test_an_app_that_does_not_start_names_the_file_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    (tmp_path / "settings_app_missing.py").write_text(APP)
    path = _settings_file(tmp_path, {"BUS_PREFIX": "p"})
    with pytest.raises(AppError, match=f"settings read from the environment and {path}"):
        load_bus("settings_app_missing", root=tmp_path)


def test_the_app_is_built_from_the_files_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    monkeypatch.delenv("BUS_PREFIX", raising=False)
    (tmp_path / "settings_app_memory.py").write_text(APP)
    _settings_file(tmp_path, {"AzureWebJobsStorage": "memory:settings", "BUS_PREFIX": "fromfile"})
    bus = load_bus("settings_app_memory", root=tmp_path)
    assert bus.names.queue("orders").startswith("fromfile")
    assert "AzureWebJobsStorage" not in os.environ  # applied while importing, not after


def test_dlq_list_in_the_apps_folder_needs_nothing_exported(
        azurite_connection: str, prefix: str, tmp_path: Path) -> None:
    """The README's flow: function_app.py beside its local.settings.json, nothing exported."""
    for name in ("function_app.py", "host.json"):
        shutil.copy(ROOT / name, tmp_path / name)
    _settings_file(tmp_path, {"FUNCTIONS_WORKER_RUNTIME": "python",
                              "AzureWebJobsStorage": azurite_connection, "BUS_PREFIX": prefix})
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("AzureWebJobsStorage", "BUS_"))}
    env["PYTHONPATH"] = str(ROOT)
    provision = "import function_app; function_app.bus_functions.bus.provision()"
    subprocess.run([sys.executable, "-c", provision], cwd=tmp_path, check=True,
                   env={**env, "AzureWebJobsStorage": azurite_connection, "BUS_PREFIX": prefix})
    listed = subprocess.run([sys.executable, "-m", "bus", "dlq", "list", "billing", "--json"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == ""  # nothing poisoned: an empty list, not an error


SETTINGS_APP = '''
from bus import Bus, Endpoint, Settings
from bus.adapters.select import open_storage
import os

bus = Bus(open_storage(os.environ["AzureWebJobsStorage"]), [Endpoint("orders")],
          settings=Settings.from_environment())
'''


def test_the_bus_settings_come_from_the_file_and_a_bad_one_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An app that reads its settings with Settings.from_environment, run by the command
    line: the file's BUS_ values are used, and one that cannot be is reported with the file."""
    for name in ("AzureWebJobsStorage", "BUS_PEEK_LEASE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "settings_app_bus.py").write_text(SETTINGS_APP)
    _settings_file(tmp_path, {"AzureWebJobsStorage": "memory:s", "BUS_PEEK_LEASE_SECONDS": 9})
    assert load_bus("settings_app_bus", root=tmp_path).settings.peek_lease_seconds == 9.0
    (tmp_path / "settings_app_bad.py").write_text(SETTINGS_APP)
    path = _settings_file(tmp_path, {"AzureWebJobsStorage": "memory:s",
                                     "BUS_PEEK_LEASE_SECONDS": "a while"})
    with pytest.raises(AppError) as refused:
        load_bus("settings_app_bad", root=tmp_path)
    assert f"settings read from the environment and {path}" in str(refused.value)
    assert "BUS_PEEK_LEASE_SECONDS='a while' is invalid" in str(refused.value)
