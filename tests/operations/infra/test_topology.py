"""infra/topology.json is generated from the app, and stays in sync with it.

The drift test regenerates the file from ``function_app`` in memory and compares it with the
committed one; it needs no Azurite (building the app's bus makes no storage request).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus import Bus, ConfigurationError
from bus.adapters.memory import InMemoryStorage
from bus.operations.apps import AppError, load_bus
from bus.operations.cli import main
from bus.operations.topology_file import TopologyFile, drift, topic_file
from bus.protocol.copies.topics import Topics

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "infra" / "topology.json"
EXPORT = "python -m bus topology export"


@pytest.fixture
def app_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What ``function_app`` needs to import: a storage setting (never used here)."""
    monkeypatch.setenv("AzureWebJobsStorage", "UseDevelopmentStorage=true")
    for name in ("BUS_PREFIX", "BUS_ENDPOINTS", "BUS_CONNECTION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)
    sys.modules.pop("function_app", None)
    yield
    sys.modules.pop("function_app", None)


@pytest.fixture
def app_bus(app_environment: None) -> Bus:
    return load_bus("function_app", root=ROOT)


def test_topology_file_is_in_sync_with_the_app(app_bus: Bus) -> None:
    result = drift(app_bus, COMMITTED, app="function_app")
    assert result.in_sync, (
        f"infra/topology.json is stale: the app's endpoints or subscriptions changed. Run "
        f"`{EXPORT}` and commit infra/topology.json.\n{result.diff()}")


def test_the_file_holds_everything_provision_creates_byte_for_byte(
        app_bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    committed = json.loads(COMMITTED.read_text())
    storage = InMemoryStorage()
    containers: list[str] = []
    create_container = storage.blobs.create_container
    monkeypatch.setattr(storage.blobs, "create_container",
                        lambda name: (containers.append(name), create_container(name))[1])
    twin = Bus(storage, list(app_bus.topology.endpoints.values()),
               prefix=committed["prefix"], routes=app_bus.topology.routes)
    twin.provision()

    endpoints = committed["endpoints"]
    assert set(storage.queues.names()) == {e["queue"] for e in endpoints} | {
        e["poisonQueue"] for e in endpoints}
    assert set(storage.tables.names()) == {e["stateTable"] for e in endpoints} | set(
        committed["tables"])
    assert set(containers) == set(committed["containers"])
    topic_container = committed["topicContainer"]
    written = {name: storage.blobs.read(topic_container, name).data
               for name in storage.blobs.list(topic_container)}
    assert written == {t["blob"]: t["content"].encode() for t in committed["topics"]}
    for topic in committed["topics"]:
        assert twin.parts.topics.subscribers(topic["topic"]) == topic["subscribers"]


def test_export_is_deterministic_and_uses_the_names_rule(app_bus: Bus) -> None:
    first = TopologyFile.from_bus(app_bus, app="function_app", prefix="stage").to_json()
    again = TopologyFile.from_bus(app_bus, app="function_app", prefix="stage").to_json()
    assert first == again and first.endswith("}\n")
    document = json.loads(first)
    assert list(document) == sorted(document)
    names = app_bus.names.__class__("stage")
    assert document["prefix"] == "stage"
    assert [e["name"] for e in document["endpoints"]] == sorted(app_bus.topology.endpoints)
    for endpoint in document["endpoints"]:
        assert endpoint["queue"] == names.queue(endpoint["name"])
        assert endpoint["poisonQueue"] == names.poison_queue(endpoint["name"])
        assert endpoint["stateTable"] == names.state_table(endpoint["name"])
    assert names.tokens_table in document["tables"]
    assert {names.payload_container, names.topic_container} == set(document["containers"])
    assert document["topicContainer"] == names.topic_container


def test_a_topic_file_is_what_the_bus_reads() -> None:
    file = topic_file("OrderPlaced", ["billing", "shipping"])
    storage = InMemoryStorage()
    storage.blobs.create_container("topics")
    storage.blobs.write("topics", file.blob, file.content.encode())
    assert Topics(storage.blobs, "topics").subscribers("OrderPlaced") == ["billing", "shipping"]
    assert file.blob == "OrderPlaced.json"


def test_a_stale_file_is_reported_with_the_command_to_run(
        app_environment: None, tmp_path: Path) -> None:
    stale = tmp_path / "topology.json"
    document = json.loads(COMMITTED.read_text())
    document["endpoints"] = document["endpoints"][1:]
    stale.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    result = CliRunner().invoke(main, ["topology", "check", "--file", str(stale)])
    assert result.exit_code == 1
    assert f"{EXPORT} --app function_app --out {stale}" in result.output
    missing = CliRunner().invoke(main, ["topology", "check", "--file", str(tmp_path / "no")])
    assert missing.exit_code == 1 and "is missing" in missing.output


def test_export_writes_the_committed_file(app_environment: None, tmp_path: Path) -> None:
    out = tmp_path / "topology.json"
    result = CliRunner().invoke(main, ["topology", "export", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == COMMITTED.read_text()
    shown = CliRunner().invoke(main, ["topology", "show"])
    assert "OrderPlaced -> billing, shipping" in shown.output


def test_python_m_bus_checks_without_any_settings() -> None:
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "bus", "topology", "check"], cwd=ROOT,
                            env=environment, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "in sync" in result.stdout


# -- finding the app's bus -------------------------------------------------------------------

APP = """
from bus import Bus, Endpoint
from bus.adapters.memory import InMemoryStorage
first = Bus(InMemoryStorage(), [Endpoint("a")])
second = Bus(InMemoryStorage(), [Endpoint("b")])
alias = first
"""


@pytest.fixture
def two_bus_app(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "two_bus_app.py").write_text(APP)
    (tmp_path / "no_bus_app.py").write_text("value = 1\n")
    yield tmp_path
    for name in ("two_bus_app", "no_bus_app"):
        sys.modules.pop(name, None)


def test_an_app_with_several_buses_must_name_one(two_bus_app: Path) -> None:
    with pytest.raises(AppError, match=r"several buses \(alias, second\).*--app two_bus_app:"):
        load_bus("two_bus_app", root=two_bus_app)
    assert list(load_bus("two_bus_app:second", root=two_bus_app).topology.endpoints) == ["b"]


def test_an_app_without_a_bus_or_module_says_so(two_bus_app: Path) -> None:
    with pytest.raises(AppError, match="holds no Bus or BusFunctions"):
        load_bus("no_bus_app", root=two_bus_app)
    with pytest.raises(AppError, match="cannot import app module 'absent_app'"):
        load_bus("absent_app", root=two_bus_app)
    result = CliRunner().invoke(main, ["topology", "show", "--app", "absent_app"])
    assert result.exit_code == 2


def test_an_invalid_prefix_is_refused_with_the_rule(app_environment: None) -> None:
    result = CliRunner().invoke(main, ["topology", "export", "--prefix", "Bad", "--out", "-"])
    assert result.exit_code == 2
    assert "prefix 'Bad' is invalid" in result.output


def test_a_queue_the_file_has_no_place_for_is_an_error(
        app_bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    provision = Bus.provision

    def provision_more(self: Bus) -> None:
        provision(self)
        self.storage.queues.create_queue("extra")

    monkeypatch.setattr(Bus, "provision", provision_more)
    with pytest.raises(ConfigurationError, match=r"creates queues \['extra'\]"):
        TopologyFile.from_bus(app_bus, app="function_app")


def test_reader_endpoints_get_their_queues_and_subscriptions_in_the_file(
        app_environment: None) -> None:
    """A Spark job reading ``analytics`` is declared in the app: the deployment then makes its
    queues and writes its subscriptions, and a Spark identity that may only read topic files
    finds itself subscribed."""
    from function_app import OrderBilled, OrderPlaced, billing, orders, shipping

    bus = Bus(InMemoryStorage(), [orders, billing, shipping],
              readers={"analytics": [OrderBilled, "Audit"], "audit": ["Audit"]})
    document = json.loads(TopologyFile.from_bus(bus, app="function_app").to_json())
    assert document["readers"] == [
        {"name": "analytics", "poisonQueue": "analytics-poison", "queue": "analytics"},
        {"name": "audit", "poisonQueue": "audit-poison", "queue": "audit"}]
    subscribers = {t["topic"]: t["subscribers"] for t in document["topics"]}
    assert subscribers == {"Audit": ["analytics", "audit"], "OrderBilled": ["orders", "analytics"],
                           OrderPlaced.message_type: ["billing", "shipping"]}
    assert not any(e["name"] == "analytics" for e in document["endpoints"])  # not hosted
    bus.provision()
    assert bus.parts.topics.subscribers("OrderBilled") == ["orders", "analytics"]
    assert {"analytics", "analytics-poison"} <= set(bus.storage.queues.names())  # type: ignore[attr-defined]


@pytest.mark.parametrize(("readers", "problem"), [
    ({"orders": ["Audit"]}, "'orders' is an endpoint of this app"),
    ({"analytics": "Audit"}, "give a list of topics"),
    ({"analytics": [42]}, "neither an event class nor a topic name"),
    ({"Bad Name!": ["Audit"]}, "endpoint name"),
])
def test_a_wrong_reader_is_refused_at_start_up(app_environment: None,
                                               readers: dict[str, object], problem: str) -> None:
    from function_app import orders

    with pytest.raises((ConfigurationError, ValueError), match=problem):
        Bus(InMemoryStorage(), [orders], readers=readers)  # type: ignore[arg-type]
