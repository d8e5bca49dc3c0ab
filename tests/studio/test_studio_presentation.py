"""Steps present themselves (``Step.present``): a step class of this module, unknown to the
Studio, shows its own panel fields, error and attachments there and in the plain-text renderer
without any Studio change; the Studio serves attachments by a generic route with its safety
checks, and ``tapekit/studio`` names no step kind (no web code). Stored kinds whose module is
registered (``tapekit.core.register_step_module``; ``tapekit.web`` is) load on demand."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from tapekit import Call, Observation, Respond, Tape, Thought, UserStep
from tapekit.core import (
    Attachment,
    Step,
    StepPresentation,
    find_step_class,
    media_type_matches,
    register_step_module,
)
from tapekit.rendering import render_step, render_tape, step_summary

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from tapekit.store import SQLiteStore
from tapekit.studio import create_app

ROOT = Path(__file__).resolve().parents[2]


def make_png(width: int = 4, height: int = 2) -> bytes:
    """A real (tiny, blue) RGB PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([30, 60, 200]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG = make_png()


class Measurement(Observation):
    """A step class the Studio has never heard of, with a presentation of its own."""

    kind: Literal["test_presentation_measurement"] = "test_presentation_measurement"
    sensor: str
    values: list[float]
    log: str = ""
    plot_hex: str = ""  # a PNG, hex-encoded: bulky, so its JSON shows a note
    fault: str = ""

    def present(self) -> StepPresentation:
        """Its gist, its fields, a fault banner, a plot image and a CSV file."""
        plot = Attachment("image/png", lambda: bytes.fromhex(self.plot_hex))
        return StepPresentation(
            summary=f"{self.sensor}: {len(self.values)} values, mean {sum(self.values) / len(self.values):g}",
            title="Measurement",
            fields={"sensor": self.sensor, "count": len(self.values), "log": self.log, "values": self.values},
            attachments={
                "plot": plot,
                "data": Attachment("text/csv", ",".join(map(str, self.values)).encode()),
            },
            notes={"plot_hex": f"<plot: {plot.describe()}>"},
            error=f"sensor fault: {self.fault}" if self.fault else "",
        )


class Broken(Thought):
    """A step whose own presentation fails: tools fall back to the default one."""

    kind: Literal["test_presentation_broken"] = "test_presentation_broken"
    text: str

    def present(self) -> StepPresentation:
        """Always fails."""
        raise RuntimeError("no presentation today")


LOG = "\n".join(f"reading {i}: ok" for i in range(5))


def measurement(**changes: Any) -> Measurement:
    fields: dict[str, Any] = {
        "sensor": "<probe-7>",
        "values": [1.0, 2.0, 4.5],
        "log": LOG,
        "plot_hex": PNG.hex(),
    }
    return Measurement(**{**fields, **changes})


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, SQLiteStore, str]]:
    """A tape: 0 a user step, 1 a measurement with a plot, 2 one with a fault and a plot that is
    not a PNG, 3 a step whose present() raises."""
    with SQLiteStore(tmp_path_factory.mktemp("presentation") / "p.db", flush_interval_s=0.005) as store:
        tape = Tape(
            steps=[
                UserStep(content="measure"),
                measurement(),
                measurement(fault="overheated", plot_hex=b"GIF89a not a png".hex()),
                Broken(text="still shown"),
            ]
        )
        tape_id = store.save_tape(tape)
        store.flush()
        with TestClient(create_app(store), raise_server_exceptions=False) as client:
            client.get("/tapes")  # the CSRF cookie
            yield client, store, tape_id


def unescape(text: str) -> str:
    return (
        text.replace("&#34;", '"')
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
    )


