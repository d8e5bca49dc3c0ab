"""Headless Debian Chromium for the Studio's browser tests (Playwright never downloads one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> Iterator[Any]:
    """Yield a launched headless Chromium (for a module-scoped fixture); closed afterwards."""
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


def open_page(browser: Any, width: int, timeout_ms: int) -> Iterator[Any]:
    """Yield a page in a fresh browser context ``width`` pixels wide; the context is closed afterwards."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(timeout_ms)
    yield page
    context.close()
