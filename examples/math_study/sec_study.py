"""SEC against uniform sampling and the simple tail controls, on an untouched test split.

The question (issue "Results that hold up", finding 2): on a pool with a hard tail, does the
self-evolving curriculum (SEC) give a better student than uniform sampling in uniform's best
setting, or than the simple controls a practitioner would try first? Four arms, each from the
same SFT student, with the same wall-clock training budget (the evaluations excluded):

- ``sec``: SEC over the five levels, 8 tasks x 16 attempts per step, SEC temperature 0.4 (its
  setting chosen on validation in the seventh tuning round, docs/experiments/math-distillation-history.md);
- ``uniform``: uniform over the five levels, 16 tasks x 8 attempts (uniform's better setting);
- ``reachable``: uniform over the levels the SFT student reaches: a level is dropped when the
  student's sampled attempts on :data:`PROBE_PER_LEVEL` of its training problems
  (:data:`PROBE_SAMPLES` each, at the RL temperature) are right less than :data:`REACHABLE`
  of the time (fixed before any run);
- ``resample``: uniform with dynamic sampling (``resample_rounds`` 2: groups whose rewards do
  not differ are replaced by new draws, as in DAPO).

Every arm drops zero-advantage groups from the gradient (the RL loop always does). The rest
is the RL stage's defaults (``examples/math_study/rl_stage.py``: lr 2e-4, 2 optimiser steps per
batch, clip 0.2, no KL, strict reward) at sampling temperature 1.0, as in the tuning rounds on
this pool. Splits (:func:`examples.math_study.problems.split_problems`, five levels, seed 0):
the RL pool is the training split, validation is where the settings were chosen, and the
test split avoids the arithmetic of the RL pool, the validation split and the SFT student's
training problems. Each run is evaluated once on test (greedy, strict and lenient).

Commands (``python -m examples.math_study.sec_study CMD --out DIR``): ``sft`` trains the
student (``examples/math_distill.py --quick``), ``probe`` measures the levels it reaches,
``baseline`` scores the SFT student itself (arm ``sft``: no RL), ``run --arm A --seed N``
makes one run, ``summary`` writes ``summary.json`` (per run, per arm, SEC minus each control
and each RL arm minus ``sft``, paired by problem, the training seed as the unit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from examples.math_study.problems import Splits, split_problems
from examples.math_study.rl_stage import RLStageSettings, heldout_eval, pool_levels, rl_stage
from examples.math_study.scoring import tasks_for

ARMS = ("sec", "uniform", "reachable", "resample")
LEVELS5 = pool_levels(5)
N_TRAIN, N_VAL, N_TEST = 1500, 150, 500
TEMPERATURE = 1.0
SECONDS = 300.0
PROBE_PER_LEVEL, PROBE_SAMPLES, REACHABLE = 40, 8, 0.05
ARM_SETTINGS: dict[str, dict[str, Any]] = {
    "sec": {"curriculum": "sec", "tasks_per_step": 8, "group_size": 16, "sec_temperature": 0.4},
    "uniform": {"curriculum": "uniform", "tasks_per_step": 16, "group_size": 8},
    "reachable": {"curriculum": "uniform", "tasks_per_step": 16, "group_size": 8},
    "resample": {"curriculum": "uniform", "tasks_per_step": 16, "group_size": 8, "resample_rounds": 2},
}


def sft_settings(out: Path) -> Any:
    """The SFT student's settings: ``examples/math_distill.py --quick`` (no RL) into ``out/sft``."""
    from examples import math_distill

    return math_distill.parse_args(["--quick", "--no-rl", "--threads", "1", "--out", str(out / "sft")])


def splits(out: Path) -> Splits:
    """The RL pool, the validation and the test problems (five levels, seed 0)."""
    from examples import math_distill

    sft_train = math_distill.problem_splits(sft_settings(out)).train
    return split_problems(N_TRAIN, N_VAL, N_TEST, seed=0, categories=LEVELS5, test_avoids=sft_train)


def sft_model(out: Path) -> Path:
    """Where the SFT student is saved."""
    return out / "sft" / "sft-tiny" / "final"


def cmd_sft(out: Path) -> None:
    """Train the SFT student (``math_distill --quick``, its validation split only)."""
    from examples import math_distill

    math_distill.run(sft_settings(out))
    print(f"sft student: {sft_model(out)}")


