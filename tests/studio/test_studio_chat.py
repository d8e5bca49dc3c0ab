"""The Studio's chat page in a real browser: Playwright drives Debian's Chromium (headless)
against the app on a real uvicorn. Sessions are started by ``tapekit chat`` in another process
(which exits), then answered in the browser: approve with edited arguments, reject, reply; the
decisions land on the stored tape before the tool runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._browser import CHROMIUM, chromium, open_page

if not CHROMIUM.exists():
    pytest.skip("needs Debian's chromium at /usr/bin/chromium", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from tapekit.human import WAITING_TAG, ApprovalDecision  # noqa: E402
from tapekit.store import SQLiteStore  # noqa: E402
from tapekit.studio import create_app  # noqa: E402
from tapekit.studio.app import serve_in_thread  # noqa: E402
from tapekit.testing.mailer import OUTBOX, assistant  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHAT = [sys.executable, "-m", "tapekit.cli", "chat"]


def start_session_elsewhere(db: Path, message: str) -> str:
    """Start a chat session in another process with ``tapekit chat``; return its id."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [*CHAT, "--db", str(db), "--agent", "tapekit.testing.mailer:assistant", "-m", message],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("new session "))
    return line.split()[2]


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SQLiteStore, Path]]:
    db = tmp_path_factory.mktemp("chat") / "chat.db"
    with (
        SQLiteStore(db, flush_interval_s=0.005) as store,
        serve_in_thread(create_app(store, agents={"mailer": assistant})) as url,
    ):
        yield url, store, db


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    yield from open_page(browser, width=1300, timeout_ms=15_000)


def test_approve_with_edited_arguments_then_reply(page: Any, studio: tuple[str, SQLiteStore, Path]) -> None:
    url, store, db = studio
    tape_id = start_session_elsewhere(db, "email bob@example.com: lunch?")
    OUTBOX.clear()
    page.goto(f"{url}/chat")
    page.locator("#waiting-sessions").get_by_role("link", name=tape_id[:8]).click()
    sync_api.expect(page.locator("h1 .full-id")).to_have_text(tape_id)
    conversation = page.locator("#conversation")
    sync_api.expect(conversation.locator("li.user .text")).to_have_text("email bob@example.com: lunch?")
    form = page.locator("form.approval")
    sync_api.expect(form).to_contain_text("send_email wants to run with:")
    form.locator("textarea[name=arguments]").fill('{"to": "bob@example.com", "body": "lunch at 1?"}')
    form.get_by_role("button", name="Approve with edited arguments").click()
    sync_api.expect(conversation.locator("li.assistant").last).to_contain_text(
        "Done: sent to bob@example.com"
    )
    sync_api.expect(conversation.locator("li.decision")).to_contain_text("edited send_email")
    assert OUTBOX == [{"to": "bob@example.com", "body": "lunch at 1?"}]
    tape = store.get_tape(tape_id)  # the same stored session grew
    kinds = [s.kind for s in tape.steps]
    i = kinds.index("approval_decision")
    assert kinds[i - 1 : i + 2] == ["tool_call", "approval_decision", "tool_result"]
    decision = tape.steps[i]
    assert isinstance(decision, ApprovalDecision) and decision.arguments == {
        "to": "bob@example.com",
        "body": "lunch at 1?",
    }
    # now it waits for a message: reply from the page
    page.locator("#reply textarea").fill("thanks!")
    page.locator("#reply").get_by_role("button", name="Send").click()
    sync_api.expect(conversation.locator("li.assistant .text").last).to_have_text("You said: thanks!")
    assert WAITING_TAG in store.get_tape_info(tape_id).tags
    page.reload()  # the page is just the stored tape: the same after a reload
    sync_api.expect(conversation.locator("li.user .text").last).to_have_text("thanks!")
    sync_api.expect(conversation.locator("li.user")).to_have_count(2)


def test_reject_tells_the_agent(page: Any, studio: tuple[str, SQLiteStore, Path]) -> None:
    url, store, db = studio
    tape_id = start_session_elsewhere(db, "email eve@example.com: the secret plans")
    OUTBOX.clear()
    page.goto(f"{url}/chat/{tape_id}")
    form = page.locator("form.approval")
    form.locator("input[name=reason]").fill("not to her")
    form.get_by_role("button", name="Reject").click()
    conversation = page.locator("#conversation")
    sync_api.expect(conversation.locator("li.result.error")).to_contain_text(
        "the person rejected this call: not to her"
    )
    sync_api.expect(conversation.locator("li.assistant").last).to_contain_text(
        "Done: Error: the person rejected"
    )
    assert OUTBOX == []
    decision = next(s for s in store.get_tape(tape_id).steps if isinstance(s, ApprovalDecision))
    assert decision.decision == "rejected" and decision.reason == "not to her"


