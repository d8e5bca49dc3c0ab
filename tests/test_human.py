"""A person in the loop: sessions that wait, are stored, and resume in another process; tools that
need approval, with the decision recorded on the tape before the tool runs. The terminal tests
run the real ``tapekit chat`` in subprocesses that exit between turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit import Tape, ToolCall, ToolEnvironment, ToolResult, UserStep, main_loop
from tapekit.human import (
    WAITING_TAG,
    ApprovalDecision,
    ApprovalEnvironment,
    ApprovalNeeded,
    approval_required,
    approve,
    load_session,
    pending_approvals,
    reject,
    reply,
    run_session,
    waiting_on,
)
from tapekit.store import SQLiteStore, TapeFilter
from tapekit.testing.mailer import OUTBOX, assistant

ROOT = Path(__file__).resolve().parent.parent


def kinds(tape: Tape[Any, Any]) -> list[str]:
    return [s.kind for s in tape.steps]


@pytest.fixture(autouse=True)
def empty_outbox() -> Iterator[None]:
    """The mailer's outbox is this process's: each test starts and leaves it empty (the guide's
    example, run by tests/test_docs.py in the same process, expects a fresh one)."""
    OUTBOX.clear()
    yield
    OUTBOX.clear()


def test_a_message_to_the_user_makes_the_session_wait(tmp_path: Path) -> None:
    agent, env = assistant()
    with SQLiteStore(tmp_path / "s.db") as store:
        turn = run_session(agent, env, reply(Tape(), "hello"), store=store)
        assert turn.stopped == "waiting" and turn.waiting is not None and turn.waiting.kind == "message"
        assert turn.tape.steps[-1].content == "You said: hello"
        tape_id = turn.tape.metadata.id
        assert WAITING_TAG in store.get_tape_info(tape_id).tags
        assert kinds(store.get_tape(tape_id)) == ["user", "set_next_node", "assistant"]
        # the next turn continues the same stored tape
        turn = run_session(agent, env, reply(load_session(store, tape_id), "bye"), store=store)
        assert turn.tape.metadata.id == tape_id and store.get_tape_info(tape_id).n_steps == 6
        assert [s.kind for s in turn.added] == ["set_next_node", "assistant"]


def test_an_approval_tool_stops_until_the_person_decides(tmp_path: Path) -> None:
    agent, env = assistant()
    OUTBOX.clear()
    with SQLiteStore(tmp_path / "s.db") as store:
        turn = run_session(agent, env, reply(Tape(), "email bob@example.com: lunch?"), store=store)
        assert turn.stopped == "waiting" and turn.waiting.kind == "approval"
        (call,) = turn.waiting.calls
        assert call.name == "send_email" and OUTBOX == []  # nothing sent yet
        stored = load_session(store, turn.tape.metadata.id)
        assert waiting_on(stored, env).calls[0].metadata.id == call.metadata.id  # known from the tape alone
        decided = approve(stored, environment=env)
        decision = decided.steps[-1]
        assert isinstance(decision, ApprovalDecision) and decision.decision == "approved"
        assert decision.step_id == call.metadata.id and decision.call_id == call.call_id
        turn = run_session(agent, env, decided, store=store)
        assert OUTBOX == [{"to": "bob@example.com", "body": "lunch?"}]
        final = store.get_tape(turn.tape.metadata.id)
        i = kinds(final).index("approval_decision")
        assert kinds(final)[i - 1 : i + 2] == ["tool_call", "approval_decision", "tool_result"]
        assert final.steps[-1].content == "Done: sent to bob@example.com"


def test_edited_arguments_run_and_are_recorded(tmp_path: Path) -> None:
    agent, env = assistant()
    OUTBOX.clear()
    turn = run_session(agent, env, reply(Tape(), "email bob@example.com: lunch?"))
    edited = approve(turn.tape, turn.waiting.calls[0].call_id, arguments={"to": "bob@x.org", "body": "at 1"})
    assert edited.steps[-1].decision == "edited" and edited.steps[-1].arguments == {
        "to": "bob@x.org",
        "body": "at 1",
    }
    turn = run_session(agent, env, edited)
    assert OUTBOX == [{"to": "bob@x.org", "body": "at 1"}]
    result = next(s for s in turn.added if isinstance(s, ToolResult))
    assert result.content == "sent to bob@x.org" and result.error is None
    # edited arguments that do not fit the tool are an error result, not a crash
    turn = run_session(agent, env, reply(turn.tape, "email a@b: hi"))
    turn = run_session(agent, env, approve(turn.tape, arguments={"recipient": "a@b"}))
    result = next(s for s in turn.added if isinstance(s, ToolResult))
    assert "invalid arguments for send_email" in result.error and len(OUTBOX) == 1


def test_a_rejection_tells_the_agent_and_runs_nothing() -> None:
    agent, env = assistant()
    OUTBOX.clear()
    turn = run_session(agent, env, reply(Tape(), "email bob@example.com: lunch?"))
    turn = run_session(agent, env, reject(turn.tape, reason="not today"))
    assert OUTBOX == []
    result = next(s for s in turn.added if isinstance(s, ToolResult))
    assert result.error == "the person rejected this call: not today"
    assert turn.tape.steps[-1].content == "Done: Error: the person rejected this call: not today"


def test_only_approval_tools_wait_and_plain_environments_never_run_them() -> None:
    ran: list[str] = []

    def safe(x: int) -> int:
        """Doubles x."""
        ran.append("safe")
        return 2 * x

    def risky(x: int) -> int:
        """Deletes x."""
        ran.append("risky")
        return x

    calls = [
        ToolCall(name="safe", arguments={"x": 1}, call_id="a"),
        ToolCall(name="risky", arguments={"x": 2}, call_id="b"),
    ]
    tape = Tape(steps=[UserStep(content="go"), *calls])
    env = ApprovalEnvironment([safe, approval_required(risky)])
    assert [c.call_id for c in pending_approvals(tape, env)] == ["b"]
    with pytest.raises(ApprovalNeeded) as stop:
        env.react(tape)
    assert [c.name for c in stop.value.calls] == ["risky"] and ran == []
    done = env.react(approve(tape, "b", environment=env))
    assert [(s.call_id, s.content) for s in done.steps if isinstance(s, ToolResult)] == [("a", 2), ("b", 2)]
    assert sorted(ran) == ["risky", "safe"]
    # the same tool under a plain ToolEnvironment gives an error result and does not run
    ran.clear()
    plain = ToolEnvironment([safe, approval_required(risky)]).react(tape)
    results = [s for s in plain.steps if isinstance(s, ToolResult)]
    assert "needs a person's approval" in results[1].error and ran == ["safe"]
    with pytest.raises(ValueError, match="no pending tool call 'zzz'"):
        approve(tape, "zzz", environment=env)


def two_risky_calls() -> tuple[Tape[Any, Any], ApprovalEnvironment, list[str]]:
    """A tape ending with two calls of an approval tool, the environment, and what ran."""
    ran: list[str] = []

    def risky(x: int) -> int:
        """Deletes x."""
        ran.append(f"risky {x}")
        return x

    tape: Tape[Any, Any] = Tape(
        steps=[
            UserStep(content="go"),
            ToolCall(name="risky", arguments={"x": 1}, call_id="c1"),
            ToolCall(name="risky", arguments={"x": 2}, call_id="c2"),
        ]
    )
    return tape, ApprovalEnvironment([approval_required(risky)]), ran


def test_a_rejected_call_cannot_be_approved_afterwards() -> None:
    tape, env, ran = two_risky_calls()
    one_call: Tape[Any, Any] = Tape(steps=list(tape.steps[:2]))
    with pytest.raises(ValueError, match=r"every one already has a decision \(risky\(c1\): rejected, 'no'\)"):
        env.react(approve(reject(one_call, "c1", reason="no")))
    assert ran == []
    rejected = reject(tape, "c1", reason="no")
    # without a call id, approve picks the call that has no decision yet, not the rejected one
    both = approve(rejected)
    decisions = [s for s in both.steps if isinstance(s, ApprovalDecision)]
    assert [(d.call_id, d.decision) for d in decisions] == [("c1", "rejected"), ("c2", "approved")]
    done = env.react(both)
    results = {s.call_id: s for s in done.steps if isinstance(s, ToolResult)}
    assert results["c1"].error == "the person rejected this call: no" and ran == ["risky 2"]
    # once every call has a decision, there is nothing left to decide: a clear error, no step
    for decide in (approve, reject):
        with pytest.raises(ValueError, match=r"every one already has a decision \(risky\(c1\): rejected"):
            decide(both)
        with pytest.raises(ValueError, match="every one already has a decision"):
            decide(both, environment=env)


@pytest.mark.parametrize("second", ["approve", "reject", "edit"])
@pytest.mark.parametrize("first", ["approve", "reject"])
@pytest.mark.parametrize("how", ["call id", "step id", "ToolCall", "environment"])
def test_a_decided_call_takes_no_second_decision(first: str, second: str, how: str) -> None:
    tape, env, ran = two_risky_calls()
    call = tape.steps[1]
    assert isinstance(call, ToolCall)
    decided = approve(tape, "c1") if first == "approve" else reject(tape, "c1", reason="no")
    target: ToolCall | str = {"call id": "c1", "step id": call.metadata.id, "ToolCall": call}.get(how, "c1")
    extra: dict[str, Any] = {"environment": env} if how == "environment" else {}
    word = "approved" if first == "approve" else "rejected"
    with pytest.raises(ValueError, match=rf"tool call 'c1' already has a decision \(risky\(c1\): {word}"):
        if second == "approve":
            approve(decided, target, **extra)
        elif second == "edit":
            approve(decided, target, arguments={"x": 99}, **extra)
        else:
            reject(decided, target, **extra)
    assert ran == []


def test_the_first_decision_counts_when_a_tape_holds_two() -> None:
    """Defence in depth: a second decision appended by hand (approve and reject refuse to) does
    not overturn the first, in either order."""
    tape, env, ran = two_risky_calls()
    call = tape.steps[1]
    assert isinstance(call, ToolCall)

    def decision(kind: Any) -> ApprovalDecision:
        return ApprovalDecision(
            step_id=call.metadata.id, call_id="c1", name="risky", decision=kind, reason="r"
        )

    c2_rejected = reject(tape, "c2").steps[-1]
    later_approved = tape.model_copy(
        update={"steps": tape.steps.appended([decision("rejected"), decision("approved"), c2_rejected])}
    )
    assert pending_approvals(later_approved, env) == [] and waiting_on(later_approved, env) is None
    done = env.react(later_approved)
    results = {s.call_id: s for s in done.steps if isinstance(s, ToolResult)}
    assert results["c1"].error == "the person rejected this call: r" and ran == []
    later_rejected = tape.model_copy(
        update={"steps": tape.steps.appended([decision("approved"), decision("rejected"), c2_rejected])}
    )
    done = env.react(later_rejected)
    results = {s.call_id: s for s in done.steps if isinstance(s, ToolResult)}
    assert results["c1"].content == 1 and results["c1"].error is None and ran == ["risky 1"]


def test_the_main_loop_resumes_after_a_decision_without_help() -> None:
    """An ApprovalDecision is not an observation: the plain main loop hands the tool call back to
    the environment, which runs it (as the Studio's run page would)."""
    agent, env = assistant()
    OUTBOX.clear()
    stopped = main_loop(agent, reply(Tape(), "email bob@example.com: hi"), env).get_final_tape()
    assert stopped.steps[-1].kind == "tool_call"
    final = main_loop(agent, approve(stopped), env).get_final_tape()
    assert OUTBOX and final.steps[-1].content == "Done: sent to bob@example.com"


# --------------------------------------------------------------------------- the terminal, two processes


def chat(db: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tapekit.cli", "chat", "--db", str(db), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


def test_chat_in_one_process_resumed_by_another(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    agent = ["--agent", "tapekit.testing.mailer:assistant"]
    first = chat(db, *agent, stdin="hello there\nemail bob@example.com: lunch?\n")
    assert first.returncode == 0, first.stderr
    assert "mailer> You said: hello there" in first.stdout
    assert '[tool call] send_email {"to": "bob@example.com", "body": "lunch?"}' in first.stdout
    with SQLiteStore(db) as store:
        (tape_id,) = store.list_tapes(TapeFilter(tag="waiting"))
        assert store.get_tape(tape_id).steps[-1].kind == "tool_call"
    # a later process: shows the conversation so far, takes the decision and a message
    second = chat(
        db, *agent, "--tape", tape_id[:8], stdin='e\n{"to": "bob@example.com", "body": "at 1"}\nthanks\n'
    )
    assert second.returncode == 0, second.stderr
    out = second.stdout
    assert out.index("you> hello there") < out.index("approve send_email") < out.index("[edited] send_email")
    assert "[tool result] sent to bob@example.com" in out and "mailer> You said: thanks" in out
    with SQLiteStore(db) as store:
        tape = store.get_tape(tape_id)
        decision = next(s for s in tape.steps if isinstance(s, ApprovalDecision))
        assert decision.arguments == {"to": "bob@example.com", "body": "at 1"}
        assert WAITING_TAG in store.get_tape_info(tape_id).tags and len(store.list_tapes()) == 1
    # a third: reject from the command line, no prompts
    third = chat(
        db, *agent, "--tape", "waiting", "-m", "email eve@example.com: secrets", "-d", "reject not her"
    )
    assert third.returncode == 0, third.stderr
    assert "[rejected] send_email (not her)" in third.stdout
    assert "[tool error] the person rejected this call: not her" in third.stdout


def test_chat_errors_are_named(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    out = chat(db, "--agent", "tapekit.testing.mailer:nothing_here", "-m", "hi")
    assert out.returncode == 2 and "has no attribute 'nothing_here'" in out.stderr
    out = chat(db, "--agent", "tapekit.testing.mailer:assistant", "--tape", "nope", "-m", "hi")
    assert out.returncode == 2 and "no tape 'nope'" in out.stderr
    first = chat(db, "--agent", "tapekit.testing.mailer:assistant", "-m", "email a@b: x")
    assert first.returncode == 0
    bad = chat(db, "--agent", "tapekit.testing.mailer:assistant", "--tape", "waiting", "-d", "edit {not json")
    assert bad.returncode == 2 and "the arguments are not JSON" in bad.stderr
    data = json.loads(json.dumps({"ok": True}))
    assert data["ok"]


def test_chat_shows_a_call_in_doubt_and_a_later_process_resolves_it(tmp_path: Path) -> None:
    """``tapekit chat`` with the payer: the bank does not answer, so the ``once`` call is in
    doubt and the session waits; a later process (typed answers, then --decision) settles it,
    and pay is not run again when the person says it happened, run again on 'retry'."""
    db = tmp_path / "pay.db"
    agent = ["--agent", "tapekit.testing.payer:assistant"]
    first = chat(db, *agent, "-m", "pay 5")
    assert first.returncode == 0, first.stderr
    assert "[waits: tool call 'pay'" in first.stdout and "may or may not have run" in first.stdout
    tape_id = next(x for x in first.stdout.splitlines() if x.startswith("new session ")).split()[2]
    # typed at the prompt: [d]one, with the result read at the bank
    second = chat(db, *agent, "--tape", tape_id, stdin="d\npaid 5 (checked)\n")
    assert second.returncode == 0, second.stderr
    assert "may or may not have run" in second.stdout and "[pay marked done]" in second.stdout
    assert "payer> Done: paid 5 (checked)" in second.stdout
    with SQLiteStore(db) as store:
        [effect] = store.tool_effects(tape_id)
        assert (effect.state, effect.result) == ("done", "paid 5 (checked)")
    # an even amount goes through; an odd one is in doubt again: retry (it times out again),
    # then the person says it failed
    even = chat(db, *agent, "--tape", tape_id, "-m", "pay 6")
    assert "payer> Done: paid 6" in even.stdout and "[waits:" not in even.stdout
    chat(db, *agent, "--tape", tape_id, "-m", "pay 7")
    retried = chat(db, *agent, "--tape", tape_id, "-d", "retry")
    assert "[pay marked retry]" in retried.stdout and "[waits: tool call 'pay'" in retried.stdout
    failed = chat(db, *agent, "--tape", tape_id, "-d", "failed the bank is down")
    assert "payer> Done: Error: the bank is down" in failed.stdout
    worse = chat(db, *agent, "--tape", tape_id, "-m", "pay 9")
    worse = chat(db, *agent, "--tape", tape_id, "-d", "maybe")
    assert worse.returncode != 0 and "done, failed or retry" in worse.stderr
    with SQLiteStore(db) as store:
        states = [e.state for e in store.tool_effects(tape_id)]
    assert states == ["done", "done", "failed", "started"]  # 5 (resolved), 6, 7 (retried, failed), 9
