"""The Studio over HTTP: pages, filters, step details, diffs, edits and runs as child tapes,
errors, CSRF, the access token and escaping. Most tests use FastAPI's TestClient on a real
SQLite store filled by really running the analyst team; one starts ``tapekit studio`` as a
real uvicorn server."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from tapekit import Agent, Environment, LLMOutput, Prompt, Tape, UserStep, main_loop  # noqa: E402
from tapekit._diff import signatures  # noqa: E402
from tapekit.store import SQLiteStore, TapeStore  # noqa: E402
from tapekit.studio import create_app  # noqa: E402
from tapekit.studio.runs import load_agents  # noqa: E402
from tapekit.testing.analyst import ENVIRONMENT, make_analyst, scripted_brain, start_tape  # noqa: E402
from tapekit.testing.analyst import MeteredBrain as _MeteredBrain  # noqa: E402
from tests.conftest import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
XSS_SCRIPT = "<script>window.__xss=1</script>"
XSS_IMG = '<img src=x onerror="window.__xss=2">'


# --------------------------------------------------------------------------- a filled store


class MeteredBrain(_MeteredBrain):
    """The example's metered scripted model, under a model name of its own."""

    model_name: str = "scripted-metered"


def team() -> tuple[Agent, Environment]:
    """The analyst team on the metered scripted model, with its tools."""
    return make_analyst(MeteredBrain()), ENVIRONMENT


def record(store: TapeStore, question: str, tags: list[str], llm: Any = None) -> tuple[str, Tape[Any, Any]]:
    """Run the team on ``question`` with the store's recorder; return the stored id and final tape."""
    start = start_tape(question)
    rec = store.recorder(start, tags=tags)
    final = start
    for event in main_loop(make_analyst(llm or MeteredBrain()), start, ENVIRONMENT):
        rec(event)
        if event.tape is not None:
            final = event.tape
    return start.metadata.id, final


def other_brain(prompt: Prompt) -> LLMOutput:
    """The scripted model with a different plan: the candidate batch diverges at step 1."""
    out = scripted_brain(prompt)
    if out.content and out.content.startswith("1. Find the ticker"):
        return LLMOutput(content="1. Look the company up. 2. Answer briefly.")
    return out


def fill(store: TapeStore) -> dict[str, Any]:
    """The tapes every Studio test reads: two sessions per batch, an XSS tape, a failed tape,
    a 450-step tape and 55 tiny ones (for paging)."""
    ids: dict[str, Any] = {}
    ids["vulcan"], ids["vulcan_tape"] = record(store, "Tell me about Vulcan in 3 sentences", ["baseline"])
    ids["acme"], _ = record(store, "Tell me about Acme in 3 sentences", ["baseline"])
    other = MeteredBrain(fn=other_brain)
    ids["vulcan_b"], _ = record(store, "Tell me about Vulcan in 3 sentences", ["candidate"], other)
    ids["acme_b"], _ = record(store, "Tell me about Acme in 3 sentences", ["candidate"], other)
    xss = Tape(steps=[UserStep(content=XSS_SCRIPT), UserStep(content=XSS_IMG)])
    xss = xss.with_metadata(author=XSS_IMG, error=XSS_SCRIPT)
    ids["xss"] = store.save_tape(xss, tags=["<b>xss</b>"])
    failed = Tape(steps=[UserStep(content="hello")]).with_metadata(
        author="tester", error="RuntimeError: boom"
    )
    ids["failed"] = store.save_tape(failed)
    ids["long"] = store.save_tape(Tape(steps=[UserStep(content=f"message {i}") for i in range(450)]))
    for i in range(55):
        store.save_tape(Tape(steps=[UserStep(content=f"tiny {i}")]), tags=["bulk"])
    store.flush()
    return ids


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path_factory.mktemp("studio") / "studio.db", flush_interval_s=0.005) as s:
        yield s


@pytest.fixture(scope="module")
def ids(store: SQLiteStore) -> dict[str, Any]:
    return fill(store)


@pytest.fixture(scope="module")
def client(store: SQLiteStore, ids: dict[str, Any]) -> Iterator[TestClient]:
    app = create_app(store, agents={"analyst": team})
    with TestClient(app, raise_server_exceptions=False) as c:
        c.get("/tapes")  # receive the CSRF cookie, like a browser on its first page
        yield c