def test_a_custom_step_shows_its_fields_and_attachments_in_the_studio(
    studio: tuple[TestClient, SQLiteStore, str],
) -> None:
    client, _, tape_id = studio
    html = client.get(f"/tapes/{tape_id}/steps/1").text
    assert '<section class="presentation">' in html and "<h3>Measurement</h3>" in html
    assert '<dd data-field="sensor">&lt;probe-7&gt;</dd>' in html  # escaped
    assert '<dd data-field="count">3</dd>' in html
    log = re.search(r'<pre class="prompt-text field-text" data-field="log">(.*?)</pre>', html, re.S)
    assert log and log.group(1) == LOG  # a multi-line text is a block
    values = re.search(r'<pre class="json" data-field="values">(.*?)</pre>', html, re.S)
    assert values and json.loads(values.group(1)) == [1.0, 2.0, 4.5]  # a list is JSON
    src = f"/tapes/{tape_id}/steps/1/plot.png"
    assert f'<img class="attachment" data-name="plot" src="{src}"' in html
    assert f'href="/tapes/{tape_id}/steps/1/data.bin"' in html  # not an image: a link
    # the JSON box shows the note, not the hex
    step_json = re.search(r'aria-label="step JSON">(.*?)</textarea>', html, re.S)
    assert step_json and json.loads(unescape(step_json.group(1)))["plot_hex"] == f"<plot: {len(PNG)} B PNG>"
    assert PNG.hex() not in html
    # the step list: the gist and the attachments that can be served
    page = client.get(f"/tapes/{tape_id}").text
    row = re.search(r'id="step-1".*?<span class="summary">(.*?)</span>(.*?)</a>', page, re.S)
    assert row and row.group(1) == "&lt;probe-7&gt;: 3 values, mean 2.5"
    assert re.findall(r'class="attached"[^>]*>(\w+)<', row.group(2)) == ["plot", "data"]
    faulty = client.get(f"/tapes/{tape_id}/steps/2").text
    assert '<p class="error-banner step-error">sensor fault: overheated</p>' in faulty
    assert "<img" not in faulty and "plot: not a valid PNG" in faulty


def test_attachments_are_served_with_the_safety_checks(studio: tuple[TestClient, SQLiteStore, str]) -> None:
    client, _, tape_id = studio
    plot = client.get(f"/tapes/{tape_id}/steps/1/plot.png")
    assert plot.status_code == 200 and plot.content == PNG
    assert plot.headers["content-type"] == "image/png" and plot.headers["x-content-type-options"] == "nosniff"
    data = client.get(f"/tapes/{tape_id}/steps/1/data.bin")  # text/csv is not served as itself
    assert data.status_code == 200 and data.content == b"1.0,2.0,4.5"
    assert data.headers["content-type"] == "application/octet-stream"
    assert data.headers["content-disposition"] == 'attachment; filename="data.bin"'
    for path, why in [
        ("steps/1/plot.jpg", "no plot"),  # not its media type's extension
        ("steps/1/nothing.png", "no nothing"),
        ("steps/2/plot.png", "no plot"),  # GIF bytes called a PNG
        ("steps/0/plot.png", "no plot"),
        ("steps/9/plot.png", "no step 9"),
    ]:
        response = client.get(f"/tapes/{tape_id}/{path}")
        assert response.status_code == 404 and why in response.text.lower(), (path, response.text[:300])
    # a GET of a form's URL is still not an attachment
    assert client.get(f"/tapes/{tape_id}/steps/1/edit").status_code == 405


