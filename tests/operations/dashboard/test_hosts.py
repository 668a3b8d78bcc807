"""``python -m bus dashboard`` answers only to the host names it is served under: this
machine's loopback names, and each ``--allowed-host`` - which any ``--host`` beyond loopback
requires. A page of another site that reaches the server through a DNS name of its own (DNS
rebinding) is refused, reads and actions alike."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from bus.operations.cli import main

APP = ["--app", "tests.support.memory_app"]


def served(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[Any, Any]:
    """The command's result, and the ASGI app it would have served (None when it did not
    start)."""
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: started.append(app))
    result = CliRunner().invoke(main, ["dashboard", *APP, "--allow-actions", *args])
    return result, started[0] if started else None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_serving_beyond_loopback_needs_the_names_it_is_reached_by(
        host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    result, web = served(monkeypatch, "--host", host)
    assert result.exit_code == 2 and web is None
    assert "--allowed-host NAME" in result.output


def test_only_the_allowed_names_are_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    result, web = served(monkeypatch, "--host", "0.0.0.0", "--allowed-host", "dash.internal")
    assert result.exit_code == 0, result.output
    own = TestClient(web, base_url="http://dash.internal:8080")
    assert own.get("/api/settings").status_code == 200
    rebound = TestClient(web, base_url="http://evil.example:8080")
    assert rebound.get("/api/settings").status_code == 400
    acted = rebound.post("/api/endpoints/desk/pause", json={"seconds": 60},
                         headers={"origin": "http://evil.example:8080"})
    assert acted.status_code == 400
    assert own.post("/api/endpoints/desk/pause", json={"seconds": 60},
                    headers={"origin": "http://dash.internal:8080"}).status_code == 200


def test_loopback_needs_no_list(monkeypatch: pytest.MonkeyPatch) -> None:
    result, web = served(monkeypatch)
    assert result.exit_code == 0, result.output
    assert TestClient(web, base_url="http://127.0.0.1:8080").get(
        "/api/settings").status_code == 200
    assert TestClient(web, base_url="http://evil.example:8080").get(
        "/api/settings").status_code == 400
