"""A web tape's screenshots in the Studio, in a real browser: a real ``WebEnvironment(screenshots=True)``
episode on a local page is stored, the Studio serves it on a real uvicorn, and Playwright drives
Debian's Chromium (headless) to check that the step panel's image actually loads, under the
Studio's Content-Security-Policy, both on a step's own URL and when the panel is loaded by
clicking a step. (This module is in the ``browser`` tier: see TIERS in tests/conftest.py.)"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from tests._browser import CHROMIUM, chromium, open_page

if not CHROMIUM.exists():
    pytest.skip("needs Debian's chromium at /usr/bin/chromium", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("fastapi")

from tapekit import Tape  # noqa: E402
from tapekit.store import SQLiteStore  # noqa: E402
from tapekit.studio import create_app  # noqa: E402
from tapekit.studio.app import serve_in_thread  # noqa: E402
from tapekit.web import Click, OpenTask, PageTask, WebEnvironment, WebObservation, parse_axtree  # noqa: E402

pytestmark = pytest.mark.browser

PAGE = """<!DOCTYPE html><html><head><title>Screenshot page</title>
<style>body { background: #2a6; margin: 0; } button { font-size: 40px; margin: 40px; }</style></head>
<body><h1>Hello</h1>
<button onclick="document.body.style.background='#c33'">Paint it red</button></body></html>"""


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png[16:24])
    return width, height


@pytest.fixture(scope="module")
def web_tape(tmp_path_factory: pytest.TempPathFactory) -> Tape[Any, Any]:
    """A real episode with screenshots: open the page, click its button (steps 0-3)."""
    page = tmp_path_factory.mktemp("page") / "page.html"
    page.write_text(PAGE)
    task = PageTask("paint", page.as_uri(), goal="Paint the page red")
    env = WebEnvironment([task], max_concurrent=1, screenshots=True, timeout_s=20)
    try:
        tape = env.react(Tape(steps=[OpenTask(task="paint", seed=0)]))
        first = tape.steps[-1]
        assert isinstance(first, WebObservation), first
        button = next(n for n in parse_axtree(first.axtree) if n.role == "button")
        tape = env.react(tape.append(Click(bid=button.bid)))
    finally:
        env.close()
    shots = [s.screenshot for s in tape.steps if isinstance(s, WebObservation)]
    assert len(shots) == 2 and all(shots) and shots[0] != shots[1], tape.steps[-1]
    return tape


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory, web_tape: Tape[Any, Any]) -> Iterator[tuple[str, str]]:
    with SQLiteStore(tmp_path_factory.mktemp("browser_web") / "web.db", flush_interval_s=0.005) as store:
        tape_id = store.save_tape(web_tape)
        store.flush()
        with serve_in_thread(create_app(store)) as url:
            yield url, tape_id


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    yield from open_page(browser, width=1400, timeout_ms=10_000)


def loaded_width(img: Any) -> int:
    """The image's natural width once the browser has finished loading it (0: it failed)."""
    img.scroll_into_view_if_needed()  # the image is loading="lazy"
    return int(img.evaluate("el => el.decode().then(() => el.naturalWidth, () => 0)"))


def test_the_screenshot_loads_in_the_step_panel(
    page: Any, studio: tuple[str, str], web_tape: Tape[Any, Any]
) -> None:
    url, tape_id = studio
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url))
    shots = [
        (i, base64.b64decode(s.screenshot))
        for i, s in enumerate(web_tape.steps)
        if isinstance(s, WebObservation) and s.screenshot
    ]
    (first, first_png), (second, second_png) = shots
    page.goto(f"{url}/tapes/{tape_id}/steps/{first}")  # the step's own URL
    img = page.locator("#panel img.attachment[data-name=screenshot]")
    sync_api.expect(img).to_have_count(1)
    assert img.get_attribute("src") == f"/tapes/{tape_id}/steps/{first}/screenshot.png"
    assert loaded_width(img) == png_size(first_png)[0] > 0
    assert img.evaluate("el => el.naturalHeight") == png_size(first_png)[1]
    sync_api.expect(page.locator("#panel textarea")).to_contain_text("<screenshot: ")
    assert "iVBORw0KGgo" not in page.content()  # the base64 of a PNG's signature: never printed
    # the panel loaded in place by clicking another step
    page.locator(f"#step-{second}").click()
    sync_api.expect(page.locator("#panel .step-detail")).to_have_attribute("data-index", str(second))
    img = page.locator("#panel img.attachment[data-name=screenshot]")
    sync_api.expect(img).to_have_attribute("src", f"/tapes/{tape_id}/steps/{second}/screenshot.png")
    assert loaded_width(img) == png_size(second_png)[0] > 0
    # an action has no image
    page.locator("#step-0").click()
    sync_api.expect(page.locator("#panel .step-detail")).to_have_attribute("data-index", "0")
    sync_api.expect(page.locator("#panel img")).to_have_count(0)
    assert refused == [] and failed == []


def test_the_png_route_is_an_image_to_the_browser(page: Any, studio: tuple[str, str]) -> None:
    url, tape_id = studio
    response = page.goto(f"{url}/tapes/{tape_id}/steps/1/screenshot.png")
    assert response.status == 200 and response.headers["content-type"] == "image/png"
    assert page.locator("img").evaluate("el => el.naturalWidth") > 0  # Chromium shows it as an image
    missing = page.goto(f"{url}/tapes/{tape_id}/steps/0/screenshot.png")
    assert missing.status == 404
    sync_api.expect(page.locator(".error-page")).to_contain_text("no screenshot")
