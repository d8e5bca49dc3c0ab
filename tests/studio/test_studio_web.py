"""The Studio on web tapes (tapekit.web's observations), through the observation's presentation
(``WebObservation.present``; the Studio itself knows no web step): a screenshot is served as PNG
bytes on its own URL and shown as an image in the step's panel, never dumped as base64 text; the
page, the goal, the accessibility tree and the action's error read as fields. TestClient over an
SQLite store, with a small PNG made here (tests/studio/test_studio_browser_web.py takes real
screenshots)."""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from tapekit import Tape, UserStep
from tapekit.store import SQLiteStore
from tapekit.studio import create_app
from tapekit.studio.data import UnknownStep, attachment_bytes
from tapekit.web import Click, OpenTask, WebObservation

AXTREE = '[1] RootWebArea "Form"\n  [4] textbox "Name"\n  [7] button "Submit"'


def make_png(width: int = 5, height: int = 3) -> bytes:
    """A real (tiny, red) RGB PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([220, 40, 40]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG = make_png()
B64 = base64.b64encode(PNG).decode("ascii")


def observation(**fields: Any) -> WebObservation:
    base: dict[str, Any] = {"task": "form", "seed": 3, "episode_id": "ep-1", "goal": "Type <Ana> and submit"}
    return WebObservation(**{**base, **fields})


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, SQLiteStore, dict[str, str]]]:
    """A store with a web tape (steps: 0 open, 1 observation with a screenshot, 2 click,
    3 observation with an error and no screenshot, 4 observation whose screenshot is not base64,
    5 observation whose screenshot is base64 of something else) and a tape whose web observation
    does not validate (shown generically, its screenshot still served)."""
    with SQLiteStore(tmp_path_factory.mktemp("studio_web") / "web.db", flush_interval_s=0.005) as store:
        tape = Tape(
            steps=[
                OpenTask(task="form", seed=3),
                observation(axtree=AXTREE, url="file:///form.html", title="Form", screenshot=B64),
                Click(bid="7"),
                observation(step=1, url="file:///form.html", last_action_error="element 7 is hidden"),
                observation(step=2, screenshot="not base64 at all!"),
                observation(step=3, screenshot=base64.b64encode(b"GIF89a not a png").decode()),
            ]
        )
        ids = {"web": store.save_tape(tape)}
        odd = UnknownStep(kind="web_observation", goal="old format", screenshot=B64)  # no task: invalid
        ids["odd"] = store.save_tape(Tape(steps=[UserStep(content="hi"), odd]))
        store.flush()
        with TestClient(create_app(store), raise_server_exceptions=False) as client:
            client.get("/tapes")  # the CSRF cookie
            yield client, store, ids


def textarea(html: str) -> str:
    found = re.search(
        r'<textarea name="step" rows="\d+" spellcheck="false" aria-label="step JSON">(.*?)</textarea>',
        html,
        re.S,
    )
    assert found, html[:500]
    return found.group(1)


def test_the_screenshot_is_served_as_png_bytes(web: tuple[TestClient, SQLiteStore, dict[str, str]]) -> None:
    client, _, ids = web
    response = client.get(f"/tapes/{ids['web']}/steps/1/screenshot.png")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/png"
    assert response.content == PNG
    assert "img-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"
    # a web observation whose class does not validate any more still has its screenshot
    assert client.get(f"/tapes/{ids['odd']}/steps/1/screenshot.png").content == PNG


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("web/steps/0", "no screenshot"),  # an action
        ("web/steps/3", "no screenshot"),  # an observation without one
        ("web/steps/4", "no screenshot"),  # not base64
        ("web/steps/5", "no screenshot"),  # base64, not a PNG
        ("web/steps/6", "no step 6"),
        ("odd/steps/0", "no screenshot"),
        ("nowhere/steps/1", "no tape"),
    ],
)
def test_no_screenshot_is_a_404_page(
    web: tuple[TestClient, SQLiteStore, dict[str, str]], path: str, why: str
) -> None:
    client, _, ids = web
    tape, _, rest = path.partition("/")
    response = client.get(f"/tapes/{ids.get(tape, tape)}/{rest}/screenshot.png")
    assert response.status_code == 404, response.text[:300]
    assert response.headers["content-type"].startswith("text/html")
    assert why in response.text.lower() and "Traceback" not in response.text
    assert client.get(f"/tapes/{ids['web']}/steps/x/screenshot.png").status_code == 400


def test_the_step_panel_shows_the_image_and_the_fields(
    web: tuple[TestClient, SQLiteStore, dict[str, str]],
) -> None:
    client, _, ids = web
    src = f"/tapes/{ids['web']}/steps/1/screenshot.png"
    for url in (f"/tapes/{ids['web']}/steps/1", f"/tapes/{ids['web']}/steps/1?fragment=1"):
        html = client.get(url).text
        assert f'<img class="attachment" data-name="screenshot" src="{src}"' in html
        assert B64 not in html and B64[:60] not in html
        step_json = json.loads(textarea(html).replace("&#34;", '"').replace("&lt;", "<").replace("&gt;", ">"))
        assert step_json["screenshot"] == f"<screenshot: {len(PNG)} B PNG>"
        assert step_json["goal"] == "Type <Ana> and submit" and step_json["axtree"] == AXTREE
        assert '<dd data-field="url">file:///form.html</dd>' in html
        assert "Type &lt;Ana&gt; and submit" in html  # the goal, escaped
        axtree = re.search(
            r'<pre class="prompt-text field-text" data-field="accessibility tree">(.*?)</pre>', html, re.S
        )
        assert axtree and axtree.group(1) == AXTREE.replace('"', "&#34;")
    error = client.get(f"/tapes/{ids['web']}/steps/3").text
    assert '<p class="error-banner step-error">last action failed: element 7 is hidden</p>' in error
    assert "<img" not in error
    broken = client.get(f"/tapes/{ids['web']}/steps/4").text
    assert "<img" not in broken and "not a base64 PNG" in broken and "screenshot: not a valid PNG" in broken
    odd = client.get(f"/tapes/{ids['odd']}/steps/1").text
    assert f'src="/tapes/{ids["odd"]}/steps/1/screenshot.png"' in odd and B64 not in odd


def test_the_tape_page_marks_screenshots_and_never_prints_them(
    web: tuple[TestClient, SQLiteStore, dict[str, str]],
) -> None:
    client, _, ids = web
    html = client.get(f"/tapes/{ids['web']}").text
    assert B64[:60] not in html
    marked = [
        int(i) for i in re.findall(r'id="step-(\d+)" href="[^"]+">(?:(?!</a>).)*class="attached"', html, re.S)
    ]
    assert marked == [1]
    row = re.search(r'id="step-3".*?<span class="summary">(.*?)</span>', html, re.S)
    assert row and row.group(1) == (
        "step 1: file:///form.html · error: element 7 is hidden · goal: Type &lt;Ana&gt; and submit"
    )
    odd = client.get(f"/tapes/{ids['odd']}").text
    assert B64[:60] not in odd and "&lt;screenshot: " in odd


def test_an_edit_keeps_the_screenshot_unless_changed(
    web: tuple[TestClient, SQLiteStore, dict[str, str]],
) -> None:
    client, store, ids = web
    csrf = client.cookies["tapekit_studio_csrf"]
    shown = json.loads(
        textarea(client.get(f"/tapes/{ids['web']}/steps/1").text)
        .replace("&#34;", '"')
        .replace("&lt;", "<")
        .replace("&gt;", ">")
    )

    def edit(**changes: Any) -> WebObservation:
        response = client.post(
            f"/tapes/{ids['web']}/steps/1/edit",
            data={"csrf": csrf, "step": json.dumps({**shown, **changes})},
            follow_redirects=False,
        )
        assert response.status_code == 303, response.text[:500]
        child = re.match(r"/tapes/([0-9a-f]+)", response.headers["location"])
        assert child
        step = store.get_tape(child.group(1)).steps[1]
        assert isinstance(step, WebObservation)
        return step

    kept = edit(goal="Type Bo and submit")
    assert kept.goal == "Type Bo and submit" and kept.screenshot == B64
    assert edit(screenshot=None).screenshot is None


def screenshot_png(step: Any) -> bytes | None:
    """The bytes the Studio serves for the step's screenshot (None: it serves none)."""
    found = step.present().attachments.get("screenshot")
    return None if found is None else attachment_bytes(found)


def test_the_screenshot_attachment_checks_the_data() -> None:
    assert screenshot_png(observation(screenshot=B64)) == PNG
    assert screenshot_png(observation()) is None
    assert screenshot_png(observation(screenshot="")) is None
    assert screenshot_png(observation(screenshot=B64[:-4] + "!!!!")) is None
    assert screenshot_png(observation(screenshot=base64.b64encode(b"<svg/>").decode())) is None
    assert screenshot_png(UserStep(content=B64)) is None  # only web observations have screenshots
    shown = observation(screenshot=B64).present()
    assert shown.attachments["screenshot"].media_type == "image/png"
    assert shown.notes == {"screenshot": f"<screenshot: {len(PNG)} B PNG>"}
