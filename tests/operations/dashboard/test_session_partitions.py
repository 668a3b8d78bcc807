"""The dashboard's session actions name the partition when the session key has rows in
several (tests/protocol/test_session_partitions.py has the operator API and the CLI)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from bus.operations.dashboard import create_app
from tests.protocol.test_session_partitions import build


def test_the_dashboard_asks_for_the_partition() -> None:
    bus = build()
    client = TestClient(create_app(bus, allow_actions=True, depth_seconds=0),
                        headers={"Origin": "http://testserver"})
    refused = client.post("/api/sessions/desk/c1/close")
    assert refused.status_code == 409 and "partition" in refused.json()["detail"]
    done = client.post("/api/sessions/desk/c1/close?partition=o2")
    assert done.status_code == 200, done.text
    listed = {s["partition"]: s["status"] for s in client.get("/api/sessions").json()}
    assert listed == {"o1": "open", "o2": "closed"}
