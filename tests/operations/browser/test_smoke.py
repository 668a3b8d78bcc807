"""Playwright drives Debian's Chromium (no browser of its own): launch, a page with a dialog,
a screenshot of the size asked for. No Azurite and no dashboard needed."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, Dialog, Page

from tests.operations.browser.conftest import VIEWPORT, chromium_path


def test_playwright_drives_the_system_chromium(browser: Browser, page: Page,
                                               tmp_path: Path) -> None:
    assert not chromium_path().startswith(str(Path.home() / ".cache" / "ms-playwright"))
    assert int(browser.version.split(".")[0]) >= 150  # Debian's, not Playwright's build
    page.set_content("<h1>eobus</h1><button id=go>Replay 3 messages</button><p id=out></p>"
                     "<script>go.onclick = () => out.textContent = "
                     "confirm('Replay 3 messages?') ? 'replayed' : 'kept'</script>")
    messages: list[str] = []

    def accept(dialog: Dialog) -> None:
        messages.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.click("#go")
    assert page.inner_text("#out") == "replayed" and messages == ["Replay 3 messages?"]
    shot = tmp_path / "smoke.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = (int.from_bytes(shot.read_bytes()[16 + 4 * i:20 + 4 * i], "big")
                     for i in range(2))
    assert (width, height) == (VIEWPORT["width"], VIEWPORT["height"])
