"""Fixtures of the browser tests: Debian's Chromium driven by Playwright, the dashboard served
by uvicorn on a free loopback port, over the shop app (tests/operations/browser/shop.py) on Azurite.

Playwright never downloads a browser here: it launches the system's ``chromium`` (installed by
``make setup`` with apt-get; ``CHROMIUM_PATH`` names another) through ``executable_path``.
Each page test saves a screenshot of what it checked, ``dashboard-<page>.png``, always
1280x800: into the system's temporary directory, or into ``DASHBOARD_SCREENSHOTS`` (``make
screenshots`` writes docs/img's - a plain test run leaves the tree as it was).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from bus.adapters.azure import AzureStorage
from tests.operations.browser.shop import Shop, build, with_traffic

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")  # for anything it starts
ROOT = Path(__file__).resolve().parents[3]
VIEWPORT = {"width": 1280, "height": 800}
SCREENSHOTS = Path(os.environ.get("DASHBOARD_SCREENSHOTS")
                   or Path(tempfile.gettempdir()) / "dashboard-screenshots")


def chromium_path() -> str:
    """The Chromium Playwright launches: ``CHROMIUM_PATH``, else ``chromium`` on PATH."""
    configured = os.environ.get("CHROMIUM_PATH")
    found = configured or shutil.which("chromium")
    if not found or not os.access(found, os.X_OK):
        pytest.fail(f"Chromium is not installed ({configured or 'no chromium on PATH'}): "
                    "`make setup` installs Debian's (apt-get install chromium), or set "
                    "CHROMIUM_PATH=/path/to/chromium. Playwright's own browsers are not used.",
                    pytrace=False)
    return found


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """Chromium for the tests of this package. Not for the whole session: while Playwright's
    sync API is started, the main thread has a running asyncio loop (its own, in a greenlet),
    and a later test calling ``asyncio.run`` would fail (tests/operations/dashboard does)."""
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page at 1280x800 (UTC, English, light), actions waiting at most 15 s."""
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1, locale="en-GB",
                                  timezone_id="UTC", color_scheme="light")
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def screenshot() -> Callable[[Page, str], Path]:
    """``screenshot(page, "poisoned")`` saves the viewport as dashboard-poisoned.png."""
    def take(page: Page, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"dashboard-{name}.png"
        page.screenshot(path=str(path), animations="disabled", caret="hide")
        return path
    return take


# -- the stack: Azurite, the shop's bus with traffic, the dashboard ------------------------------
@pytest.fixture(scope="module")
def shop(azurite_connection: str) -> Shop:
    """One shop with traffic for the read-only tests (they change nothing)."""
    return with_traffic(build(AzureStorage.from_connection_string(azurite_connection),
                              "b" + os.urandom(5).hex()))


@pytest.fixture
def fresh_shop(azurite_connection: str) -> Shop:
    """A shop of its own with the same traffic, for a test that acts on it."""
    return with_traffic(build(AzureStorage.from_connection_string(azurite_connection),
                              "b" + os.urandom(5).hex()))


class Server:
    """An ASGI app served by uvicorn on a free loopback port in a background thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]}, daemon=True,
                                        name="dashboard")

    def start(self) -> Server:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start (see the log above)")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()


def _serve(shop: Shop, *, allow_actions: bool) -> Iterator[Server]:
    from bus.operations.dashboard import create_app

    server = Server(create_app(shop.bus, allow_actions=allow_actions)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def readonly(shop: Shop) -> Iterator[Server]:
    """The dashboard over ``shop``, read-only (as ``python -m bus dashboard`` without
    ``--allow-actions``)."""
    yield from _serve(shop, allow_actions=False)


@pytest.fixture
def actions(fresh_shop: Shop) -> Iterator[Server]:
    """The dashboard over ``fresh_shop`` with actions allowed (``--allow-actions``)."""
    yield from _serve(fresh_shop, allow_actions=True)