def csrf(client: TestClient) -> str:
    return client.cookies["tapekit_studio_csrf"]


def message(html: str) -> str:
    """The text of an error page's message."""
    found = re.search(r'<p class="message">(.*?)</p>', html, re.S)
    assert found, html[:500]
    return found.group(1)


def step_rows(html: str) -> list[tuple[int, str]]:
    """(index, category) of every step row on a tape page."""
    return [(int(i), c) for c, i in re.findall(r'class="step-row cat-(\w+)[^"]*"\s+id="step-(\d+)"', html)]


def child_id(response: httpx.Response) -> str:
    assert response.status_code == 303, (response.status_code, response.text[:800])
    found = re.match(r"/tapes/([0-9a-f]+)", response.headers["location"])
    assert found, response.headers["location"]
    return found.group(1)


# --------------------------------------------------------------------------- the browser pages


def test_tape_list_filters_and_pages(client: TestClient, ids: dict[str, Any]) -> None:
    page1 = client.get("/tapes")
    assert page1.status_code == 200 and "of 62 tapes" in page1.text
    assert page1.text.count('name="id" value=') == 50
    page2 = client.get("/tapes?page=2")
    assert page2.text.count('name="id" value=') == 12 and ids["vulcan"] in page2.text
    by_agent = client.get("/tapes", params={"agent": "analyst/search_agent"}).text
    assert all(ids[k] in by_agent for k in ("vulcan", "acme", "vulcan_b", "acme_b"))
    assert ids["failed"] not in by_agent and "of 4 tapes" in by_agent
    failed = client.get("/tapes?error=yes").text
    assert ids["failed"] in failed and ids["xss"] in failed and ids["vulcan"] not in failed
    assert client.get("/tapes?error=no").text.count("badge error") == 0
    assert "of 2 tapes" in client.get("/tapes?tag=candidate").text
    assert ids["failed"] in client.get("/tapes?author=tester").text
    assert "No tapes match" in client.get("/tapes?author=nobody").text
    assert client.get("/tapes?page=3").status_code == 400
    assert client.get("/tapes?error=maybe").status_code == 400
    assert client.get("/tapes?page=zero").status_code == 400


def test_a_tape_has_a_stable_url_and_pages_of_steps(client: TestClient, ids: dict[str, Any]) -> None:
    url = f"/tapes/{ids['vulcan']}"
    first, again = client.get(url), client.get(url)
    assert first.status_code == again.status_code == 200 and first.text == again.text
    rows = step_rows(first.text)
    assert [i for i, _ in rows] == list(range(19))
    assert {c for _, c in rows} == {"thought", "action", "observation", "control"}
    assert rows[0][1] == "observation" and rows[1][1] == "thought" and rows[2][1] == "control"
    assert rows[3][1] == "action"
    assert "analyst/search_agent.search" in first.text and "set_next_node" in first.text
    assert re.search(r"\d+\+\d+ tok", first.text)  # tokens of each node run's LLM call
    long = f"/tapes/{ids['long']}"
    assert [i for i, _ in step_rows(client.get(long).text)] == list(range(200))
    assert [i for i, _ in step_rows(client.get(long + "?page=3").text)] == list(range(400, 450))
    assert client.get(long + "?page=4").status_code == 400
    step_page = client.get(long + "/steps/420").text  # opens on the page holding the step
    assert step_rows(step_page)[0][0] == 400 and 'id="step-420"' in step_page


