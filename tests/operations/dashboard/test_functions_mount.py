"""docs/dashboard.md's Functions mounting, run as written: the block marked
``# example: functions-mount`` registers an HTTP function on a ``func.FunctionApp``, which is
then called with ``func.HttpRequest`` objects through the azure-functions AsgiMiddleware (no
host, no Azure: the function's own code path)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import azure.functions as func
import pytest

from bus import Bus
from bus.errors import ConfigurationError
from bus.operations.dashboard import create_app
from bus.operations.dashboard.functions import behind_easy_auth
from bus.testing import InMemoryStorage
from tests.operations.dashboard import shop

DOC = Path(__file__).resolve().parents[3] / "docs" / "dashboard.md"
CLAIMS = {"auth_typ": "aad", "claims": [{"typ": "name", "val": "op@example.org"}],
          "name_typ": "name", "role_typ": "roles"}
PRINCIPAL = {"x-ms-client-principal": base64.b64encode(json.dumps(CLAIMS).encode()).decode(),
             "x-ms-client-principal-id": "0b5c", "x-ms-client-principal-name": "op@example.org"}
"""The headers App Service Authentication adds to a signed-in operator's request."""


def documented_block() -> str:
    [block] = re.findall(r"```python\n# example: functions-mount\n(.*?)```", DOC.read_text(),
                         flags=re.DOTALL)
    return block


def registered(bus: Bus, monkeypatch: pytest.MonkeyPatch, actions: bool) -> func.FunctionBuilder:
    monkeypatch.setenv("WEBSITE_AUTH_ENABLED", "True")  # what the platform sets
    if actions:
        monkeypatch.setenv("BUS_DASHBOARD_ACTIONS", "true")
    else:
        monkeypatch.delenv("BUS_DASHBOARD_ACTIONS", raising=False)
    app = func.FunctionApp()
    exec(documented_block(), {"app": app, "bus_functions": SimpleNamespace(bus=bus), "os": os})
    [function] = [f for f in app.get_functions() if f.get_function_name() == "bus_dashboard"]
    return function  # type: ignore[no-any-return]


def call(function: func.FunctionBuilder, method: str, path: str,
         headers: dict[str, str] | None = None, body: bytes = b"") -> func.HttpResponse:
    request = func.HttpRequest(method, f"https://app.azurewebsites.net{path}",
                               headers=headers or {}, body=body)
    return asyncio.run(function.get_user_function()(request, None))  # type: ignore[no-any-return]


def test_the_documented_function_serves_the_dashboard_behind_easy_auth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bus = shop.build(InMemoryStorage(), "fm")
    function = registered(bus, monkeypatch, actions=False)
    [trigger] = [b for b in function.get_bindings_dict()["bindings"]
                 if b["type"] == "httpTrigger"]
    assert trigger["route"] == "dashboard/{*path}"
    assert str(trigger["authLevel"].value) == "anonymous"
    settings = call(function, "GET", "/api/dashboard/api/settings", PRINCIPAL)
    assert settings.status_code == 200
    assert b'"allow_actions":false' in settings.get_body()
    page = call(function, "GET", "/api/dashboard/poisoned", PRINCIPAL)
    assert page.status_code == 200 and page.mimetype.startswith("text/html")
    text = page.get_body().decode()
    assert 'content="/api/dashboard/api"' in text  # the pages fetch under the mount
    assert 'src="/api/dashboard/static/vendor/alpinejs/cdn.min.js"' in text
    script = call(function, "GET", "/api/dashboard/static/vendor/alpinejs/cdn.min.js", PRINCIPAL)
    assert script.status_code == 200 and len(script.get_body()) > 10_000
    refused = call(function, "POST", "/api/dashboard/api/endpoints/orders/pause", PRINCIPAL,
                   b'{"seconds": 60}')
    assert refused.status_code == 403  # read-only unless BUS_DASHBOARD_ACTIONS=true
    for path in ("/api/dashboard/", "/api/dashboard/api/poisoned"):
        assert call(function, "GET", path).status_code == 401  # not through Easy Auth


def test_actions_when_the_app_setting_allows_them(monkeypatch: pytest.MonkeyPatch) -> None:
    bus = shop.build(InMemoryStorage(), "fm")
    function = registered(bus, monkeypatch, actions=True)
    paused = call(function, "POST", "/api/dashboard/api/endpoints/orders/pause",
                  {**PRINCIPAL, "content-type": "application/json"},
                  b'{"seconds": 60, "reason": "from Functions"}')
    assert paused.status_code == 200, paused.get_body()
    pause = bus.paused("orders")
    assert pause is not None and pause.reason == "from Functions"
    # The audit trail names the principal App Service Authentication signed in.
    [record] = bus.audit_trail()
    assert (record.action, record.who) == ("pause", "op@example.org (0b5c)")
    listed = call(function, "GET", "/api/dashboard/api/audit?limit=5", PRINCIPAL)
    assert [r["who"] for r in json.loads(listed.get_body())] == ["op@example.org (0b5c)"]


@pytest.mark.parametrize("setting", [None, "False", ""])
def test_the_mount_refuses_to_start_while_app_service_authentication_is_off(
        setting: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With Authentication off the platform strips no client-sent principal headers."""
    bus = shop.build(InMemoryStorage(), "fm")
    environ = {} if setting is None else {"WEBSITE_AUTH_ENABLED": setting}
    with pytest.raises(ConfigurationError, match="WEBSITE_AUTH_ENABLED"):
        behind_easy_auth(create_app(bus), environ=environ)
    monkeypatch.delenv("WEBSITE_AUTH_ENABLED", raising=False)  # the process's, by default
    with pytest.raises(ConfigurationError, match="turn Authentication on"):
        behind_easy_auth(create_app(bus))


@pytest.mark.parametrize("headers", [
    {"x-ms-client-principal-id": "0b5c"},  # the id alone, as anyone can send it
    {**PRINCIPAL, "x-ms-client-principal": "bm90IGpzb24="},  # base64, not JSON
    {**PRINCIPAL, "x-ms-client-principal": base64.b64encode(b'{"claims": []}').decode()},
    {**PRINCIPAL, "x-ms-client-principal": "%%%"},
    {key: value for key, value in PRINCIPAL.items() if key != "x-ms-client-principal-id"},
], ids=["id only", "not json", "no identity provider", "not base64", "no id"])
def test_a_request_without_the_platforms_principal_is_refused(
        headers: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    function = registered(shop.build(InMemoryStorage(), "fm"), monkeypatch, actions=False)
    assert call(function, "GET", "/api/dashboard/api/settings", headers).status_code == 401
    assert call(function, "GET", "/api/dashboard/api/settings", PRINCIPAL).status_code == 200
