"""The HTML pages: Jinja2 shells that Alpine.js fills from the JSON API in the browser.

The server renders only the frame (navigation, the API's base URL, element ids); every number
and list comes from ``/api`` - the pages use the same API as scripts and tests.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=HERE / "templates")

PAGES = (("endpoints", "/", "Endpoints"), ("poisoned", "/poisoned", "Poisoned messages"),
         ("waiting", "/waiting", "Deferred, scheduled, sessions"),
         ("conversation", "/conversation", "Conversation"), ("audit", "/audit", "Audit trail"))


def router(*, title: str) -> APIRouter:
    pages = APIRouter(include_in_schema=False)

    def render(request: Request, page: str) -> HTMLResponse:
        return TEMPLATES.TemplateResponse(request, f"{page}.html", {
            "page": page, "pages": PAGES, "title": title,
            "root": request.scope.get("root_path", "").rstrip("/")})

    @pages.get("/", response_class=HTMLResponse)
    def endpoints(request: Request) -> HTMLResponse:
        return render(request, "endpoints")

    @pages.get("/poisoned", response_class=HTMLResponse)
    def poisoned(request: Request) -> HTMLResponse:
        return render(request, "poisoned")

    @pages.get("/waiting", response_class=HTMLResponse)
    def waiting(request: Request) -> HTMLResponse:
        return render(request, "waiting")

    @pages.get("/conversation", response_class=HTMLResponse)
    def conversation(request: Request) -> HTMLResponse:
        return render(request, "conversation")

    @pages.get("/audit", response_class=HTMLResponse)
    def audit(request: Request) -> HTMLResponse:
        return render(request, "audit")

    return pages