def test_a_step_shows_its_exact_prompt_output_and_usage(
    client: TestClient, store: SQLiteStore, ids: dict[str, Any]
) -> None:
    tape = ids["vulcan_tape"]
    call = store.llm_call_for_step(tape.steps[1])
    assert call is not None and call.prompt_tokens > 0
    html = client.get(f"/tapes/{ids['vulcan']}/steps/1").text
    assert "Write a numbered plan" in html and "scripted-metered" in html
    assert f'<dd class="prompt-tokens">{call.prompt_tokens}</dd>' in html
    assert f'<dd class="output-tokens">{call.output_tokens}</dd>' in html
    assert f"{call.latency_s:.3f} s" in html and "$0.000" in html
    assert "1. Find the ticker of Vulcan" in html  # the output
    assert "Tools offered (3)" in html and "get_stock_ticker" in html
    # inside the helper's run: two views on the stack, and what each runs next
    inner = client.get(f"/tapes/{ids['vulcan']}/steps/10").text
    views = re.findall(r'<li class="view">\s*<p><strong>([^<]+)</strong>', inner)
    assert views == ["analyst", "analyst/search_agent"]
    assert (
        "next node <code>act</code>" in inner and "next node <code>search (finishing its run)</code>" in inner
    )
    after_run = client.get(f"/tapes/{ids['vulcan']}/steps/11").text
    assert "next node <code>search</code>" in after_run
    assert "Use at most 4 tool calls" in inner
    env = client.get(f"/tapes/{ids['vulcan']}/steps/4").text
    assert "No LLM made this step" in env
    fragment = client.get(f"/tapes/{ids['vulcan']}/steps/1?fragment=1")
    assert (
        fragment.status_code == 200
        and "<html" not in fragment.text
        and "Write a numbered plan" in fragment.text
    )
    last = client.get(f"/tapes/{ids['vulcan']}/steps/18").text
    assert "next to move: <strong>the environment (answering assistant)</strong>" in last


def test_errors_are_clear_pages(client: TestClient, ids: dict[str, Any]) -> None:
    cases = {
        "/tapes/no-such-tape": (404, "There is no tape &#39;no-such-tape&#39;"),
        f"/tapes/{ids['vulcan']}/steps/19": (404, "has 19 steps; there is no step 19"),
        f"/tapes/{ids['vulcan']}/steps/-1": (404, "there is no step -1"),
        f"/tapes/{ids['vulcan']}/steps/one": (400, "index: Input should be a valid integer"),
        f"/tapes/{ids['vulcan']}?page=2": (400, "past the last page"),
        f"/tapes/{ids['vulcan']}?page=0": (400, "page must be at least 1"),
        "/nowhere": (404, "There is no page at this address"),
        f"/diff?a={ids['vulcan']}&b=missing": (404, "There is no tape &#39;missing&#39;"),
        f"/diff?id={ids['vulcan']}": (400, "Pick exactly two tapes"),
        "/diff/batches?a=tag:&b=tag:x": (400, "Write tag:NAME"),
    }
    for url, (status, text) in cases.items():
        response = client.get(url)
        assert response.status_code == status, url
        assert text in message(response.text), (url, message(response.text))
        assert "Traceback" not in response.text and response.headers["content-type"].startswith("text/html")


# --------------------------------------------------------------------------- diffs


def test_diff_highlights_the_first_divergence(client: TestClient, ids: dict[str, Any]) -> None:
    html = client.get("/diff", params={"a": ids["vulcan"], "b": ids["vulcan_b"]}).text
    row = re.search(r'<tr class="(\w+)" id="first-divergence">\s*<td class="idx">(\d+)</td>', html)
    assert row is not None and row.groups() == ("divergence", "1")
    assert "First divergence at" in html and "step 1</a>" in html
    # only the plan differs: the scripted model's later prompts do not depend on it
    assert html.count('<tr class="same">') == 18 and html.count('<tr class="differs">') == 0
    same = client.get("/diff", params={"a": ids["vulcan"], "b": ids["vulcan"]}).text
    assert "The tapes are the same" in same and "first-divergence" not in same.split('<table class="diff"')[1]
    ticked = client.get("/diff", params=[("id", ids["vulcan"]), ("id", ids["acme"])]).text
    assert re.search(r'id="first-divergence">\s*<td class="idx">0<', ticked)  # different questions
    assert 'name="a"' in client.get("/diff").text  # the empty form


def test_batch_diff_pairs_tapes_that_started_the_same(
    client: TestClient, store: SQLiteStore, ids: dict[str, Any]
) -> None:
    html = client.get("/diff/batches", params={"a": "tag:baseline", "b": "tag:candidate"}).text
    pairs = re.findall(r'href="/diff\?a=(\w+)&amp;b=(\w+)#first-divergence"', html)
    assert sorted(pairs) == sorted([(ids["vulcan"], ids["vulcan_b"]), (ids["acme"], ids["acme_b"])])
    assert html.count("same first steps") == 2 and html.count("differ from step 1") == 2
    listed = client.get(
        "/diff/batches", params={"a": f"{ids['vulcan']}, {ids['failed']}", "b": ids["vulcan_b"]}
    )
    assert listed.status_code == 200 and listed.text.count("no partner") == 1
    assert client.get("/diff/batches", params={"a": "nope", "b": ids["acme"]}).status_code == 404
    parent = store.get_tape(ids["vulcan"])
    one = store.save_tape(parent.with_new_steps([UserStep(content="Thanks!")]))
    two = store.save_tape(parent.with_new_steps([UserStep(content="And Acme?")]))
    siblings = client.get("/diff/batches", params={"a": one, "b": two}).text
    assert "same parent" in siblings and "differ from step 19" in siblings


