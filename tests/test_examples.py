"""The README's snippet and the demo script work as written."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

from tapekit.store import SQLiteStore
from tests.conftest import needs_local_model

ROOT = Path(__file__).resolve().parent.parent


def test_readme_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith(
        "pip install -e . && bash scripts/install-local.sh && python examples/analyst.py"
    )
    test_command = (
        'pip install -e ".[dev]" && bash scripts/install-system.sh && bash scripts/install-local.sh && pytest'
    )
    assert block[1].startswith(test_command)
    assert (ROOT / ".ci" / "run").read_text().strip().endswith(test_command)


def test_readme_python_snippet_runs(capsys: object) -> None:
    code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[0]
    module = types.ModuleType("tapekit_readme_snippet")  # a real module, as a user's script would be
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, "README.md", "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    tape = module.__dict__["tape"]
    assert tape.metadata.error is None, tape.metadata.error  # type: ignore[attr-defined]
    assert tape.steps[-1].text == "you said: hi"  # type: ignore[attr-defined]


def test_demo_script_prints_the_team_tape(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "analyst.py"),
            "Tell me about Acme Robotics in 3 sentences",
            "--model",
            "scripted",
            "--db",
            str(tmp_path / "demo.db"),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=60,
    ).stdout
    lines = out.splitlines()[:19]
    assert "stored as tape" in out and (tmp_path / "demo.db").exists()
    assert "analyst/search_agent.search" in out and "calls search_agent" in out
    assert lines[18].split()[2:5] == ["analyst.act", "action", "assistant"]
    assert "Acme Robotics builds warehouse robots" in lines[18]


@needs_local_model
def test_demo_runs_on_the_embedded_model_and_stores_everything(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "analyst.py"), "--db", str(db)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "analyst.plan" in result.stdout and "prompt +" in result.stdout and "output tokens]" in result.stdout
    )
    with SQLiteStore(db) as store:
        (tape_id,) = store.list_tapes()
        tape = store.get_tape(tape_id)
        runs = {s.metadata.prompt_id for s in tape.steps if s.metadata.prompt_id}
        assert all(store.get_llm_call(pid) is not None for pid in runs)
        assert store.totals("tape")[tape_id]["calls"] == len(runs)
        assert f"({len(runs)} LLM calls, model smollm2-135m-instruct)" in result.stdout


def test_an_unknown_model_choice_is_explained() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "analyst.py"), "--model", "gpt-nonsense"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode != 0 and "OpenAI-compatible URL" in result.stderr
