"""Serving the dashboard from the Functions app, behind App Service Authentication.

The Functions host hands an HTTP-triggered function the whole URL path (``/api/dashboard/...``
for the route ``dashboard/{*path}`` under host.json's default ``routePrefix``, ``api``) with an
empty ASGI ``root_path``; ``behind_easy_auth`` mounts the dashboard at that path, so its pages
link and fetch under it, and refuses every request that did not come through App Service
Authentication (Easy Auth). The platform adds the signed-in principal to a request
(``X-MS-CLIENT-PRINCIPAL``, base64 JSON with the identity provider and the claims, and
``X-MS-CLIENT-PRINCIPAL-ID``) and strips client-sent copies - but only while its authentication
module is on for the path. So the mount fails closed twice: at start-up when the app's
``WEBSITE_AUTH_ENABLED`` (set by the platform) is not ``True``, and per request when the
principal is missing or is not the platform's form. docs/dashboard.md shows the function.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from bus.errors import ConfigurationError

PRINCIPAL_HEADER = b"x-ms-client-principal"
PRINCIPAL_ID_HEADER = b"x-ms-client-principal-id"
PRINCIPAL_NAME_HEADER = b"x-ms-client-principal-name"
PRINCIPAL_SCOPE_KEY = "bus.principal"
"""Where the mount leaves the validated principal in the request's ASGI scope: the dashboard
records operator actions as that principal's (``bus.audit``)."""
AUTH_SETTING = "WEBSITE_AUTH_ENABLED"
"""Set by the platform to ``True`` while App Service Authentication is on for the app."""


def behind_easy_auth(app: ASGIApp, *, path: str = "/api/dashboard",
                     require_principal: bool = True,
                     environ: Mapping[str, str] | None = None) -> ASGIApp:
    """``app`` (the dashboard) mounted at ``path``, answering 401 to requests without the
    platform's authenticated principal unless ``require_principal`` is False (a local run).
    Raises ConfigurationError when the principal is required and ``environ``'s (the
    process's) ``WEBSITE_AUTH_ENABLED`` says App Service Authentication is off: anyone could
    then send the principal's headers."""
    if require_principal:
        setting = (os.environ if environ is None else environ).get(AUTH_SETTING, "")
        if setting.strip().lower() != "true":
            raise ConfigurationError(
                f"the dashboard is served only behind App Service Authentication, and "
                f"{AUTH_SETTING} is {setting[:20]!r}: turn Authentication on for the function "
                "app with Require authentication (docs/dashboard.md); the platform then sets "
                f"{AUTH_SETTING}=True")
    inner = _RequirePrincipal(app) if require_principal else app
    return Starlette(routes=[Mount(path.rstrip("/"), app=inner)])


def principal(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The signed-in principal's id when ``headers`` carry the platform's principal: an
    ``X-MS-CLIENT-PRINCIPAL`` that is base64 JSON naming its identity provider and claims,
    and an ``X-MS-CLIENT-PRINCIPAL-ID``; None otherwise."""
    found = {key.lower(): value for key, value in headers}
    encoded, principal_id = found.get(PRINCIPAL_HEADER), found.get(PRINCIPAL_ID_HEADER)
    if not encoded or not principal_id:
        return None
    try:
        document = json.loads(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError, RecursionError):
        return None
    if not (isinstance(document, dict) and isinstance(document.get("auth_typ"), str)
            and document["auth_typ"] and isinstance(document.get("claims"), list)):
        return None
    return principal_id.decode("utf-8", errors="replace")


class _RequirePrincipal:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = principal(scope["headers"]) if scope["type"] == "http" else None
        if found is not None:
            names = {key.lower(): value for key, value in scope["headers"]}
            name = names.get(PRINCIPAL_NAME_HEADER, b"").decode("utf-8", errors="replace")
            scope[PRINCIPAL_SCOPE_KEY] = f"{name} ({found})" if name else found
        if scope["type"] == "http" and found is None:
            body = json.dumps({"detail": "sign in: the dashboard is served only behind App "
                                         "Service Authentication (docs/dashboard.md)"}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