def test_an_edit_that_keeps_a_note_keeps_the_value(studio: tuple[TestClient, SQLiteStore, str]) -> None:
    client, store, tape_id = studio
    html = client.get(f"/tapes/{tape_id}/steps/1").text
    assert "The JSON shows <code>plot_hex</code> as <code>&lt;plot: " in html
    step_json = re.search(r'aria-label="step JSON">(.*?)</textarea>', html, re.S)
    assert step_json
    shown = json.loads(unescape(step_json.group(1)))
    response = client.post(
        f"/tapes/{tape_id}/steps/1/edit",
        data={
            "csrf": client.cookies["tapekit_studio_csrf"],
            "step": json.dumps({**shown, "sensor": "probe-8"}),
        },
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text[:300]
    child = re.match(r"/tapes/([0-9a-f]+)", response.headers["location"])
    assert child
    edited = store.get_tape(child.group(1)).steps[1]
    assert isinstance(edited, Measurement) and edited.sensor == "probe-8" and edited.plot_hex == PNG.hex()


def test_a_failing_presentation_falls_back_to_the_default(
    studio: tuple[TestClient, SQLiteStore, str],
) -> None:
    client, _, tape_id = studio
    page = client.get(f"/tapes/{tape_id}/steps/3")
    assert page.status_code == 200 and "still shown" in page.text
    assert step_summary(Broken(text="still shown")) == "still shown"


def test_the_renderer_prints_the_same_gist() -> None:
    assert step_summary(measurement()) == "<probe-7>: 3 values, mean 2.5"
    assert render_step(measurement()).endswith(" <probe-7>: 3 values, mean 2.5")
    assert step_summary(Call(agent_name="helper", content="look  it\nup")) == "calls helper: look it up"
    assert step_summary(Respond(content="x" * 300), width=10) == "responds:…"
    assert step_summary(UserStep(content="hi")) == "hi"  # one field: its value
    lines = render_tape(Tape(steps=[UserStep(content="q"), measurement()])).splitlines()
    assert lines[1].startswith("[  1] environment") and "mean 2.5" in lines[1]


def test_the_default_presentation() -> None:
    shown = Step.present(measurement(plot_hex="", log=""))
    assert json.loads(shown.summary) == {
        "sensor": "<probe-7>",
        "values": [1.0, 2.0, 4.5],
        "log": "",
        "plot_hex": "",
        "fault": "",
    }
    assert (shown.title, dict(shown.fields), dict(shown.attachments), dict(shown.notes), shown.error) == (
        "",
        {},
        {},
        {},
        "",
    )


def test_attachments_decode_lazily_and_check_their_media_type() -> None:
    calls: list[int] = []

    def load() -> bytes:
        calls.append(1)
        return PNG

    lazy = Attachment("image/png", load)
    assert calls == []
    assert lazy.data() == PNG and lazy.data() == PNG and calls == [1]  # made once, kept
    assert lazy.describe() == f"{len(PNG)} B PNG" and lazy.extension == "png"
    assert Attachment("image/png", b"GIF89a...").data() is None
    assert Attachment("image/png", PNG, max_bytes=10).data() is None
    assert Attachment.from_base64("image/png", "not base64!").data() is None
    assert Attachment("image/jpeg", b"\xff\xd8\xff\xe0rest").describe() == "8 B JPG"
    assert Attachment("application/x-thing", b"x").extension == "bin"
    assert media_type_matches(b"RIFF\0\0\0\0WEBPVP8 ", "image/webp")
    assert not media_type_matches(b"<svg/>", "image/gif")


def test_the_studio_names_no_step_kind() -> None:
    """The Studio's code, templates, styles and script know no step kind (nor web pages):
    what a step shows comes from its presentation."""
    banned = re.compile(r"screenshot|web_observation|WebObservation|tapekit\.web|axtree|web_\w+", re.I)
    found = []
    for path in sorted((ROOT / "tapekit" / "studio").rglob("*")):
        if path.is_file() and path.suffix in {".py", ".html", ".css", ".js"}:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if banned.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_a_registered_module_loads_on_demand(tmp_path: Path) -> None:
    """A kind registered with register_step_module is found by importing its module then; the
    Studio, started without importing it, shows such stored steps with their real class."""
    (tmp_path / "sensors_for_test.py").write_text(
        "from typing import Literal\nfrom tapekit import Observation\n"
        "class Gauge(Observation):\n"
        "    kind: Literal['sensors_test_gauge'] = 'sensors_test_gauge'\n    level: int\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        assert find_step_class("sensors_test_gauge") is None
        register_step_module("sensors_test_", "sensors_for_test")
        assert "sensors_for_test" not in sys.modules
        cls = find_step_class("sensors_test_gauge")
        assert cls is not None and cls.__module__ == "sensors_for_test"
        register_step_module("missing_test_", "no_such_module_for_tapekit")
        assert find_step_class("missing_test_kind") is None  # an import error: not found
    finally:
        sys.path.remove(str(tmp_path))


def test_the_studio_loads_web_steps_it_was_not_told_to_import(tmp_path: Path) -> None:
    """A fresh process that never imported tapekit.web opens a stored web tape: its steps are
    loaded with their classes (tapekit.core registers the module of the ``web_`` kinds)."""
    db = tmp_path / "web.db"
    maker = (
        "from tapekit import Tape; from tapekit.store import SQLiteStore;"
        "from tapekit.web import OpenTask, WebObservation;"
        "o = WebObservation(task='t', seed=1, episode_id='e', goal='Click it', url='file:///p.html', step=1);"
        f"s = SQLiteStore({str(db)!r});"
        "s.save_tape(Tape(steps=[OpenTask(task='t', seed=1), o]).with_metadata(id='w')); s.close()"
    )
    subprocess.run([sys.executable, "-c", maker], check=True, cwd=ROOT)
    reader = (
        "import sys; from fastapi.testclient import TestClient; from tapekit.store import SQLiteStore;"
        "from tapekit.studio import create_app;"
        "assert 'tapekit.web' not in sys.modules;"
        f"s = SQLiteStore({str(db)!r}); c = TestClient(create_app(s));"
        "page = c.get('/tapes/w').text; s.close();"
        "print('cat-unknown' in page, 'step 1: file:///p.html · goal: Click it' in page,"
        " 'tapekit.web' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", reader], check=True, cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "True", "True"], out.stderr[-2000:]
