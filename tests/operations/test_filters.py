"""Filters on poisoned messages - message type, exception text, reason text, time range - the
same through the Python API, ``python -m bus dlq list`` and the dashboard's
``GET /api/poisoned``, on the in-memory backend and Azurite."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.operations.cli import main
from bus.protocol.poison.poisoned import EntryFilter
from bus.retry import Reject
from bus.storage import Storage
from bus.testing import drain


class Charge(Command):
    order: str


class Refund(Command):
    order: str


def build(storage: Storage, prefix: str) -> Bus:
    payments = Endpoint("payments", retry=RetryPolicy(delays=(0.0,)))

    @payments.handles(Charge, partition=lambda m: m.order)
    def charge(message: Charge, ctx: Context) -> None:
        raise TimeoutError(f"gateway timed out for {message.order}")

    @payments.handles(Refund, partition=lambda m: m.order)
    def refund(message: Refund, ctx: Context) -> None:
        raise Reject("refunds are closed")

    bus = Bus(storage, [payments], prefix=prefix, settings=Settings(max_delivery_count=2))
    bus.provision()
    return bus


@pytest.fixture
def poisoned(storage: Storage, prefix: str) -> Bus:
    bus = build(storage, prefix)
    for order in ("o1", "o2"):
        bus.send(Charge(order=order))
    bus.send(Refund(order="o3"))
    drain(bus, fail_fast=False)
    return bus


def orders(bus: Bus, where: EntryFilter | None) -> list[str]:
    found = bus.poisoned("payments").entries(where=where)
    return sorted(json.loads(x.entry.envelope.payload)["order"]  # type: ignore[union-attr]
                  for x in found)


def test_the_api_filters_by_type_exception_reason_and_time(poisoned: Bus) -> None:
    bus = poisoned
    assert orders(bus, None) == ["o1", "o2", "o3"]
    assert orders(bus, EntryFilter(message_type="Charge")) == ["o1", "o2"]
    assert orders(bus, EntryFilter(message_type="charge")) == []  # a type is exact
    assert orders(bus, EntryFilter(exception="TIMED OUT FOR O2")) == ["o2"]
    assert orders(bus, EntryFilter(reason="rejected")) == ["o3"]
    now = time.time()
    assert orders(bus, EntryFilter(since=now - 600, until=now + 600)) == ["o1", "o2", "o3"]
    assert orders(bus, EntryFilter(since=now + 600)) == []
    assert orders(bus, EntryFilter(until=now - 600)) == []


def test_the_command_line_filters_the_same(poisoned: Bus, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    app = types.ModuleType("filters_app")
    app.bus = poisoned  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "filters_app", app)
    monkeypatch.chdir(tmp_path)

    def listed(*options: str) -> list[str]:
        result = CliRunner().invoke(main, ["dlq", "list", "payments", "--app", "filters_app",
                                           "--json", *options])
        assert result.exit_code == 0, result.output
        return sorted(json.loads(line)["message_type"] for line in result.output.splitlines())

    assert listed("--type", "Refund") == ["Refund"]
    assert listed("--exception", "timed out") == ["Charge", "Charge"]
    assert listed("--reason", "rejected", "--since", "1h") == ["Refund"]
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    assert listed("--since", later) == []
    assert listed("--until", later) == ["Charge", "Charge", "Refund"]
    refused = CliRunner().invoke(main, ["dlq", "list", "payments", "--app", "filters_app",
                                        "--since", "yesterday"])
    assert refused.exit_code == 2 and "neither an ISO 8601 time nor a duration" in refused.output
    summary = CliRunner().invoke(main, ["dlq", "list", "payments", "--app", "filters_app",
                                        "--type", "Charge"])
    assert summary.output.splitlines()[-1] == (
        "2 poisoned message(s) at payments matching the filters")


def test_the_dashboard_filters_the_same(poisoned: Bus) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bus.operations.dashboard import create_app

    client = TestClient(create_app(poisoned, depth_seconds=0))

    def counted(**query: object) -> dict[str | None, int]:
        body = client.get("/api/poisoned", params=query).json()
        return {group["message_type"]: group["count"] for group in body["groups"]}

    assert counted() == {"Charge": 2, "Refund": 1}
    assert counted(message_type="Refund") == {"Refund": 1}
    assert counted(exception="gateway", endpoint="payments") == {"Charge": 2}
    assert counted(reason="rejected") == {"Refund": 1}
    assert counted(since=time.time() + 60) == {}
    assert client.get("/api/poisoned", params={"endpoint": "nowhere"}).status_code == 404