# --------------------------------------------------------------------------- edits and runs


def test_editing_a_step_saves_a_child_and_keeps_the_parent(
    client: TestClient, store: SQLiteStore, ids: dict[str, Any]
) -> None:
    source = ids["vulcan"]
    before = store.get_tape(source)
    new = {"kind": "assistant_thought", "content": "1. Ask the search agent. 2. Answer."}
    response = client.post(
        f"/tapes/{source}/steps/1/edit",
        data={"csrf": csrf(client), "step": json.dumps(new)},
        follow_redirects=False,
    )
    child = child_id(response)
    assert response.headers["location"].endswith("#step-1")
    info = store.get_tape_info(child)
    assert (info.parent_id, info.author, info.n_steps) == (source, "studio", 2)
    edited = store.get_tape(child)
    assert edited.steps[1].content == new["content"] and edited.steps[1].metadata.run_end  # type: ignore[attr-defined]
    assert edited.steps[1].metadata.other["edited_from"] == before.steps[1].metadata.id
    after = store.get_tape(source)
    assert signatures(after.steps) == signatures(before.steps) and len(after) == 19
    page = client.get(f"/tapes/{child}").text
    assert f'class="parent-link" href="/tapes/{source}"' in page and "diff with parent" in page
    assert child in client.get(f"/tapes/{source}").text  # listed among the parent's children
    kept = client.post(
        f"/tapes/{source}/steps/4/edit",
        data={
            "csrf": csrf(client),
            "step": json.dumps({"kind": "tool_result", "content": "XYZ"}),
            "keep_rest": "on",
        },
        follow_redirects=False,
    )
    assert store.get_tape_info(child_id(kept)).n_steps == 19


def test_invalid_edits_are_refused_with_the_reason(
    client: TestClient, store: SQLiteStore, ids: dict[str, Any]
) -> None:
    n = store.count_tapes()
    url = f"/tapes/{ids['vulcan']}/steps/1/edit"
    cases = {
        '{"kind": "assistant_thought", "content": ': "invalid JSON at line 1, column",
        "[1, 2]": "a step must be a JSON object, got list",
        '{"content": "x"}': "the step has no &#34;kind&#34;",
        '{"kind": "telepathy", "content": "x"}': "unknown step kind &#39;telepathy&#39;; known kinds:",
        '{"kind": "assistant_thought", "content": 3}': "invalid assistant_thought step: content:",
        '{"kind": "user", "content": "x", "mood": "happy"}': "mood: Extra inputs are not permitted",
    }
    for text, reason in cases.items():
        response = client.post(url, data={"csrf": csrf(client), "step": text}, follow_redirects=False)
        assert response.status_code == 400 and reason in message(response.text), (
            text,
            message(response.text),
        )
    assert (
        client.post(f"/tapes/{ids['vulcan']}/steps/99/edit", data={"csrf": csrf(client)}).status_code == 404
    )
    assert store.count_tapes() == n


def test_deleting_a_step_saves_a_shorter_child(
    client: TestClient, store: SQLiteStore, ids: dict[str, Any]
) -> None:
    response = client.post(
        f"/tapes/{ids['vulcan']}/steps/5/delete", data={"csrf": csrf(client)}, follow_redirects=False
    )
    child = store.get_tape(child_id(response))
    assert len(child) == 5 and child.metadata.parent_id == ids["vulcan"]
    assert signatures(child.steps) == signatures(store.get_tape(ids["vulcan"]).steps[:5])


