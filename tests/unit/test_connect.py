"""``bus.connect``: a bus from a connection string, or from the app's settings as the
Functions app reads them (the environment over ``local.settings.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bus import Command, ConfigurationError, Context, Endpoint, connect
from bus.adapters.memory import InMemoryStorage
from bus.testing import drain


class Ping(Command):
    key: str


def pings() -> tuple[Endpoint, list[str]]:
    endpoint = Endpoint("pings")
    seen: list[str] = []

    @endpoint.handles(Ping, partition=lambda m: m.key)
    def ping(message: Ping, ctx: Context) -> None:
        seen.append(message.key)

    return endpoint, seen


@pytest.fixture
def app_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with no settings of its own, and none in the environment."""
    for name in ("AzureWebJobsStorage", "BUS_CONNECTION", "BUS_PREFIX", "BUS_LEASE_SECONDS",
                 "Shop", "Shop__accountName"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def settings_file(folder: Path, **values: str) -> None:
    (folder / "local.settings.json").write_text(json.dumps({"Values": values}))


def test_a_connection_string_or_memory_names_the_storage(app_folder: Path) -> None:
    endpoint, seen = pings()
    receiver = connect("memory:connect-test", [endpoint], prefix="c")
    receiver.provision()
    connect("memory:connect-test", prefix="c", routes={Ping: "pings"}).send(Ping(key="k"))
    assert isinstance(receiver.storage, InMemoryStorage)
    assert drain(receiver)["pings"] == {"processed": 1} and seen == ["k"]


def test_without_a_connection_the_app_s_settings_decide(app_folder: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    settings_file(app_folder, BUS_CONNECTION="Shop", Shop="memory:connect-settings",
                  BUS_PREFIX="fromfile", BUS_LEASE_SECONDS="120")
    monkeypatch.setenv("BUS_LEASE_SECONDS", "90")  # the environment wins, as under func
    bus = connect()
    assert bus.names.queue("pings").startswith("fromfile")
    assert bus.settings.lease_seconds == 90
    assert connect(prefix="given").names.queue("pings").startswith("given")


def test_a_folder_other_than_the_current_one(app_folder: Path, tmp_path_factory:
                                             pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("app")
    settings_file(elsewhere, AzureWebJobsStorage="memory:elsewhere", BUS_PREFIX="there")
    assert connect(root=elsewhere).names.queue("pings").startswith("there")


def test_no_connection_anywhere_says_what_to_set(app_folder: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no storage connection in the environment: "
                                                 r"set AzureWebJobsStorage"):
        connect()
    settings_file(app_folder, BUS_CONNECTION="Shop")
    with pytest.raises(ConfigurationError, match=r"set Shop \(a connection string"):
        connect()


def test_an_invalid_setting_is_named(app_folder: Path) -> None:
    settings_file(app_folder, AzureWebJobsStorage="memory:", BUS_LEASE_SECONDS="soon")
    with pytest.raises(ConfigurationError, match=r"BUS_LEASE_SECONDS='soon' is invalid"):
        connect()


def test_a_malformed_connection_string_is_refused(app_folder: Path) -> None:
    with pytest.raises(ConfigurationError, match="the connection is not an Azure Storage "
                                                 "connection string"):
        connect("not a connection string")


@pytest.mark.azurite
def test_azurite_through_its_connection_string(azurite_connection: str, prefix: str) -> None:
    endpoint, seen = pings()
    bus = connect(azurite_connection, [endpoint], prefix=prefix, routes={Ping: "pings"})
    bus.provision()
    bus.send(Ping(key="a"))
    assert drain(bus)["pings"] == {"processed": 1} and seen == ["a"]
