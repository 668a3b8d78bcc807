"""Serving the dashboard from the Functions app, behind App Service Authentication.

The Functions host hands an HTTP-triggered function the whole URL path (``/api/dashboard/...``
for the route ``dashboard/{*path}`` under host.json's default ``routePrefix``, ``api``) with an
empty ASGI ``root_path``; ``behind_easy_auth`` mounts the dashboard at that path, so its pages
link and fetch under it, and refuses every request that did not come through App Service
Authentication (Easy Auth): the platform adds ``X-MS-CLIENT-PRINCIPAL-ID`` to a signed-in
user's request and strips it from what a client sends, so a request without it did not pass
the platform's check (Easy Auth off, or a path excluded from it). docs/dashboard.md shows the
function.
"""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

PRINCIPAL_HEADER = b"x-ms-client-principal-id"


def behind_easy_auth(app: ASGIApp, *, path: str = "/api/dashboard",
                     require_principal: bool = True) -> ASGIApp:
    """``app`` (the dashboard) mounted at ``path``, answering 401 to requests without an
    authenticated principal unless ``require_principal`` is False."""
    inner = _RequirePrincipal(app) if require_principal else app
    return Starlette(routes=[Mount(path.rstrip("/"), app=inner)])


class _RequirePrincipal:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not any(
                key.lower() == PRINCIPAL_HEADER and value for key, value in scope["headers"]):
            body = json.dumps({"detail": "sign in: the dashboard is served only behind App "
                                         "Service Authentication (docs/dashboard.md)"}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