def test_step_and_run_continue_a_tape_as_child_tapes(
    client: TestClient, store: SQLiteStore, ids: dict[str, Any]
) -> None:
    start = start_tape("Tell me about Vulcan in 3 sentences")
    store.save_tape(start)

    def advance(tape_id: str, mode: str) -> str:
        data = {"csrf": csrf(client), "agent": "analyst", "tape": tape_id, "mode": mode}
        return child_id(client.post("/runs", data=data, follow_redirects=False))

    plan = advance(start.metadata.id, "step")  # one node run: the plan
    tape = store.get_tape(plan)
    assert [s.kind for s in tape.steps] == ["user", "assistant_thought"] and tape.steps[-1].metadata.run_end
    assert tape.metadata.parent_id == start.metadata.id and tape.metadata.author == "analyst"
    act = advance(plan, "step")  # one node run: set_next_node + tool_call
    assert [s.kind for s in store.get_tape(act).steps[2:]] == ["set_next_node", "tool_call"]
    env = advance(act, "step")  # one environment reaction
    env_tape = store.get_tape(env)
    assert [s.kind for s in env_tape.steps[4:]] == [
        "tool_result"
    ] and env_tape.metadata.author == "environment"
    done = advance(env, "run")  # until the agent answers the user
    final = store.get_tape(done)
    assert signatures(final.steps) == signatures(ids["vulcan_tape"].steps)
    assert [i.id for i in store.ancestry(done)][:4] == [env, act, plan, start.metadata.id]
    assert "Write a numbered plan" in client.get(f"/tapes/{plan}/steps/1").text  # its LLM call was stored
    assert store.get_tape_info(start.metadata.id).n_steps == 1  # nothing changed in place
    waiting = client.post(
        "/runs", data={"csrf": csrf(client), "agent": "analyst", "tape": done, "mode": "step"}
    )
    assert waiting.status_code == 409 and "waits for the user" in message(waiting.text)
    unknown = client.post(
        "/runs", data={"csrf": csrf(client), "agent": "nobody", "tape": done, "mode": "run"}
    )
    assert unknown.status_code == 400 and "No agent &#39;nobody&#39;" in message(unknown.text)
    bad_mode = client.post(
        "/runs", data={"csrf": csrf(client), "agent": "analyst", "tape": done, "mode": "fly"}
    )
    assert bad_mode.status_code == 400


def test_edit_then_resume_and_answer_the_agent(
    client: TestClient, store: SQLiteStore, ids: dict[str, Any]
) -> None:
    edit = {"kind": "assistant_thought", "content": "1. Find the ticker of Acme. 2. Answer."}
    edited = child_id(
        client.post(
            f"/tapes/{ids['vulcan']}/steps/1/edit",
            data={"csrf": csrf(client), "step": json.dumps(edit)},
            follow_redirects=False,
        )
    )
    data = {"csrf": csrf(client), "agent": "analyst", "tape": edited, "mode": "run"}
    resumed = store.get_tape(child_id(client.post("/runs", data=data, follow_redirects=False)))
    assert resumed.metadata.parent_id == edited and resumed.steps[1].content == edit["content"]  # type: ignore[attr-defined]
    assert resumed.steps[-1].kind == "assistant" and resumed.metadata.error is None
    reply = json.dumps({"kind": "user", "content": "Thanks! And Acme?"})
    answered = child_id(
        client.post(
            f"/tapes/{resumed.metadata.id}/append",
            data={"csrf": csrf(client), "step": reply},
            follow_redirects=False,
        )
    )
    assert store.get_tape(answered).steps[-1].content == "Thanks! And Acme?"  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- security


def test_forms_need_the_csrf_token_and_the_same_origin(
    client: TestClient, store: SQLiteStore, ids: dict[str, Any]
) -> None:
    n = store.count_tapes()
    url = f"/tapes/{ids['vulcan']}/steps/5/delete"
    assert "missing or stale" in message(client.post(url, data={}).text)
    assert client.post(url, data={"csrf": "x" * 43}).status_code == 403
    foreign = client.post(url, data={"csrf": csrf(client)}, headers={"origin": "http://evil.example"})
    assert foreign.status_code == 403 and "evil.example" in message(foreign.text)
    cross = client.post(url, data={"csrf": csrf(client)}, headers={"sec-fetch-site": "cross-site"})
    assert cross.status_code == 403
    as_json = client.post(url, json={"csrf": csrf(client)})
    assert as_json.status_code == 400
    assert store.count_tapes() == n
    same = client.post(
        url, data={"csrf": csrf(client)}, headers={"origin": "http://testserver"}, follow_redirects=False
    )
    assert same.status_code == 303
    assert 'name="csrf" value="' + csrf(client) + '"' in client.get(f"/tapes/{ids['vulcan']}/steps/1").text


