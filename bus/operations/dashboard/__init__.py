"""The operations dashboard: ``python -m bus dashboard`` (docs/dashboard.md).

``create_app(bus)`` is a FastAPI app: the JSON API under ``/api`` (``api``), the pages
(``pages``, templates and static files beside this module), and the guard that refuses every
action unless ``allow_actions`` (``guard``). Readings of storage are shared by all viewers,
at most one per ``depth_seconds`` per queue (``poller``).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from bus.audit import acting_as, who
from bus.bus import Bus
from bus.errors import AmbiguousSession, ConfigurationError
from bus.operations.dashboard import api, models, pages
from bus.operations.dashboard.functions import PRINCIPAL_SCOPE_KEY
from bus.operations.dashboard.guard import HOW_TO_ALLOW, ActionGuard
from bus.operations.dashboard.monitor import Monitor, UnknownEndpoint, check_bus
from bus.operations.dashboard.poller import Poller

__all__ = ["create_app"]


def create_app(bus: Bus, *, allow_actions: bool = False, depth_seconds: float = 30.0) -> FastAPI:
    """The dashboard of ``bus``; read-only unless ``allow_actions``. Raises
    ConfigurationError for a bus it cannot show or a negative ``depth_seconds``."""
    check_bus(bus)
    if depth_seconds < 0:
        raise ConfigurationError(f"depth_seconds={depth_seconds}: give 0 or more seconds")
    monitor = Monitor(bus, Poller(depth_seconds))
    settings = models.Settings(
        allow_actions=allow_actions, depth_seconds=depth_seconds, endpoints=monitor.endpoints,
        prefix=bus.names.prefix, how_to_allow="" if allow_actions else HOW_TO_ALLOW)
    title = "eobus dashboard"
    app = FastAPI(title=title, version="1",
                  description="The operations API of an exactly-once bus (docs/dashboard.md). "
                              "POST routes answer 403 unless the dashboard allows actions.",
                  openapi_url="/api/openapi.json", docs_url=None, redoc_url=None)
    app.state.monitor = monitor

    @app.get("/api/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        # Swagger UI from the package (vendored, pinned), never from a CDN: the dashboard's
        # origin runs no script it does not ship, and works offline.
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}/api/openapi.json", title=f"{title} - API",
            swagger_js_url=f"{root}/static/vendor/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{root}/static/vendor/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{root}/static/favicon.svg")

    app.include_router(api.router(monitor, settings))
    app.include_router(pages.router(title=title))
    app.mount("/static", StaticFiles(directory=pages.HERE / "static"), name="static")

    @app.exception_handler(UnknownEndpoint)
    async def unknown(request: Request, exc: UnknownEndpoint) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(AmbiguousSession)
    async def ambiguous(request: Request, exc: AmbiguousSession) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    app.add_middleware(ActionGuard, allow_actions=allow_actions)
    app.add_middleware(_ActingAs)
    return app


class _ActingAs:
    """Operator actions taken through the dashboard are recorded (``bus.audit``) as the
    principal App Service Authentication signed in (``behind_easy_auth``), else as the
    dashboard process's user, marked as the dashboard's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        signed_in = scope.get(PRINCIPAL_SCOPE_KEY)
        with acting_as(signed_in if isinstance(signed_in, str) else f"{who()} (dashboard)"):
            await self.app(scope, receive, send)
