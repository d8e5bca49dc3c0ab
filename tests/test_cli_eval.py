"""``tapekit eval`` and the ready-made answer scorers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tapekit.core import Tape
from tapekit.dialog import AssistantStep, UserStep
from tapekit.evaluate import EvalReport, Task, contains_answer, exact_answer, final_answer
from tapekit.store import SQLiteStore, TapeFilter

TEAM = "tapekit.testing.analyst:team"
TASKS = "tapekit.testing.analyst:TASKS"


def tapekit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "tapekit.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=180,
    )


def test_answer_scorers_read_the_last_assistant_message() -> None:
    task = Task(id="t", question="q", expected="VMC")
    tape = Tape(steps=[UserStep(content="q"), AssistantStep(content="first"), AssistantStep(content=" VMC ")])
    assert final_answer(tape) == " VMC "
    assert exact_answer(tape, task).passed and contains_answer(tape, task).passed
    wordy = Tape(steps=[AssistantStep(content="The ticker is vmc.")])
    assert not exact_answer(wordy, task).passed and contains_answer(wordy, task).passed
    silent = Tape(steps=[UserStep(content="q")])
    assert final_answer(silent) is None
    assert contains_answer(silent, task).feedback == "the agent gave no answer"
    with pytest.raises(ValueError, match="has no `expected` answer"):
        exact_answer(tape, Task(id="n", question="q"))


def test_eval_runs_k_attempts_scores_stores_and_writes_the_report(tmp_path: Path) -> None:
    out = tapekit("eval", TEAM, "--tasks", TASKS, "-k", "2", "--db", "e.db", "--out", "r.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = EvalReport.load(tmp_path / "r.json")
    assert report.k == 2 and report.n_tasks == 4 and len(report.samples) == 8
    # the scripted team answers three of the four questions (see TASKS' docstring)
    assert report.pass_at_1().value == pytest.approx(0.75)
    assert report.by_category()["ticker"].pass_at_1().value == 1.0
    with SQLiteStore(tmp_path / "e.db") as store:
        assert len(store.list_tapes(where=TapeFilter(tag="eval:eval"))) == 8
        assert len(store.list_tapes(where=TapeFilter(tag="eval:eval:failed"))) == 2


def test_eval_reads_a_task_file_and_names_its_scorers(tmp_path: Path) -> None:
    lines = [
        {"id": "a", "question": "What is Vulcan's ticker?", "expected": "The stock ticker of Vulcan is VMC."},
        {"id": "b", "question": "What is Acme's ticker?", "expected": "ACME"},
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tapekit(
        "eval", TEAM, "--tasks", "tasks.jsonl", "--scorer", "strict=exact", "--scorer", "loose=contains",
        "--out", "r.json", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = EvalReport.load(tmp_path / "r.json")
    assert report.scorers == ["strict", "loose"]
    assert report.pass_at_1("strict").value == 0.5 and report.pass_at_1("loose").value == 1.0


def test_eval_explains_bad_input(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "question": "q"}\n{"question": "no id"}\n')
    cases = {
        ("--tasks", "missing.jsonl"): "--tasks missing.jsonl: no such file",
        ("--tasks", "bad.jsonl"): "bad.jsonl, line 2: not a task",
        ("--tasks", "tapekit.testing.analyst:nothing"): "has no attribute 'nothing'",
        ("--tasks", "tapekit.testing.analyst:team"): "must give a non-empty list of tapekit.evaluate.Task",
        ("--tasks", TASKS, "--scorer", "nothere"): "--scorer nothere",
        ("--tasks", TASKS, "-k", "0"): "-k and --concurrency must be at least 1",
        ("--tasks", TASKS, "--environment-retries", "-1"): "--environment-retries must be at least 0",
    }
    for args, message in cases.items():
        out = tapekit("eval", TEAM, *args, cwd=tmp_path)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr


BAD_INPUT = {  # the arguments after TARGET, and the error they must give
    "not-utf8": (
        ["--tasks", "latin1.jsonl"],
        "--tasks latin1.jsonl, line 2: not valid UTF-8 (byte 0xe9 at column 29)",
    ),
    "duplicate-ids-file": (
        ["--tasks", "dup.jsonl"],
        "--tasks dup.jsonl: line 3 repeats task id 'a' of line 1",
    ),
    "duplicate-ids-module": (
        ["--tasks", "tasks:TWICE"],
        "tasks:TWICE: tasks[1] repeats task id 'x' of tasks[0]",
    ),
    "tasks-function-raises": (
        ["--tasks", "tasks:broken"],
        "tasks:broken: calling it failed: RuntimeError: no tasks",
    ),
    "no-question": (["--tasks", "noq.jsonl"], "line 2: task 'b' has neither a question nor a start tape"),
    "out-in-missing-folder": (
        ["--tasks", TASKS, "--out", "missing/r.json"],
        "--out missing/r.json: the folder missing does not exist",
    ),
    "out-is-a-folder": (["--tasks", TASKS, "--out", "."], "--out .: is a folder"),
    "empty-scorer-name": (
        ["--tasks", TASKS, "--scorer", "=exact"],
        "--scorer =exact: the scorer's name is empty",
    ),
    "same-scorer-twice": (
        ["--tasks", TASKS, "--scorer", "exact", "--scorer", "exact"],
        "two scorers are named",
    ),
    "db-in-missing-folder": (
        ["--tasks", TASKS, "--db", "missing/e.db"],
        "cannot open the SQLite store missing/e.db",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_eval_checks_all_input_before_it_creates_the_store_or_runs(tmp_path: Path, case: str) -> None:
    latin1 = b'{"id": "a", "question": "q"}\n{"id": "b", "question": "caf\xe9"}\n'
    (tmp_path / "latin1.jsonl").write_bytes(latin1)
    (tmp_path / "dup.jsonl").write_text('{"id": "a", "question": "q"}\n\n{"id": "a", "question": "r"}\n')
    (tmp_path / "noq.jsonl").write_text('{"id": "a", "question": "q"}\n{"id": "b"}\n')
    (tmp_path / "tasks.py").write_text(
        "from tapekit.evaluate import Task\n"
        "TWICE = [Task(id='x', question='q'), Task(id='x', question='r')]\n"
        "def broken():\n    raise RuntimeError('no tasks today')\n"
    )
    args, message = BAD_INPUT[case]
    out = tapekit("eval", TEAM, *args, *([] if "--db" in args else ["--db", "e.db"]), cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout == ""  # no report: no attempt ran
    assert not (tmp_path / "e.db").exists()  # the store is made only after every check passed


def test_each_eval_help_example_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tapekit.cli import app

    text = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "250"}).output
    lines = [line.strip().strip("│").strip() for line in text.splitlines()]
    examples = [line[2:] for line in lines if line.startswith("$ tapekit eval ")]
    assert len(examples) == 2
    for example in examples:
        out = tapekit(*example.split()[1:], cwd=tmp_path)
        assert out.returncode == 0, f"$ {example}\n{out.stderr[-2000:]}"
