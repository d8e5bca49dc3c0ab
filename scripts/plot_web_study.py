"""Summarise the web training study's runs: the table, the paired differences, the frontier.

Reads the folders that ``examples/web_agent/study.py --out DIR`` writes (``results.json`` and
``ledger.jsonl`` each) and writes, into ``--out``:

- ``study.json``: one row per run (arm, seed, test and validation success with intervals at the
  last checkpoint, seconds, FLOPs, episodes, tokens, every checkpoint) and the paired
  differences between arms at their last checkpoints, the **training seed as the unit**
  (``tapekit.evaluate.seed_paired_difference``): the runs of the same training seed are
  evaluated on the same (task, test seed) pairs, so each pair is an item of that seed; the
  estimate is the mean over seeds of each seed's mean difference, with an item-bootstrap
  interval (items resampled within tasks, the seeds held fixed) and a seed-level Student-t
  interval and p-value (df = seeds − 1). The exact McNemar p-value over the pooled pairs is kept
  in the JSON only, as ``mcnemar_p`` with ``mcnemar_note``: it pools the seeds' pairs as if
  independent and ignores the seeds' variance;
- ``table.md``: the runs and the differences (also printed), and ``per_task.md``: each arm's
  test success per task, and each difference between arms per task and without each task;
- ``frontier.png``: success on the test seeds against budget seconds and against FLOPs, one
  line per run through its checkpoints, starting from the untrained student (the ``start``
  evaluation, the same for every arm and seed);
- ``curriculum.png``: for each run with GRPO, the curriculum's task probabilities and the
  share of zero-advantage groups at each step (from the runs' ``rl_log.jsonl``).

Needs matplotlib (``pip install 'tapekit[plots]'``).

    python scripts/plot_web_study.py web-study/*-seed* --out docs/experiments/web-training/study
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from functools import partial
from itertools import combinations
from pathlib import Path
from typing import Any

from tapekit.evaluate import bootstrap_mean, mcnemar_exact, seed_paired_difference

ARMS = ("sft", "sft_rl", "rl")
MCNEMAR_NOTE = "pooled over training seeds: treats the seeds' pairs as independent, ignores seed variance"
COLOURS = {"sft": "tab:blue", "sft_rl": "tab:purple", "rl": "tab:orange", "base": "tab:grey"}


def load_runs(folders: list[Path]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Each run's settings and checkpoints, and the untrained student's evaluation (if any run
    made one). Raises ``SystemExit`` with the folder's name when a run has no results."""
    runs, start = [], None
    for folder in folders:
        path = folder / "results.json"
        if not path.is_file():
            raise SystemExit(f"{folder}: no results.json (is it a study.py --out folder?)")
        data = json.loads(path.read_text())
        points = data["checkpoints"]
        for p in points:
            if p["label"] == "start" and "test" in p:
                start = start or p
        trained = [p for p in points if p["label"] != "start"]
        if not trained:
            continue
        runs.append({"folder": str(folder), "settings": data["settings"], "points": trained})
    runs.sort(key=lambda r: (ARMS.index(r["settings"]["arm"]), r["settings"]["seed"]))
    return runs, start


def _task(item: str) -> str:
    """``click-button/200003`` → ``click-button`` (the stratum of a (task, seed) pair)."""
    return item.rsplit("/", 1)[0]


def _in_task(task: str, inside: bool, item: str) -> bool:
    """Whether ``item`` is of ``task`` (``inside``) or of another task (not ``inside``)."""
    return (_task(item) == task) == inside


def row(run: dict[str, Any]) -> dict[str, Any]:
    """The run's line of the table: its last checkpoint."""
    last, s = run["points"][-1], run["settings"]
    out = {
        "arm": s["arm"],
        "seed": s["seed"],
        "budget_seconds": s["budget_seconds"],
        "seconds": last["seconds"],
        "flops": last["flops"],
        "episodes": last["episodes"],
        "trained_tokens": last["trained_tokens"],
        "rollout_tokens": last["rollout_tokens"],
    }
    for split in ("test", "validation"):
        if split in last:
            out[split] = success(last[split])
            out[f"{split}_pairs"] = len(last[split]["per_task"])
    return out