def test_start_a_session_in_the_studio_and_resume_it_from_the_terminal(
    page: Any, studio: tuple[str, SQLiteStore, Path]
) -> None:
    url, store, db = studio
    page.goto(f"{url}/chat")
    page.locator("form.chat-new textarea").fill("hello <b>studio</b>")
    page.locator("form.chat-new").get_by_role("button", name="Start").click()
    conversation = page.locator("#conversation")
    sync_api.expect(conversation.locator("li.assistant .text")).to_have_text("You said: hello <b>studio</b>")
    tape_id = page.locator("h1 .full-id").inner_text()
    assert "chat" in store.get_tape_info(tape_id).tags
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            *CHAT,
            "--db",
            str(db),
            "--agent",
            "tapekit.testing.mailer:assistant",
            "--tape",
            tape_id,
            "-m",
            "from the terminal",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "you> hello <b>studio</b>" in out.stdout and "mailer> You said: from the terminal" in out.stdout
    page.reload()
    sync_api.expect(conversation.locator("li.assistant .text").last).to_have_text(
        "You said: from the terminal"
    )


def test_a_stale_answer_is_refused(studio: tuple[str, SQLiteStore, Path]) -> None:
    url, store, db = studio
    tape_id = start_session_elsewhere(db, "hi")
    n = store.get_tape_info(tape_id).n_steps
    with httpx.Client(base_url=url) as client:
        page = client.get(f"/chat/{tape_id}")
        assert page.status_code == 200 and f'name="n_steps" value="{n}"' in page.text
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        sent = client.post(
            f"/chat/{tape_id}/message", data={"csrf": csrf, "n_steps": str(n), "message": "one"}
        )
        assert sent.status_code == 303
        again = client.post(
            f"/chat/{tape_id}/message", data={"csrf": csrf, "n_steps": str(n), "message": "two"}
        )
        assert again.status_code == 409 and "has moved on" in again.text
        empty = client.post(
            f"/chat/{tape_id}/message", data={"csrf": csrf, "n_steps": str(n + 3), "message": "  "}
        )
        assert empty.status_code == 400 and "a reply must be non-empty text" in empty.text
    assert store.get_tape_info(tape_id).n_steps == n + 3


def test_a_tool_call_in_doubt_is_resolved_in_the_browser(browser: Any, tmp_path: Path) -> None:
    """The payer's bank does not answer for odd amounts, so its ``once`` call is in doubt and
    the session waits; the chat page shows the call and a person says it happened (the tool is
    not run again), or asks for a retry, then says it failed."""
    from tapekit import Tape
    from tapekit.human import reply, run_session
    from tapekit.testing import payer

    agent, env = payer.assistant()
    with (
        SQLiteStore(tmp_path / "pay.db", flush_interval_s=0.005) as store,
        serve_in_thread(create_app(store, agents={"payer": payer.assistant})) as url,
    ):
        payer.BANK.clear()
        start = reply(Tape(), "pay 5")
        turn = run_session(agent, env, start, store=store, tags=["chat"])
        assert turn.stopped == "waiting" and turn.waiting is not None and turn.waiting.kind == "in_doubt"
        tape_id = start.metadata.id
        page = next(open_page(browser, width=1300, timeout_ms=15_000))
        page.goto(f"{url}/chat/{tape_id}")
        doubt = page.locator("#in-doubt form.in-doubt-call")
        sync_api.expect(doubt).to_have_count(1)
        sync_api.expect(doubt).to_contain_text("pay started at")
        sync_api.expect(doubt).to_contain_text('"amount": 5')
        doubt.locator("input[name=text]").fill("paid 5 (checked at the bank)")
        doubt.get_by_role("button", name="It happened").click()
        conversation = page.locator("#conversation")
        sync_api.expect(conversation.locator("li.assistant").last).to_contain_text(
            "Done: paid 5 (checked at the bank)"
        )
        assert len(payer.BANK) == 1  # the one attempt that timed out: not run again
        assert [e.state for e in store.tool_effects(tape_id)] == ["done"]

        page.locator("#reply textarea").fill("pay 7")
        page.locator("#reply").get_by_role("button", name="Send").click()
        doubt = page.locator("#in-doubt form.in-doubt-call")
        sync_api.expect(doubt).to_contain_text('"amount": 7')
        doubt.get_by_role("button", name="It did not happen: run it again").click()
        sync_api.expect(page.locator("#in-doubt form.in-doubt-call")).to_contain_text('"amount": 7')
        assert [a for a, _ in payer.BANK] == [5, 7, 7]  # the retry ran it (and it timed out again)
        doubt = page.locator("#in-doubt form.in-doubt-call")
        doubt.locator("input[name=text]").fill("the bank is down")
        doubt.get_by_role("button", name="It failed").click()
        sync_api.expect(conversation.locator("li.assistant").last).to_contain_text(
            "Done: Error: the bank is down"
        )
        sync_api.expect(page.locator("#in-doubt")).to_have_count(0)
        page.close()
