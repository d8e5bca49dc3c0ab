"""The SQLite store: tapes saved as they grow, LLM calls by prompt id, totals, crash safety."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from examples.analyst import ENVIRONMENT, make_analyst, start_tape
from tapekit import LLMCall, Tape, UserStep, main_loop
from tapekit._diff import signatures
from tapekit.core import LLMOutput, Prompt
from tapekit.store import SQLiteStore


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with SQLiteStore(tmp_path / "t.db") as s:
        yield s


def run_recorded(store: SQLiteStore) -> tuple[Tape[Any, Any], str]:
    start = start_tape()
    record = store.recorder(start)
    final = start
    for event in main_loop(make_analyst(), start, ENVIRONMENT):
        record(event)
        if event.tape is not None:
            final = event.tape
    return final, start.metadata.id


def test_a_recorded_session_round_trips(store: SQLiteStore) -> None:
    final, key = run_recorded(store)
    loaded = store.get_tape(key)
    assert signatures(loaded.steps) == signatures(final.steps)
    assert [s.metadata.id for s in loaded.steps] == [s.metadata.id for s in final.steps]
    assert loaded.metadata.id == key and loaded.metadata.author == final.metadata.author
    assert store.list_tapes() == [key]


def test_every_step_leads_to_its_exact_llm_call(store: SQLiteStore) -> None:
    final, _ = run_recorded(store)
    for step in final.steps:
        call = store.llm_call_for_step(step)
        if step.metadata.agent:
            assert call is not None and call.prompt.id == step.metadata.prompt_id
        else:
            assert call is None
    assert len(store.list_llm_calls()) == 8 and store.list_llm_calls(model="nope") == []
    plan = final.steps[1]
    call = store.llm_call_for_step(plan)
    assert call is not None and call.output.content == plan.content  # type: ignore[attr-defined]
    assert call.prompt.messages[-1]["content"].startswith("Write a numbered plan")


def test_totals_by_agent_node_and_tape(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "t.db") as store:
        start = Tape(steps=[UserStep(content="q")])
        steps = []
        for i, (agent, node) in enumerate([("a", "n1"), ("a", "n1"), ("a/b", "n2")]):
            step = UserStep(content=str(i))
            step.metadata.agent, step.metadata.node, step.metadata.prompt_id = agent, node, f"p{i // 2}"
            steps.append(step)
        tape = start.extend(steps)
        store.save_tape(tape)
        for pid, (pt, ot) in {"p0": (10, 2), "p1": (5, 1)}.items():
            store.save_llm_call(
                LLMCall(
                    prompt=Prompt(id=pid),
                    output=LLMOutput(content="x"),
                    prompt_tokens=pt,
                    output_tokens=ot,
                    cost=0.5,
                )
            )
        assert store.totals("agent") == {
            "a": {"calls": 1, "prompt_tokens": 10, "output_tokens": 2, "cost": 0.5},
            "a/b": {"calls": 1, "prompt_tokens": 5, "output_tokens": 1, "cost": 0.5},
        }
        assert set(store.totals("node")) == {"a.n1", "a/b.n2"}
        assert store.totals("tape")[tape.metadata.id]["prompt_tokens"] == 15
        with pytest.raises(ValueError, match="choose"):
            store.totals("model")  # type: ignore[arg-type]


def test_saving_a_growing_tape_writes_only_new_steps(store: SQLiteStore) -> None:
    tape = Tape(steps=[UserStep(content="0")])
    key = store.save_tape(tape)
    for i in range(1, 50):
        tape = tape.append(UserStep(content=str(i)))
        store.save_tape(tape, key)
    loaded = store.get_tape(key)
    assert [s.content for s in loaded.steps] == [str(i) for i in range(50)]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="stored steps"):
        store.save_tape(Tape(steps=[UserStep(content="short")]), key)
    with pytest.raises(KeyError):
        store.get_tape("nope")


def test_a_killed_writer_process_loses_nothing_committed(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    script = textwrap.dedent(f"""
        import os, time
        from tapekit import Tape, UserStep
        from tapekit.store import SQLiteStore
        store = SQLiteStore({str(db)!r}, flush_interval_s=0.01)
        tape = Tape(steps=[UserStep(content="0")])
        key = store.save_tape(tape, "session")
        for i in range(1, 30):
            tape = tape.append(UserStep(content=str(i)))
            store.save_tape(tape, "session")
        store.flush()
        print("flushed", flush=True)
        os.kill(os.getpid(), 9)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "flushed" in result.stdout and result.returncode == -9
    with SQLiteStore(db) as store:
        loaded = store.get_tape("session")
        assert [s.content for s in loaded.steps] == [str(i) for i in range(30)]  # type: ignore[attr-defined]


def test_two_stores_on_one_file(tmp_path: Path) -> None:
    a, b = SQLiteStore(tmp_path / "shared.db"), SQLiteStore(tmp_path / "shared.db")
    try:
        ta, tb = Tape(steps=[UserStep(content="a")]), Tape(steps=[UserStep(content="b")])
        a.save_tape(ta)
        b.save_tape(tb)
        a.flush()
        b.flush()
        assert set(a.list_tapes()) == {ta.metadata.id, tb.metadata.id}
    finally:
        a.close()
        b.close()


def test_memory_path_is_refused() -> None:
    with pytest.raises(ValueError, match="file path"):
        SQLiteStore(":memory:")
