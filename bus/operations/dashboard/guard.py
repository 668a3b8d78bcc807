"""Actions only when allowed: every request that is not a read is refused in read-only mode.

The check sits in front of the whole app (an ASGI middleware), not in each route, so a POST
route added later cannot forget it. When actions are allowed, a state-changing request must
come from the dashboard's own pages: one whose ``Origin`` names another site (a page elsewhere
posting to the operator's local dashboard) is refused too.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HOW_TO_ALLOW = ("the dashboard is read-only: start it with `python -m bus dashboard "
                "--allow-actions` (or create_app(bus, allow_actions=True)) to replay, purge, "
                "pause, resume, release, skip or close")


class ActionGuard:
    def __init__(self, app: ASGIApp, *, allow_actions: bool) -> None:
        self.app = app
        self.allow_actions = allow_actions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        if not self.allow_actions:
            await _refuse(send, HOW_TO_ALLOW)
            return
        origin = _header(scope, b"origin")
        host = _header(scope, b"host")
        if origin is not None and urlsplit(origin).netloc != host:
            await _refuse(send, f"a request from {origin} may not act on this dashboard "
                                "(only its own pages may)")
            return
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _refuse(send: Send, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