def cmd_probe(out: Path) -> dict[str, Any]:
    """The SFT student's sampled success per level on training problems; the reachable levels."""
    import torch

    from examples.math_study.agents import calculator_environment, make_student
    from examples.math_study.scoring import MAX_LOOPS, SCORERS
    from tapekit import open_store
    from tapekit.evaluate import evaluate
    from tapekit.llm import BatchedTransformersLLM
    from tapekit.testing.tiny import load_tiny

    torch.set_num_threads(1)
    train, _, _ = splits(out)
    probe = [p for level in LEVELS5 for p in [q for q in train if q.category == level][:PROBE_PER_LEVEL]]
    model, tokenizer = load_tiny(sft_model(out))
    model.eval()
    llm = BatchedTransformersLLM.from_model(
        model, tokenizer, model_name="sft-probe", temperature=TEMPERATURE, max_tokens=48
    )
    llm.batcher.max_wait_s = 0.02
    store = open_store(str(out / "probe.db"))
    report = evaluate(
        make_student(llm),
        calculator_environment(),
        tasks_for(probe),
        SCORERS,
        k=PROBE_SAMPLES,
        name="probe",
        store=store,
        max_loops=MAX_LOOPS,
        max_concurrency=64,
    )
    store.close()
    levels = report.by_category()
    success = {c: levels[c].pass_at_1("strict").value for c in LEVELS5}
    result = {
        "per_level": PROBE_PER_LEVEL,
        "samples": PROBE_SAMPLES,
        "temperature": TEMPERATURE,
        "threshold": REACHABLE,
        "success": success,
        "reachable": [c for c in LEVELS5 if success[c] >= REACHABLE],
    }
    (out / "probe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


def run_dir(out: Path, arm: str, seed: int) -> Path:
    """Where one run writes."""
    return out / "runs" / f"{arm}-s{seed}"


def _fresh_run_dir(out: Path, arm: str, seed: int) -> Path:
    """:func:`run_dir`, emptied: a run made again replaces the old one."""
    where = run_dir(out, arm, seed)
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    return where


def cmd_run(out: Path, arm: str, seed: int) -> dict[str, Any]:
    """One run: RL from the SFT student, then the test split once; ``result.json``."""
    import torch

    from tapekit import open_store
    from tapekit.testing.tiny import load_tiny

    if arm not in ARMS:
        raise SystemExit(f"--arm must be one of {ARMS}, got {arm!r}")
    torch.set_num_threads(1)
    train, val, test = splits(out)
    if arm == "reachable":
        probe = json.loads((out / "probe.json").read_text())  # run `probe` first
        if not probe["reachable"]:
            raise SystemExit(f"the probe found no level the SFT student reaches: {probe['success']}")
        train = [p for p in train if p.category in probe["reachable"]]
    where = _fresh_run_dir(out, arm, seed)
    model, tokenizer = load_tiny(sft_model(out))
    settings = RLStageSettings(
        seconds=SECONDS, temperature=TEMPERATURE, seed=seed, out=where / "rl", **ARM_SETTINGS[arm]
    )
    store = open_store(str(where / "tapes.db"))
    started = time.perf_counter()
    result = rl_stage(model, tokenizer, train, tasks_for(val), settings, store)
    test_report = heldout_eval(model, tokenizer, tasks_for(test), f"test-{arm}-{seed}", store)
    store.close()
    record = {
        "arm": arm,
        "seed": seed,
        "settings": {**ARM_SETTINGS[arm], "seconds": SECONDS, "temperature": TEMPERATURE},
        "pool_levels": sorted({p.category for p in train}),
        "steps": len(result.history),
        "rollouts": sum(r.rollouts for r in result.history),
        "train_seconds": sum(r.step_seconds for r in result.history),
        "wall_seconds": time.perf_counter() - started,
        "zero_adv_share": result.zero_adv_groups,
        "val_before": result.before.pass_at_1("strict").model_dump(),
        "val_after": result.after.pass_at_1("strict").model_dump(),
        **_test_fields(test_report),
    }
    (where / "result.json").write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"run arm={arm} seed={seed} steps={record['steps']} zero_adv={record['zero_adv_share']:.2f} "
        f"val={record['val_after']['value']:.3f} test={record['test']['value']:.3f}",
        flush=True,
    )
    return record