def test_a_token_guards_every_page(store: SQLiteStore, ids: dict[str, Any]) -> None:
    app = create_app(store, token="s3cret-token")
    with TestClient(app, raise_server_exceptions=False) as anonymous:
        assert anonymous.get("/tapes").status_code == 401
        assert anonymous.get("/static/studio.css").status_code == 401
        assert anonymous.get("/tapes?token=wrong").status_code == 401
        assert anonymous.get("/tapes", headers={"authorization": "Bearer wrong"}).status_code == 401
        ok = anonymous.get(f"/tapes/{ids['vulcan']}", headers={"authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200
        # a bearer request cannot be forged by a web page, so it needs no CSRF token
        posted = anonymous.post(
            f"/tapes/{ids['vulcan']}/steps/5/delete",
            headers={"authorization": "Bearer s3cret-token"},
            data={},
            follow_redirects=False,
        )
        assert posted.status_code == 303
    with TestClient(app, raise_server_exceptions=False) as browser:
        login = browser.get(f"/tapes/{ids['vulcan']}?token=s3cret-token&page=1", follow_redirects=False)
        assert login.status_code == 303 and login.headers["location"] == f"/tapes/{ids['vulcan']}?page=1"
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "s3cret-token" not in cookie
        assert browser.get("/tapes").status_code == 200  # the cookie now lets the browser in


def test_all_text_is_escaped(client: TestClient, ids: dict[str, Any]) -> None:
    pages = [
        client.get(f"/tapes/{ids['xss']}"),
        client.get(f"/tapes/{ids['xss']}/steps/0"),
        client.get(f"/tapes/{ids['xss']}/steps/1"),
        client.get("/tapes?error=yes"),
        client.get("/diff", params={"a": ids["xss"], "b": ids["failed"]}),
    ]
    for response in pages:
        html = response.text
        assert response.status_code == 200
        assert "<script>window" not in html and "<img src=x" not in html and "<b>xss" not in html
        assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in html or "&lt;img src=x" in html
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert response.headers["x-frame-options"] == "DENY"
    reflected = client.get("/tapes", params={"author": '"><script>alert(1)</script>'}).text
    assert "<script>alert" not in reflected and "&#34;&gt;&lt;script&gt;alert(1)" in reflected


def test_agent_registration_errors_name_the_source() -> None:
    with pytest.raises(ValueError, match="must look like"):
        load_agents(["tapekit.testing.analyst"])
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        load_agents(["tapekit.testing.analyst:nope"])
    with pytest.raises(ValueError, match="expected an Agent or \\(Agent, Environment\\), got Tape"):
        load_agents(["tapekit.testing.analyst:start_tape"])
    with pytest.raises(ValueError, match="two registered agents are named 'analyst'"):
        load_agents(["tapekit.testing.analyst:team", "tests.studio.test_studio:team"])
    registered = load_agents(["tapekit.testing.analyst:make_analyst"])["analyst"]
    assert registered.environment is None and registered.source == "tapekit.testing.analyst:make_analyst"


# --------------------------------------------------------------------------- the real server


def _start(args: list[str], cwd: Path = ROOT) -> tuple[subprocess.Popen[str], str]:
    """Start ``tapekit studio`` as a service manager would: stdout a pipe, Python's own
    buffering left on (no PYTHONUNBUFFERED), so the banner must be flushed by the command."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(ROOT)
    process = subprocess.Popen(
        [sys.executable, "-m", "tapekit.cli", "studio", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in process.stdout], daemon=True).start()  # type: ignore[union-attr]
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        if "tapekit Studio on" in line:
            return process, "".join(seen)
    process.kill()
    raise AssertionError("the Studio did not print its URL while running:\n" + "".join(seen))


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def _get(url: str, **kwargs: Any) -> httpx.Response:
    deadline = time.monotonic() + 15
    while True:
        try:
            return httpx.get(url, timeout=5, **kwargs)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_studio_command_serves_and_makes_a_token_off_loopback(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    with SQLiteStore(db) as s:
        tape_id, _ = record(s, "Tell me about Vulcan in 3 sentences", ["cli"])
    port = free_port()
    process, _ = _start(["--db", str(db), "--port", str(port), "--agent", "tapekit.testing.analyst:team"])
    try:
        page = _get(f"http://127.0.0.1:{port}/tapes/{tape_id}/steps/1")
        assert page.status_code == 200 and "Write a numbered plan" in page.text
        assert _get(f"http://127.0.0.1:{port}/runs").text.count("tapekit.testing.analyst:team") == 1
    finally:
        _stop(process)
    port = free_port()
    process, banner = _start(["--db", str(db), "--port", str(port), "--host", "0.0.0.0"])
    try:
        token = re.search(r"made one: (\S+)", banner)
        assert token is not None and f"?token={token.group(1)}" in banner
        assert _get(f"http://127.0.0.1:{port}/tapes").status_code == 401
        with httpx.Client(follow_redirects=True, timeout=5) as browser:
            ok = browser.get(f"http://127.0.0.1:{port}/tapes?token={token.group(1)}")
            assert ok.status_code == 200 and tape_id in ok.text and "token=" not in str(ok.url)
    finally:
        _stop(process)
    bad = subprocess.run(
        [sys.executable, "-m", "tapekit.cli", "studio", "--db", str(db), "--agent", "nowhere:thing"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "cannot import 'nowhere'" in bad.stderr


def test_the_studio_command_refuses_a_missing_file_unless_asked_to_create_it(tmp_path: Path) -> None:
    def studio(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tapekit.cli", "studio", *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)

    typo = tmp_path / "typo.db"
    out = studio("--db", str(typo))
    assert out.returncode == 2 and f"no tape store at {typo}" in out.stderr and "--create" in out.stderr
    assert not typo.exists()
    out = studio("--db", str(typo), "--create", "--import", "no_such_module_here")
    assert out.returncode == 2 and "--import no_such_module_here: cannot import it" in out.stderr
    port = free_port()
    process, _ = _start(["--db", str(typo), "--create", "--port", str(port)])
    try:
        assert _get(f"http://127.0.0.1:{port}/tapes").status_code == 200 and typo.exists()
    finally:
        _stop(process)


STEP_MODULE = """
from typing import Literal
from tapekit import Thought

class Hunch(Thought):
    kind: Literal["studio_test_hunch"] = "studio_test_hunch"
    guess: str
    confidence: float
"""


def test_steps_of_kinds_not_imported_are_shown_generically_and_import_loads_them(tmp_path: Path) -> None:
    (tmp_path / "hunches.py").write_text(STEP_MODULE)
    db = tmp_path / "kinds.db"
    maker = (
        "import sys; sys.path.insert(0, '.'); from hunches import Hunch; from tapekit import Tape, UserStep;"
        "from tapekit.store import SQLiteStore;"
        "t = Tape(steps=[UserStep(content='q'), Hunch(guess='<b>vulcan</b>', confidence=0.5)]);"
        f"s = SQLiteStore({str(db)!r}); s.save_tape(t.with_metadata(id='hunch-tape')); s.close()"
    )
    subprocess.run(
        [sys.executable, "-c", maker], cwd=tmp_path, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    with SQLiteStore(db) as store, TestClient(create_app(store), raise_server_exceptions=False) as c:
        page = c.get("/tapes/hunch-tape")  # this process never imported `hunches`
        assert page.status_code == 200, message(page.text)
        assert step_rows(page.text) == [(0, "observation"), (1, "unknown")]
        assert "studio_test_hunch" in page.text and "&lt;b&gt;vulcan&lt;/b&gt;" in page.text
        assert "--import" in page.text
        detail = c.get("/tapes/hunch-tape/steps/1")
        assert detail.status_code == 200 and "confidence" in detail.text
    port = free_port()
    process, _ = _start(["--db", str(db), "--port", str(port), "--import", "hunches"], cwd=tmp_path)
    try:
        page = _get(f"http://127.0.0.1:{port}/tapes/hunch-tape")
        assert page.status_code == 200
        assert [c for _, c in step_rows(page.text)] == ["observation", "thought"]
    finally:
        _stop(process)