def success(split: dict[str, Any] | None) -> dict[str, Any] | None:
    """A split's success with its 95 % interval, recomputed from the per-item rewards
    (``tapekit.evaluate.bootstrap_mean``, 10,000 resamples; exact at 0/n and n/n), or as the run
    recorded it when it kept no per-item rewards."""
    if not split:
        return None
    items = split.get("per_task")
    if not items:
        return {k: split[k] for k in ("success", "low", "high")}
    est = bootstrap_mean([float(v) for v in items.values()])
    return {"success": est.value, "low": est.low, "high": est.high}


def _finals(runs: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, float]]]:
    """Each arm's per-item test rewards at its last checkpoint, by training seed."""
    finals: dict[str, dict[int, dict[str, float]]] = {}
    for run in runs:
        last = run["points"][-1]
        if "test" in last:
            finals.setdefault(run["settings"]["arm"], {})[run["settings"]["seed"]] = last["test"]["per_task"]
    return finals


def _arm_pairs(finals: dict[str, Any], start: dict[str, Any] | None) -> list[tuple[str, str]]:
    pairs = list(combinations([a for a in ARMS if a in finals], 2))
    pairs = [(b, a) for a, b in pairs]  # later arms first: sft_rl − sft, rl − sft, rl − sft_rl
    if start is not None:
        pairs += [(arm, "base") for arm in ARMS if arm in finals]
    return pairs


def _seed_scores(
    finals: dict[str, dict[int, dict[str, float]]], start: dict[str, Any] | None, a: str, b: str
) -> dict[int, tuple[dict[str, float], dict[str, float]]]:
    """Per training seed both ran, arm ``a``'s and arm ``b``'s per-item rewards (``b`` =
    ``"base"``: the one untrained evaluation, the same for every seed)."""
    if b == "base":
        base = start["test"]["per_task"] if start else {}
        return {seed: (finals[a][seed], base) for seed in sorted(finals[a])}
    return {seed: (finals[a][seed], finals[b][seed]) for seed in sorted(set(finals[a]) & set(finals[b]))}


