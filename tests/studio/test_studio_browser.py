"""The Studio in a real browser: Playwright drives Debian's Chromium (headless) against the app
served by a real uvicorn on a free local port, over an SQLite store filled by running the
analyst team. One browser for the module; each test gets a fresh page."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests._browser import CHROMIUM, chromium, open_page

if not CHROMIUM.exists():
    pytest.skip("needs Debian's chromium at /usr/bin/chromium", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("fastapi")

from tapekit.store import SQLiteStore  # noqa: E402
from tapekit.studio import create_app  # noqa: E402
from tapekit.studio.app import serve_in_thread  # noqa: E402
from tests.studio.test_studio import XSS_IMG, XSS_SCRIPT, fill, team  # noqa: E402


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SQLiteStore, dict[str, Any]]]:
    with SQLiteStore(tmp_path_factory.mktemp("browser") / "studio.db", flush_interval_s=0.005) as store:
        ids = fill(store)
        with serve_in_thread(create_app(store, agents={"analyst": team})) as url:
            yield url, store, ids


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    yield from open_page(browser, width=1400, timeout_ms=10_000)


def test_open_a_tape_by_url_and_reload_it(page: Any, studio: tuple[str, SQLiteStore, dict[str, Any]]) -> None:
    url, _, ids = studio
    page.goto(f"{url}/tapes/{ids['vulcan']}")
    rows = page.locator("a.step-row")
    assert rows.count() == 19
    assert "cat-observation" in (rows.nth(0).get_attribute("class") or "")
    assert "cat-thought" in (rows.nth(1).get_attribute("class") or "")
    assert rows.nth(10).locator(".author").inner_text() == "analyst/search_agent.search"
    page.reload()
    assert page.locator("a.step-row").count() == 19
    assert page.locator("h1 .full-id").inner_text() == ids["vulcan"]


def test_click_a_step_to_see_its_prompt(page: Any, studio: tuple[str, SQLiteStore, dict[str, Any]]) -> None:
    url, _, ids = studio
    page.goto(f"{url}/tapes/{ids['vulcan']}")
    page.locator("#step-1").click()
    panel = page.locator("#panel")
    sync_api.expect(panel.locator(".prompt-text").first).to_contain_text(
        "You help the user learn about the financials"
    )
    sync_api.expect(panel).to_contain_text("Write a numbered plan")
    sync_api.expect(panel).to_contain_text("prompt tokens")
    assert page.url.endswith(f"/tapes/{ids['vulcan']}/steps/1")
    assert "selected" in (page.locator("#step-1").get_attribute("class") or "")
    page.locator("#step-10").click()  # the helper's search: its own prompt, two views on the stack
    sync_api.expect(panel).to_contain_text("Use at most 4 tool calls")
    sync_api.expect(panel.locator("li.view")).to_have_count(2)
    page.reload()  # the step URL opens directly
    sync_api.expect(page.locator("#panel")).to_contain_text("Use at most 4 tool calls")
    page.go_back()
    sync_api.expect(page.locator("#panel")).to_contain_text("Write a numbered plan")


def test_diff_highlights_the_first_divergence(
    page: Any, studio: tuple[str, SQLiteStore, dict[str, Any]]
) -> None:
    url, _, ids = studio
    page.goto(f"{url}/diff?a={ids['vulcan']}&b={ids['vulcan_b']}")
    row = page.locator("#first-divergence")
    sync_api.expect(row).to_have_class("divergence")
    assert row.locator("td.idx").inner_text() == "1"
    background = row.locator("td").first.evaluate("el => getComputedStyle(el).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")  # visibly highlighted
    sync_api.expect(row).to_be_in_viewport()
    sync_api.expect(row).to_contain_text("Look the company up")
    # from the list: tick two tapes and compare them
    page.goto(f"{url}/tapes?tag=baseline")
    page.locator(f'input[value="{ids["vulcan"]}"]').check()
    page.locator(f'input[value="{ids["acme"]}"]').check()
    page.get_by_role("button", name="Compare the two ticked").click()
    sync_api.expect(page.locator("#first-divergence td.idx")).to_have_text("0")


def test_edit_a_step_and_resume(page: Any, studio: tuple[str, SQLiteStore, dict[str, Any]]) -> None:
    url, store, ids = studio
    page.goto(f"{url}/tapes/{ids['vulcan']}/steps/1")
    edited = {"kind": "assistant_thought", "content": "1. Get the ticker. 2. Answer in one sentence."}
    page.locator("form.edit-form textarea").fill(json.dumps(edited))
    page.get_by_role("button", name="Save edit as a new tape").click()
    page.wait_for_url(re.compile(r"/tapes/[0-9a-f]{32}\?page=1#step-1$"))
    child = re.search(r"/tapes/([0-9a-f]{32})", page.url).group(1)  # type: ignore[union-attr]
    assert child != ids["vulcan"]
    sync_api.expect(page.locator("a.parent-link")).to_have_attribute("href", f"/tapes/{ids['vulcan']}")
    sync_api.expect(page.locator("a.step-row")).to_have_count(2)
    page.get_by_role("button", name="Run", exact=True).click()  # resume until the agent answers
    page.wait_for_url(lambda u: child not in u and "/tapes/" in u)
    sync_api.expect(page.locator("a.parent-link")).to_have_attribute("href", f"/tapes/{child}")
    rows = page.locator("a.step-row")
    sync_api.expect(rows).to_have_count(19)
    sync_api.expect(rows.nth(1)).to_contain_text("Get the ticker")
    sync_api.expect(rows.nth(18).locator(".kind")).to_have_text("assistant")
    assert store.get_tape_info(ids["vulcan"]).n_steps == 19  # the original is untouched
    # an invalid edit shows the reason
    page.goto(f"{url}/tapes/{child}/steps/1")
    page.locator("form.edit-form textarea").fill('{"kind": "assistant_thought", "content": ')
    page.get_by_role("button", name="Save edit as a new tape").click()
    sync_api.expect(page.locator(".error-page")).to_contain_text("invalid JSON at line 1")


def test_an_xss_attempt_does_not_run(page: Any, studio: tuple[str, SQLiteStore, dict[str, Any]]) -> None:
    url, _, ids = studio

    def assert_nothing_ran() -> None:
        page.wait_for_timeout(150)  # give an injected image's onerror time to fire
        assert page.evaluate("window.__xss") is None
        assert page.locator("main img").count() == 0

    page.goto(f"{url}/tapes/{ids['xss']}")
    sync_api.expect(page.locator("#step-0 .summary")).to_have_text(XSS_SCRIPT)
    sync_api.expect(page.locator("#step-1 .summary")).to_have_text(XSS_IMG)
    sync_api.expect(page.locator(".error-banner")).to_contain_text(XSS_SCRIPT)
    assert_nothing_ran()
    page.locator("#step-1").click()  # the panel is loaded by script: still only text
    sync_api.expect(page.locator("#panel textarea")).to_have_value(
        json.dumps({"kind": "user", "content": XSS_IMG}, indent=2)
    )
    assert_nothing_ran()
    page.goto(f"{url}/tapes/{ids['xss']}/steps/0")
    sync_api.expect(page.locator("#panel textarea")).to_have_value(
        json.dumps({"kind": "user", "content": XSS_SCRIPT}, indent=2)
    )
    assert_nothing_ran()
    page.goto(f"{url}/tapes?error=yes")
    sync_api.expect(page.locator("table.tapes")).to_contain_text("<b>xss</b>")
    sync_api.expect(page.locator("table.tapes")).to_contain_text(XSS_IMG)
    assert_nothing_ran()