def cmd_baseline(out: Path) -> dict[str, Any]:
    """The SFT student without RL (arm ``sft``), greedy on validation and, once, on test: the
    point every RL arm starts from."""
    import torch

    from tapekit import open_store
    from tapekit.testing.tiny import load_tiny

    torch.set_num_threads(1)
    _, val, test = splits(out)
    where = _fresh_run_dir(out, "sft", 0)
    model, tokenizer = load_tiny(sft_model(out))
    store = open_store(str(where / "tapes.db"))
    val_report = heldout_eval(model, tokenizer, tasks_for(val), "val-sft", store)
    test_report = heldout_eval(model, tokenizer, tasks_for(test), "test-sft", store)
    store.close()
    record = {
        "arm": "sft",
        "seed": 0,
        "settings": {},
        "pool_levels": [],
        "steps": 0,
        "rollouts": 0,
        "train_seconds": 0.0,
        "zero_adv_share": None,
        "val_before": val_report.pass_at_1("strict").model_dump(),
        "val_after": val_report.pass_at_1("strict").model_dump(),
        **_test_fields(test_report),
    }
    (where / "result.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"baseline arm=sft val={record['val_after']['value']:.3f} test={record['test']['value']:.3f}")
    return record


def _test_fields(report: Any) -> dict[str, Any]:
    """What a run keeps of its one test evaluation: strict and lenient pass@1, by level, and
    each problem's strict outcome (for the paired comparisons)."""
    return {
        "test": report.pass_at_1("strict").model_dump(),
        "test_lenient": report.pass_at_1("lenient").model_dump(),
        "test_by_level": {c: r.pass_at_1("strict").value for c, r in sorted(report.by_category().items())},
        "test_strict": {
            t: samples[0].scores["strict"].passed for t, samples in sorted(report.by_task().items())
        },
    }


def _per_problem_mean(outcomes: list[dict[str, bool]], ids: list[str]) -> list[float]:
    """Each problem's success averaged over runs (``outcomes``: one ``test_strict`` per run)."""
    return [sum(o[i] for o in outcomes) / len(outcomes) for i in ids]


def cmd_summary(out: Path) -> dict[str, Any]:
    """Every run, each arm's mean over seeds, and SEC minus each control on the test problems,
    the training seed as the unit (``tapekit.evaluate.seed_paired_difference``): the mean over
    seeds of each seed's mean difference, paired by problem, with an item-bootstrap interval
    (problems resampled within levels, the seeds held fixed) and a seed-level Student-t interval
    and p-value (df = seeds - 1; undefined with one seed); per seed, the exact McNemar test
    (within one seed the problems are independent pairs)."""
    from tapekit.evaluate import bootstrap_mean, mcnemar_exact, seed_paired_difference, student_t_interval

    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/result.json"))]
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], []).append(r)
    level_of = {p.id: p.category for p in splits(out).test}
    summary: dict[str, Any] = {"runs": [{k: v for k, v in r.items() if k != "test_strict"} for r in runs]}
    for arm, rs in sorted(by_arm.items()):
        means = _per_problem_mean([r["test_strict"] for r in rs], sorted(rs[0]["test_strict"]))
        per_seed = [r["test"]["value"] for r in rs]
        summary.setdefault("arms", {})[arm] = {
            "seeds": sorted(r["seed"] for r in rs),
            "test": bootstrap_mean(means).model_dump(),
            "test_seeds": student_t_interval(per_seed).model_dump() if len(rs) > 1 else None,
            "zero_adv_share": None if arm == "sft" else sum(r["zero_adv_share"] for r in rs) / len(rs),
            "steps": sum(r["steps"] for r in rs) / len(rs),
        }
    comparisons = {}
    pairs = [("sec", c) for c in ("uniform", "reachable", "resample")] + [(a, "sft") for a in ARMS]
    for first, second in pairs:
        if first not in by_arm or second not in by_arm:
            continue
        a_runs = {r["seed"]: r["test_strict"] for r in by_arm[first]}
        b_runs = {r["seed"]: r["test_strict"] for r in by_arm[second]}
        if second == "sft":  # one SFT student: every seed of an RL arm started from it
            b_runs = dict.fromkeys(a_runs, next(iter(b_runs.values())))
        seeds = sorted(a_runs.keys() & b_runs.keys())
        ids = sorted(a_runs[seeds[0]])
        scored = {s: {i: (float(a_runs[s][i]), float(b_runs[s][i])) for i in ids} for s in seeds}
        d = seed_paired_difference(scored, strata=level_of)
        comparisons[f"{first}-{second}"] = {
            "seeds": seeds,
            "difference": d.item_interval().model_dump(),
            "seed_level": {"low": d.seed_low, "high": d.seed_high, "p": d.seed_p, "df": d.df},
            "per_seed": {
                str(s): {
                    "difference": d.per_seed[str(s)],
                    "mcnemar_p": mcnemar_exact([a_runs[s][i] for i in ids], [b_runs[s][i] for i in ids]),
                }
                for s in seeds
            },
        }
    summary["comparisons"] = comparisons
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({"arms": summary.get("arms"), "comparisons": comparisons}, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    """``sft``, ``probe``, ``baseline``, ``run --arm A --seed N`` or ``summary``, all with ``--out DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["sft", "probe", "baseline", "run", "summary"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arm", choices=ARMS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "sft":
        cmd_sft(args.out)
    elif args.command == "probe":
        cmd_probe(args.out)
    elif args.command == "baseline":
        cmd_baseline(args.out)
    elif args.command == "run":
        if args.arm is None:
            parser.error("run needs --arm")
        cmd_run(args.out, args.arm, args.seed)
    else:
        cmd_summary(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
