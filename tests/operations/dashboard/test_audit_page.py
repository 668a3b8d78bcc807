"""The dashboard's audit trail: its actions are recorded as the dashboard process's user
(behind App Service Authentication, as the signed-in principal: test_functions_mount.py),
``GET /api/audit`` lists them newest first, and the Audit trail page shows them."""

from __future__ import annotations

import pytest

from bus.audit import who
from bus.testing import InMemoryStorage
from tests.operations.dashboard import shop

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from bus.operations.dashboard import create_app


def test_actions_through_the_dashboard_are_recorded_and_listed() -> None:
    bus = shop.build(InMemoryStorage(), "au")
    client = TestClient(create_app(bus, allow_actions=True),
                        headers={"origin": "http://testserver"})
    assert client.post("/api/endpoints/orders/pause",
                       json={"seconds": 60, "reason": "deploying"}).status_code == 200
    assert client.post("/api/endpoints/orders/resume").status_code == 200
    listed = client.get("/api/audit", params={"limit": 10})
    assert listed.status_code == 200
    assert [(r["action"], r["endpoint"], r["who"]) for r in listed.json()] == [
        ("resume", "orders", f"{who()} (dashboard)"), ("pause", "orders", f"{who()} (dashboard)")]
    assert listed.json()[1]["target"] == {"seconds": 60, "reason": "deploying"}
    assert client.get("/api/audit", params={"limit": 0}).status_code == 422
    page = client.get("/audit")
    assert page.status_code == 200 and 'id="audit-table"' in page.text
