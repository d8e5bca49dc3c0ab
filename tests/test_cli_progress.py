"""The live progress display that ``tapekit eval`` and ``tapekit batch`` share: done / total,
passed and failed, the rate and the time left on a terminal; nothing at all off a terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

from rich.console import Console

from tapekit._cli.progress import live_progress

ROOT = Path(__file__).resolve().parent.parent
TEAM = "tapekit.testing.analyst:team"
TASKS = "tapekit.testing.analyst:TASKS"
CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
PROGRESS_LIKE = ("ETA", "attempts/", "LLM calls/s", "\r", "\x1b[")  # and "━" on stderr (a bar)


def plain(text: str) -> str:
    """``text`` without terminal control sequences and carriage returns."""
    return CONTROL.sub("", text).replace("\r", "\n")


def test_live_progress_shows_done_total_counters_and_time_left_on_a_terminal() -> None:
    screen = StringIO()
    console = Console(file=screen, force_terminal=True, width=200)
    counts = {"passed": 0, "failed": 0}
    with live_progress(
        console, "my-eval", 5, lambda: f"{counts['passed']} passed {counts['failed']} failed"
    ) as update:
        counts.update(passed=2, failed=1)
        update(3)
    shown = plain(screen.getvalue())
    last = [line for line in shown.splitlines() if "my-eval" in line][-1]
    assert "3/5" in last and "2 passed 1 failed" in last and "ETA" in last, shown


def test_live_progress_prints_nothing_off_a_terminal() -> None:
    screen = StringIO()
    console = Console(file=screen)  # a file, not a terminal
    assert not console.is_terminal
    with live_progress(console, "my-eval", 5, lambda: "2 passed 1 failed") as update:
        update(3)
    assert screen.getvalue() == ""


def run_on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``tapekit ARGS`` with stdout and stderr on a pseudo-terminal; its exit code and output."""
    import pty

    main_fd, child_fd = pty.openpty()
    env = {**os.environ, "COLUMNS": "250", "LINES": "50", "TERM": "xterm"}
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR"):
        env.pop(name, None)
    process = subprocess.Popen(
        [sys.executable, "-m", "tapekit.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=child_fd,
        stderr=child_fd,
        cwd=cwd,
        env=env,
    )
    os.close(child_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    return process.wait(timeout=180), b"".join(chunks).decode("utf-8", "replace")


def test_eval_shows_live_progress_on_a_terminal(tmp_path: Path) -> None:
    code, output = run_on_a_terminal(["eval", TEAM, "--tasks", TASKS, "-k", "2", "--name", "demo"], tmp_path)
    shown = plain(output)
    assert code == 0, shown
    last = [line for line in shown.splitlines() if line.startswith("demo ")][-1]
    # the scripted team answers three of the four questions, on each of the two attempts
    assert "8/8" in last and "6 passed" in last and "2 failed" in last, last
    assert "attempts/" in last and "ETA" in last, last


def test_eval_and_batch_print_nothing_progress_like_off_a_terminal(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)}
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        env.pop(name, None)

    def tapekit(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tapekit.cli", *args]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180)

    evaluated = tapekit("eval", TEAM, "--tasks", TASKS, "-k", "2")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "pass@1" in evaluated.stdout  # the report is printed (its table has heavy rules: "━")
    assert not [mark for mark in PROGRESS_LIKE if mark in evaluated.stdout], evaluated.stdout
    assert evaluated.stderr == ""

    from tests.batch.test_batch import make_tapes

    (tmp_path / "tapes.jsonl").write_text("".join(json.dumps(t.model_dump()) + "\n" for t in make_tapes(3)))
    batched = tapekit("batch", "tests.batch.test_batch:factory", "--tapes", "tapes.jsonl", "--db", "b.db")
    assert batched.returncode == 0, batched.stderr
    assert "3 of 3 finished" in batched.stderr  # the summary line
    for text in (batched.stdout, batched.stderr):
        assert not [mark for mark in (*PROGRESS_LIKE, "━") if mark in text], text