def differences(runs: list[dict[str, Any]], start: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Paired differences of test success between arms (and against the untrained student),
    the training seed as the unit."""
    finals = _finals(runs)
    out = []
    for a, b in _arm_pairs(finals, start):
        scores = _seed_scores(finals, start, a, b)
        if not any(set(x) & set(y) for x, y in scores.values()):
            continue
        out.append({"a": a, "b": b, **seed_difference(scores)})
    return out


def seed_difference(
    scores: dict[int, tuple[dict[str, float], dict[str, float]]], keep: Callable[[str], bool] | None = None
) -> dict[str, Any]:
    """The paired comparison of two arms over training seeds: per seed, both arms' binary
    rewards on the (task, test seed) items both were scored on (``keep(item)``: which items
    count; all by default). The estimate is the mean over seeds of the seeds' mean differences
    (``tapekit.evaluate.seed_paired_difference``) with its item-bootstrap interval (items
    resampled within tasks) and its seed-level t interval and p-value; then the pairs each arm
    wins alone (over all seeds) and the pooled McNemar p-value, labelled as ignoring the seeds'
    variance. A seed with no shared item is left out."""
    pairs = {
        seed: {i: (a[i], b[i]) for i in sorted(a) if i in b and (keep is None or keep(i))}
        for seed, (a, b) in scores.items()
    }
    pairs = {seed: items for seed, items in pairs.items() if items}
    est = seed_paired_difference(pairs, strata=lambda item: _task(str(item)), seed=0)
    xs = [x for items in pairs.values() for x, _ in items.values()]
    ys = [y for items in pairs.values() for _, y in items.values()]
    return {
        "seeds": sorted(pairs),
        "items": est.n_pairs,
        "distinct_items": est.n_items,
        "difference": est.value,
        "low": est.item_low,
        "high": est.item_high,
        "seed_low": est.seed_low,
        "seed_high": est.seed_high,
        "seed_p": est.seed_p,
        "a_wins": sum(1 for x, y in zip(xs, ys, strict=True) if x > 0 >= y),
        "b_wins": sum(1 for x, y in zip(xs, ys, strict=True) if y > 0 >= x),
        "mcnemar_p": mcnemar_exact([x > 0 for x in xs], [y > 0 for y in ys]),
        "mcnemar_note": MCNEMAR_NOTE,
        "per_seed": {seed: est.per_seed[str(seed)] for seed in pairs},
    }


def per_task(runs: list[dict[str, Any]], start: dict[str, Any] | None) -> dict[str, Any]:
    """Each arm's test success per task (mean over seeds of each seed's success on the task,
    and the seeds' values), and each difference between arms on each task alone and on all
    tasks but it."""
    finals = _finals(runs)
    tasks = sorted({_task(i) for arm in finals.values() for items in arm.values() for i in items})
    success: dict[str, dict[str, Any]] = {}
    arms = ([("untrained", {0: start["test"]["per_task"]})] if start else []) + [
        (a, finals[a]) for a in ARMS if a in finals
    ]
    for name, by_seed in arms:
        for task in tasks:
            per_seed = {}
            for seed, items in sorted(by_seed.items()):
                mine = [v for i, v in items.items() if _task(i) == task]
                if mine:
                    per_seed[seed] = sum(mine) / len(mine)
            if per_seed:
                success.setdefault(name, {})[task] = {
                    "mean": sum(per_seed.values()) / len(per_seed),
                    "per_seed": per_seed,
                }
    diffs = []
    for a, b in _arm_pairs(finals, None):
        scores = _seed_scores(finals, start, a, b)
        for task in tasks:
            only, others = partial(_in_task, task, True), partial(_in_task, task, False)
            for scope, keep in ((task, only), (f"all but {task}", others)):
                diffs.append({"a": a, "b": b, "scope": scope, **seed_difference(scores, keep)})
    return {"tasks": tasks, "success": success, "differences": diffs}


def _signed(d: dict[str, Any], low: str, high: str) -> str:
    if d.get(low) is None:
        return "undefined (one seed)"
    return f"[{_f(d[low])}, {_f(d[high])}]"


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.2g}"


def _f(value: float) -> str:
    """``+0.123``; a sum that cancels to within rounding prints ``+0.000``, not ``-0.000``, and
    a mean that is a half in the fourth decimal up to float error (−0.1375 computed as
    −0.13749999…) rounds away from zero, as the per-seed figures it averages do."""
    if abs(value) < 1e-12:
        return "+0.000"
    return f"{value + math.copysign(1e-12, value):+.3f}"


def _columns(d: dict[str, Any]) -> str:
    """A difference's columns: the mean with its item interval, the seed interval, the seed
    p-value, the pairs each arm wins alone and the per-seed means."""
    per_seed = ", ".join(_f(v) for v in d["per_seed"].values())
    seeds = _signed(d, "seed_low", "seed_high")
    return (
        f"{_f(d['difference'])} [{_f(d['low'])}, {_f(d['high'])}] | {seeds} | "
        f"{_p(d['seed_p'])} | {d['a_wins']} / {d['b_wins']} | {per_seed} |"
    )


def _interval(d: dict[str, Any] | None) -> str:
    return f"{d['success']:.3f} [{d['low']:.2f}, {d['high']:.2f}]" if d else "–"


def markdown(rows: list[dict[str, Any]], diffs: list[dict[str, Any]], start: dict[str, Any] | None) -> str:
    """The table and the differences, as the experiments page shows them."""
    lines = [
        "| arm | seed | test success [95 %] | validation | budget s used | FLOPs | episodes | "
        "trained tokens | rollout tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if start:
        lines.append(
            f"| untrained | – | {_interval(success(start.get('test')))} | "
            f"{_interval(success(start.get('validation')))} "
            "| 0 | 0 | 0 | 0 | 0 |"
        )
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['seed']} | {_interval(r.get('test'))} | {_interval(r.get('validation'))} | "
            f"{r['seconds']:.0f} | {r['flops']:.2e} | {r['episodes']} | {r['trained_tokens']:,} | "
            f"{r['rollout_tokens']:,} |"
        )
    lines += [
        "",
        "| difference (test success) | seeds | pairs | mean over seeds [95 % items, task-stratified] | "
        "95 % seeds (t, df = seeds − 1) | seed p | wins / losses | per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in diffs:
        name = "untrained" if d["b"] == "base" else d["b"]
        lines.append(f"| {d['a']} − {name} | {','.join(map(str, d['seeds']))} | {d['items']} | {_columns(d)}")
    return "\n".join(lines)


def per_task_markdown(data: dict[str, Any]) -> str:
    """The per-task tables: success per arm and task, the differences per task and without it."""
    tasks = data["tasks"]
    lines = [
        "| arm | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for arm, by_task in data["success"].items():
        cells = []
        for task in tasks:
            cell = by_task.get(task)
            if cell is None:
                cells.append("–")
                continue
            seeds = ", ".join(f"{v:.2f}" for v in cell["per_seed"].values())
            cells.append(
                f"{cell['mean']:.3f} ({seeds})" if len(cell["per_seed"]) > 1 else f"{cell['mean']:.3f}"
            )
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| difference | items | seeds | pairs | mean over seeds [95 % items] | 95 % seeds (t) | seed p | "
        "wins / losses | per seed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in data["differences"]:
        lines.append(
            f"| {d['a']} − {d['b']} | {d['scope']} | {len(d['seeds'])} | {d['items']} | {_columns(d)}"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], start: dict[str, Any] | None, picture: Path) -> None:
    """Test success against seconds and FLOPs, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    seen: set[str] = set()
    for run in runs:
        arm = run["settings"]["arm"]
        points = [p for p in run["points"] if "test" in p]
        if start:
            points = [start, *points]
        for ax, key in zip(axes, ("seconds", "flops"), strict=True):
            ax.plot(
                [p[key] for p in points],
                [p["test"]["success"] for p in points],
                marker="o",
                color=COLOURS[arm],
                alpha=0.75,
                label=arm if arm not in seen and key == "seconds" else None,
            )
        seen.add(arm)
    if start:
        for ax in axes:
            ax.axhline(start["test"]["success"], color=COLOURS["base"], ls=":", lw=1)
    axes[0].set_xlabel("budget spent (wall seconds on 2 CPU cores, teacher and browser included)")
    axes[1].set_xlabel("FLOPs (6N per trained token, 2N per rollout token)")
    axes[0].set_ylabel("success on the test (task, seed) pairs")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("SmolLM2-135M on MiniWob++: one line per run (arm, training seed)", fontsize=10)
    fig.tight_layout()
    picture.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(picture, dpi=110)


def rl_logs(folder: Path) -> list[dict[str, Any]]:
    """A run's GRPO step records, in order: one ``rl_log.jsonl`` per GRPO run of the arm, under
    ``rl*/`` as study.py writes them, or beside ``results.json`` as the docs keep a run's logs."""
    records: list[dict[str, Any]] = []
    for log in sorted([*folder.glob("rl*/rl_log.jsonl"), *folder.glob("rl_log.jsonl")]):
        records += [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return records


def plot_curriculum(runs: list[dict[str, Any]], picture: Path) -> bool:
    """Task probabilities and zero-advantage share per GRPO step, one panel per run; ``False``
    when no run has GRPO steps."""
    logged = [(r, rl_logs(Path(r["folder"]))) for r in runs]
    logged = [(r, recs) for r, recs in logged if recs]
    if not logged:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(logged), figsize=(3.6 * len(logged), 3.4), sharey=True, squeeze=False)
    for ax, (run, records) in zip(axes[0], logged, strict=True):
        tasks = sorted({t for rec in records for t in rec.get("sampler_probs", {})})
        steps = list(range(len(records)))
        for task in tasks:
            ax.plot(
                steps, [rec.get("sampler_probs", {}).get(task, float("nan")) for rec in records], label=task
            )
        ax.plot(steps, [rec["zero_adv_share"] for rec in records], "k:", label="zero-advantage share")
        s = run["settings"]
        ax.set_title(f"{s['arm']} seed {s['seed']} ({s.get('curriculum', '?')})", fontsize=9)
        ax.set_xlabel("GRPO step")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("probability / share")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(picture, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="study.py --out folders")
    parser.add_argument("--out", type=Path, required=True, help="folder for study.json and frontier.png")
    args = parser.parse_args()
    runs, start = load_runs(args.runs)
    if not runs:
        raise SystemExit("no run has a checkpoint after the start")
    rows = [row(r) for r in runs]
    diffs = differences(runs, start)
    tasks = per_task(runs, start)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"start": start, "rows": rows, "differences": diffs, "per_task": tasks, "runs": runs}
    (args.out / "study.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(runs, start, args.out / "frontier.png")
    plot_curriculum(runs, args.out / "curriculum.png")
    table = markdown(rows, diffs, start)
    (args.out / "table.md").write_text(table + "\n")
    (args.out / "per_task.md").write_text(per_task_markdown(tasks) + "\n")
    print(table)


if __name__ == "__main__":
    main()
