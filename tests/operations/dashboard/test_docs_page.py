"""The dashboard's API reference (``/api/docs``): Swagger UI served from the package -
vendored unmodified from the pinned npm package, never loaded from a CDN into the dashboard's
origin - so it works offline and runs no script the package does not ship
(``test_api.py`` checks the vendored files against ``node_modules``)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from bus.operations.dashboard import create_app
from tests.support import memory_app


def test_the_api_reference_loads_nothing_from_elsewhere() -> None:
    client = TestClient(create_app(memory_app.bus))
    page = client.get("/api/docs")
    assert page.status_code == 200
    assert not re.search(r"(src|href)=\"(https?:)?//", page.text), page.text
    assert "https://" not in page.text and "http://" not in page.text
    for asset in re.findall(r"(?:src|href)=\"(/static/[^\"]+)\"", page.text):
        assert client.get(asset).status_code == 200, asset
    assert client.get("/api/openapi.json").json()["info"]["title"] == "eobus dashboard"

