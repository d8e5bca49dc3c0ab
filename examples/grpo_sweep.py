"""Which of GRPO's settings matter on the math task: a sweep of short runs and a bootstrap over them.

The method of arXiv 2507.04103 at the size of a 2-core machine: many short GRPO runs over
sampled configurations of the learning rate, the sampling temperature, the group size and the
KL coefficient, each from the same SFT student and with a few training seeds, then a bootstrap
over the runs (``tapekit.evaluate.bootstrap_configs``) that says how good the best setting is,
with an interval that accounts for choosing it, and how likely each value of each
hyperparameter is to be in the best configuration.

- **Space** (:data:`SPACE`): learning rate 1e-4, 2e-4, 5e-4 (the RL stage measured 2e-4 as
  good and 5e-4 as harmful at 300 s); temperature 0.5, 1.0; group size 4, 8, 16; KL coefficient
  0 or 0.05 (a k3 KL to the starting policy). 36 configurations; :data:`N_CONFIGS` = 12 of them
  sampled (seed 0) as a balanced design (``sample_configs(..., balanced=True)``: each value of
  a hyperparameter in as many configurations as its other values), each run with
  :data:`SEEDS` = 0, 1, 2: 36 runs.
- **Budget per run**: :data:`STEPS` = 40 GRPO steps of :data:`ROLLOUTS_PER_STEP` = 64 rollouts
  each (``64 / group_size`` problems per step), two optimiser steps per batch, uniform over the
  three levels the student was taught. Counted in rollouts, not seconds, so every configuration
  gets the same compute (up to the KL term's extra forward pass) however busy the machine is.
- **Student**: ``--student DIR`` (a saved tiny model), by default the SFT student of
  ``examples/math_distill.py --quick`` trained into ``OUT/sft`` on first use (as
  ``examples/math_study/sec_study.py sft`` does).
- **Metric**: strict success on the 150 validation problems (greedy), ``val_success``. The test
  split is never drawn. (The validation problems avoid the RL pool's arithmetic, not the SFT
  student's training problems; every configuration starts from the same student, so this
  shifts them all alike.)

One command, resumable (a killed sweep continues where it stopped; ``--retry-failed`` runs
the failed runs again)::

    python examples/grpo_sweep.py --out runs/grpo-sweep

writes ``OUT/sweep.jsonl`` (one row per run), ``OUT/baseline.json`` (the student before RL, with its weights'
SHA-256: a resume from other weights is refused),
``OUT/runs/<config>-s<seed>/`` (each run's ``rl_log.jsonl``), and the analysis:
``OUT/sweep.txt`` and ``OUT/sweep.png`` (``scripts/plot_sweep.py``). ``--quick`` is a mechanics
check: 2 configurations x 1 seed, 2 steps, 30 validation problems, and an untrained tiny model
of the student's shape when no ``--student`` is given.

**Time** (2-core machine, both cores also busy with another RL experiment and its Chromium;
the SFT student of ``math_distill --quick``, trained here in 4.5 minutes, 83 s of them SFT
steps). ``--quick --student OUT/sft/sft-tiny/final``: 2 steps per run at temperature 0.5, where
most groups score alike (zero-advantage share 0.88 and 0.94), 1.2 s per step after the first
run's warm-up (11 s for its 2 steps), 30 validation problems in 0.6-0.7 s. A 6-step run with
signal (temperature 1.0, group 16, KL 0.05; zero-advantage share 0.42): 4.0 s for the first
step, then 1.9-3.0 s (2.4 on average), 150 validation problems in 3.1 s, 23 s in all. So a
full run (40 steps) takes about 1-2 minutes, a configuration (3 seeds) 3-6 minutes, and the 36
runs about 40-70 minutes. (``--quick`` without ``--student``, the test's, measures rollouts
only: an untrained model's groups are all wrong, so no step trains.) Each run's rollout tapes
take about 17 MB (``rollouts.db``); they are deleted after the run unless ``--keep-tapes``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the checkout's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.math_study.problems import Problem, split_problems
from examples.math_study.rl_stage import heldout_eval, math_setup, pool_levels
from examples.math_study.scoring import MAX_LOOPS, tasks_for
from tapekit.evaluate import ConfigBootstrap, Task, bootstrap_configs
from tapekit.training import SweepRow, read_sweep, run_sweep, sample_configs

SPACE: dict[str, list[Any]] = {
    "learning_rate": [1e-4, 2e-4, 5e-4],
    "temperature": [0.5, 1.0],
    "group_size": [4, 8, 16],
    "kl_coef": [0.0, 0.05],
}
N_CONFIGS = 12
SEEDS = (0, 1, 2)
STEPS = 40
ROLLOUTS_PER_STEP = 64
N_TRAIN, N_VAL = 1500, 150
METRIC = "val_success"
QUICK_CONFIGS, QUICK_SEEDS, QUICK_STEPS, QUICK_N_VAL = 2, (0,), 2, 30
"""``--quick``: configurations, seeds, steps per run, validation problems."""

ROOT = Path(__file__).resolve().parents[1]


def run_name(config: dict[str, Any], seed: int) -> str:
    """``lr0.0002-t0.5-g8-kl0.05-s1``: where a run writes, under ``OUT/runs``."""
    return (
        f"lr{config['learning_rate']:g}-t{config['temperature']:g}-g{config['group_size']}"
        f"-kl{config['kl_coef']:g}-s{seed}"
    )


def grpo_run(
    student: Path,
    train: list[Problem],
    val: list[Task],
    out: Path,
    steps: int,
    keep_tapes: bool = False,
    echo: Callable[..., Any] = print,
) -> Callable[[dict[str, Any], int], dict[str, float]]:
    """The sweep's ``run(config, seed)``: GRPO from ``student`` for ``steps`` steps of
    :data:`ROLLOUTS_PER_STEP` rollouts over ``train``, then greedy strict and lenient success on
    ``val``, and what the run cost. The rollout tapes (``rollouts.db``) are deleted after the
    run unless ``keep_tapes``."""

    def run(config: dict[str, Any], seed: int) -> dict[str, float]:
        from tapekit.testing.tiny import load_tiny
        from tapekit.training import CurriculumConfig, GRPOConfig, RLRunConfig, RolloutConfig, train_rl

        where = out / "runs" / run_name(config, seed)
        shutil.rmtree(where, ignore_errors=True)  # a run cut off by a kill starts again
        model, tokenizer = load_tiny(student)
        group = int(config["group_size"])
        rl = RLRunConfig(
            output_dir=str(where),
            run_name="sweep",
            steps=steps,
            checkpoint=False,
            learning_rate=float(config["learning_rate"]),
            seed=seed,
            grpo=GRPOConfig(kl_coef=float(config["kl_coef"]), ppo_epochs=2),
            rollouts=RolloutConfig(
                tasks_per_step=ROLLOUTS_PER_STEP // group,
                group_size=group,
                temperature=float(config["temperature"]),
                max_tokens=48,
                max_loops=MAX_LOOPS,
            ),
            curriculum=CurriculumConfig(kind="uniform"),
        )
        started = time.perf_counter()
        history = train_rl(math_setup(train), model, tokenizer, rl).history
        train_seconds = time.perf_counter() - started
        started = time.perf_counter()
        report = heldout_eval(model, tokenizer, val, "val")
        if not keep_tapes:
            for path in where.glob("rollouts.db*"):
                path.unlink()
        rewards = [r.reward for r in history[-5:] if r.reward is not None]
        metrics = {
            METRIC: report.pass_at_1("strict").value,
            "val_lenient": report.pass_at_1("lenient").value,
            "train_reward_last5": sum(rewards) / len(rewards) if rewards else float("nan"),
            "zero_adv_share": sum(r.zero_adv_share for r in history) / max(len(history), 1),
            "steps": len(history),
            "train_seconds": train_seconds,
            "eval_seconds": time.perf_counter() - started,
        }
        echo(
            f"run {run_name(config, seed)}: " + " ".join(f"{k}={v:.3g}" for k, v in metrics.items()),
            flush=True,
        )
        return metrics

    return run


def untrained_student(path: Path, train: list[Problem]) -> None:
    """A tiny model of the SFT student's shape (``math_distill``'s), untrained, saved to ``path``
    unless it is there: the student of ``--quick``."""
    from examples.math_study.agents import SHORT_SYSTEM
    from tapekit.testing.tiny import TinyConfig, make_tiny

    if not (path / "config.json").is_file():
        texts = [SHORT_SYSTEM, *(p.question for p in train), "calculator: 12+7", "Answer: 19"]
        shape = TinyConfig(
            hidden_size=128, num_layers=2, num_heads=8, intermediate_size=384, whole_numbers=2000
        )
        make_tiny(texts, shape, path)


def sft_path(out: Path) -> Path:
    """Where the default student is: the SFT student of ``math_distill --quick`` in ``OUT/sft``."""
    from examples.math_study import sec_study

    return Path(sec_study.sft_model(out))


def train_sft_student(out: Path) -> None:
    """Train the default student (as ``sec_study sft`` does) unless it is there."""
    from examples.math_study import sec_study

    if not (sft_path(out) / "config.json").is_file():
        sec_study.cmd_sft(out)


def student_fingerprint(student: Path) -> str:
    """SHA-256 over the student's weight files (names and bytes): which model the runs start
    from, whatever its path."""
    digest = hashlib.sha256()
    files = sorted(p for p in student.iterdir() if p.suffix in (".safetensors", ".bin"))
    if not files:
        raise SystemExit(f"{student}: no weights (*.safetensors or *.bin)")
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def baseline(out: Path, student: Path, val: list[Task]) -> dict[str, Any]:
    """The student's validation success before any RL and its weights' fingerprint
    (``OUT/baseline.json``, computed once). A later call with other weights is refused: on a new
    machine the default student is trained again, and SFT on CPU is not bit-reproducible (a
    retrained student scored 0.593 where the first scored 0.547), so resuming would mix runs
    from two starting models in one results file."""
    from tapekit.testing.tiny import load_tiny

    path = out / "baseline.json"
    fingerprint = student_fingerprint(student)
    if path.is_file():
        before = dict(json.loads(path.read_text()))
        if before.get("student_sha256", fingerprint) != fingerprint:
            raise SystemExit(
                f"{student} holds other weights than the student this sweep's runs started from "
                f"(sha256 {fingerprint[:12]}, not {before['student_sha256'][:12]}): use another --out"
            )
        return before
    model, tokenizer = load_tiny(student)
    report = heldout_eval(model, tokenizer, val, "baseline")
    result = {
        METRIC: report.pass_at_1("strict").value,
        "val_lenient": report.pass_at_1("lenient").value,
        "student_sha256": fingerprint,
    }
    path.write_text(json.dumps(result) + "\n")
    return result


def analyse(out: Path, rows: list[SweepRow], n_resamples: int = 10_000) -> ConfigBootstrap:
    """The bootstrap over the sweep's runs; ``OUT/sweep.txt`` and, with matplotlib,
    ``OUT/sweep.png`` (``scripts/plot_sweep.py``)."""
    result = bootstrap_configs(rows, METRIC, n_resamples=n_resamples)
    (out / "sweep.txt").write_text(result.summary())
    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed (the dev extra): no picture")
        return result
    spec = importlib.util.spec_from_file_location("plot_sweep", ROOT / "scripts" / "plot_sweep.py")
    assert spec is not None and spec.loader is not None
    plot_sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_sweep)
    print(f"wrote {plot_sweep.plot(result, out)}")
    return result


def same_settings(out: Path, settings: dict[str, Any]) -> None:
    """Keep ``OUT/settings.json`` (what every run of the sweep shares); a later call with other
    settings (``--quick`` on a full sweep's folder, another student) is refused, so that rows
    of different budgets never mix in one results file."""
    path = out / "settings.json"
    if not path.is_file():
        path.write_text(json.dumps(settings, indent=1) + "\n")
        return
    before = json.loads(path.read_text())
    if before != settings:
        changed = sorted(k for k in {*before, *settings} if before.get(k) != settings.get(k))
        raise SystemExit(
            f"{out} holds a sweep made with other settings ({', '.join(changed)}): use another --out"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the sweep (what is missing of it), then the analysis and the picture."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where sweep.jsonl and the analysis go")
    parser.add_argument(
        "--student", type=Path, help="a saved tiny model (default: the SFT student in OUT/sft)"
    )
    parser.add_argument("--quick", action="store_true", help="2 configurations x 1 seed, 2 steps (mechanics)")
    parser.add_argument("--retry-failed", action="store_true", help="run the failed runs again")
    parser.add_argument("--keep-tapes", action="store_true", help="keep each run's rollout tapes (~17 MB)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is faster on 2 shared cores)"
    )
    args = parser.parse_args(argv)
    import torch  # after parsing: `--help` needs no training stack

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    n_val = QUICK_N_VAL if args.quick else N_VAL
    train, val_problems, _ = split_problems(N_TRAIN, n_val, seed=0, categories=pool_levels(3))
    val = tasks_for(val_problems)
    configs = sample_configs(SPACE, N_CONFIGS, seed=0, balanced=True)
    seeds, steps = list(SEEDS), STEPS
    if args.quick:
        configs, seeds, steps = configs[:QUICK_CONFIGS], list(QUICK_SEEDS), QUICK_STEPS
    student = args.student or (args.out / "untrained-student" if args.quick else sft_path(args.out))
    same_settings(
        args.out,
        {"student": str(student.resolve()), "steps": steps, "rollouts_per_step": ROLLOUTS_PER_STEP,
         "n_train": N_TRAIN, "n_val": n_val, "space": SPACE},
    )  # fmt: skip
    if (args.out / "baseline.json").is_file() and not (student / "config.json").is_file():
        raise SystemExit(
            f"{student}: the student this sweep's runs started from is gone (a new machine?); "
            "a new one would have other weights: use another --out"
        )
    if args.student is None and args.quick:  # made here on first use
        untrained_student(student, train)
    elif args.student is None:
        train_sft_student(args.out)
    before = baseline(args.out, student, val)
    print(f"student {student}: {METRIC}={before[METRIC]:.3f} before RL", flush=True)
    results = args.out / "sweep.jsonl"
    run_sweep(
        grpo_run(student, train, val, args.out, steps, args.keep_tapes),
        configs,
        seeds,
        results,
        retry_failed=args.retry_failed,
        on_row=lambda row: print(f"row: seed={row.seed} {row.seconds:.0f} s error={row.error}", flush=True),
    )
    result = analyse(args.out, read_sweep(results))
    print(result.summary(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
