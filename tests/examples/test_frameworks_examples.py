"""examples/data_science_team.py: a TeamAgent that writes code, runs it in the sandbox, makes a plot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples import data_science_team as ds
from tapekit import FunctionLLM, Prompt, Respond, Tape
from tapekit._diff import signatures
from tapekit.sandbox import Sandbox

pytestmark = pytest.mark.skipif(Sandbox.available() is not None, reason=f"no sandbox: {Sandbox.available()}")


def speakers(tape: Tape[Any, Any]) -> list[str]:
    return [s.metadata.agent.rsplit("/", 1)[-1] for s in tape.steps if isinstance(s, Respond)]


def test_the_team_makes_the_plot_in_the_sandbox_and_resumes_from_any_step() -> None:
    with Sandbox() as sandbox:
        full = ds.run(ds.make_team(), sandbox)
        assert full.metadata.error is None
        svg = (sandbox.workdir / "plot.svg").read_text()
    assert svg.count("<polyline") == 2 and "NVDA" in svg and "TSLA" in svg
    assert speakers(full) == ["engineer", "executor", "reviewer", "manager"]
    assert "NVDA: +91.1% over 12 months" in full.steps[10].content  # type: ignore[attr-defined]
    assert full.steps[-1].content.endswith("APPROVED")  # type: ignore[attr-defined]
    for k in range(1, len(full)):
        with Sandbox() as sandbox:
            piece = Tape.model_validate_json(full[:k].model_dump_json())
            resumed = ds.run(ds.make_team(), sandbox, piece)
        assert resumed.metadata.error is None, (k, resumed.metadata.error)
        assert signatures(resumed.steps) == signatures(full.steps), f"resuming after {k} steps diverged"


def test_a_failing_program_goes_back_to_the_engineer() -> None:
    drafts = iter(["```python\nimport nothing_here\n```", f"```python\n{ds.PLOT_CODE}```"])

    def model(prompt: Prompt) -> str:
        if prompt.messages[0]["content"].startswith("You are the software engineer"):
            return next(drafts)
        return ds.scripted_model(prompt)

    with Sandbox() as sandbox:
        tape = ds.run(ds.make_team(FunctionLLM(fn=model)), sandbox)
    assert tape.metadata.error is None
    assert speakers(tape) == ["engineer", "executor", "engineer", "executor", "reviewer", "manager"]
    failed = [s for s in tape.steps if isinstance(s, Respond)][1]
    assert "ModuleNotFoundError" in failed.content and "exit code: 1" in failed.content


def test_the_script_runs_offline(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "examples" / "data_science_team.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "team_terminated  reviewer said 'APPROVED'" in done.stdout
    assert (tmp_path / "plot.svg").read_text().startswith("<svg")


def test_the_gaia_agent_answers_resumes_anywhere_and_makes_training_text() -> None:
    from examples import gaia_qa

    question = gaia_qa.json.loads((gaia_qa.DOCS / "tasks.json").read_text())[0]["question"]
    full = gaia_qa.run(gaia_qa.make_agent(), question)
    assert full.metadata.error is None
    assert [s.metadata.node for s in full.steps[1:3]] == ["plan", "facts"]
    assert full.steps[-1].answer == "75"  # type: ignore[attr-defined]
    assert len(gaia_qa.make_agent().make_training_text(full)) == 6  # plan, facts, four act runs
    for k in range(1, len(full)):
        piece = Tape.model_validate_json(full[:k].model_dump_json())
        resumed = gaia_qa.main_loop(gaia_qa.make_agent(), piece, gaia_qa.make_environment()).get_final_tape()
        assert signatures(resumed.steps) == signatures(full.steps), f"resuming after {k} steps diverged"


def test_the_gaia_tools() -> None:
    from examples import gaia_qa

    assert gaia_qa.calculate("(1987 - 1962) * 3") == "75"
    assert gaia_qa.calculate("__import__('os')").startswith("error: not arithmetic")
    assert gaia_qa.read("../../../etc/passwd") == "no document named '../../../etc/passwd'"
    assert gaia_qa.json.loads(gaia_qa.search("Edda Varga astronomer"))[0] == "varga_biography.txt"
    with Sandbox() as sandbox:
        env = gaia_qa.make_environment(sandbox)
        tape = Tape(steps=[gaia_qa.RunPython(code="print(sum(range(10)))")])
        (result,) = env.react(tape).steps[1:]
    assert result.kind == "gaia_result" and "stdout:\n45" in result.content  # type: ignore[attr-defined]
