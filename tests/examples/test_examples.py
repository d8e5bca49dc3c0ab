"""The README's snippet and the demo script work as written."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

from tapekit.store import SQLiteStore, TapeFilter
from tests.conftest import needs_local_model

ROOT = Path(__file__).resolve().parents[2]


def test_readme_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith(
        "pip install -e . && bash scripts/install-local.sh && python examples/analyst.py"
    )
    test_command = (
        'pip install -e ".[dev]" && bash scripts/install-system.sh && bash scripts/install-local.sh'
        " && pytest -n 2 --dist loadfile && mypy tapekit && lint-imports"
    )
    assert block[1] == test_command + "   # run the tests"
    ci = (ROOT / ".ci" / "run").read_text()
    # CI runs the README's own line, in a fresh venv outside the checkout
    assert "grep -m1 -E '# run the tests$' README.md" in ci and '-m venv "$venv_root/venv"' in ci
    assert 'bash -c "$readme_test"' in ci


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


def test_readme_sample_is_what_the_scripted_demo_prints(tmp_path: Path) -> None:
    """The README's sample is a real run's output (regenerate it when the demo changes)."""
    readme = (ROOT / "README.md").read_text()
    sample = re.search(r"```\n(\[  0\] .*?)```", readme, re.S)
    assert sample is not None, "the README's demo sample is missing"
    printed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "analyst.py"), "--model", "scripted"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,  # stores in ./tapekit.db, as the README's command does
        timeout=60,
    ).stdout

    def without_ids(text: str) -> str:
        return re.sub(r"stored as tape [0-9a-f]{32}", "stored as tape ID", text).rstrip("\n")

    assert without_ids(printed) == without_ids(sample.group(1))


def test_one_llama_cpp_build_time_is_quoted() -> None:
    """The README, the install script and LlamaCppLLM's error quote the same measured figure."""
    sources = [ROOT / "README.md", ROOT / "scripts" / "install-local.sh", ROOT / "tapekit/llm/llamacpp.py"]
    figures = set()
    for path in sources:
        text = " ".join(path.read_text().split())
        found = re.findall(r"(?:about|~) ?([\d.]+) ?min(?:utes)? on 2 cores", text)
        assert found, f"{path.name} quotes no build time"
        figures.update(found)
    assert figures == {"5.5"}


QUESTIONS = [
    "What is Vulcan's ticker?",
    "Tell me about Vulcan in 3 sentences",
    "Compare Vulcan and Acme",
    "What's the weather in Paris?",
    "hello",
    "Tell me about Unknownco in 2 sentences",
    "",
]


def test_the_scripted_team_answers_any_question_in_a_batch(tmp_path: Path) -> None:
    """`tapekit batch examples.analyst:team` on questions it was not written for: every tape ends
    with an answer to the user, none with an error."""
    from typer.testing import CliRunner

    from tapekit.cli import app
    from tapekit.testing.analyst import run, start_tape

    tapes = tmp_path / "questions.jsonl"
    tapes.write_text("".join(start_tape(q).model_dump_json() + "\n" for q in QUESTIONS))
    db = tmp_path / "answers.db"
    out = CliRunner().invoke(
        app, ["batch", "examples.analyst:team", "--tapes", str(tapes), "--db", str(db), "--name", "any"]
    )
    assert out.exit_code == 0, out.output
    assert f"{len(QUESTIONS)} of {len(QUESTIONS)} finished (0 failed" in " ".join(out.output.split())
    with SQLiteStore(db) as store:
        for tape_id in store.list_tapes(TapeFilter(tag="batch:any:done")):
            tape = store.get_tape(tape_id)
            assert tape.metadata.error is None and tape.steps[-1].kind == "assistant", tape_id
            assert tape.steps[-1].content  # type: ignore[attr-defined]
    assert run("What is Vulcan's ticker?").steps[-1].content == "The stock ticker of Vulcan is VMC."  # type: ignore[attr-defined]
