"""Summarise the web training study's runs: the table, the paired differences, the frontier.

Reads the folders that ``examples/web_agent/study.py --out DIR`` writes (``results.json`` and
``ledger.jsonl`` each) and writes, into ``--out``:

- ``study.json``: one row per run (arm, seed, test and validation success with intervals at the
  last checkpoint, seconds, FLOPs, episodes, tokens, every checkpoint) and the paired
  differences between arms at their last checkpoints: the runs of the same training seed are
  evaluated on the same (task, test seed) pairs, so each pair is an item; items are pooled over
  the seeds both arms ran, and the interval is a task-stratified paired bootstrap
  (``tapekit.evaluate.paired_difference``) with an exact McNemar test beside it;
- ``frontier.png``: success on the test seeds against budget seconds and against FLOPs, one
  line per run through its checkpoints, starting from the untrained student (the ``start``
  evaluation, the same for every arm and seed);
- ``curriculum.png``: for each run with GRPO, the curriculum's task probabilities and the
  share of zero-advantage groups at each step (from the runs' ``rl_log.jsonl``);
- the table in Markdown, on standard output.

Needs matplotlib (``pip install 'tapekit[plots]'``).

    python scripts/plot_web_study.py web-study/*-seed* --out docs/experiments/web-training/study
"""

from __future__ import annotations

import argparse
import json
from itertools import combinations
from pathlib import Path
from typing import Any

from tapekit.evaluate import mcnemar_exact, paired_difference

ARMS = ("sft", "sft_rl", "rl")
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
            out[split] = {k: last[split][k] for k in ("success", "low", "high")}
            out[f"{split}_pairs"] = len(last[split]["per_task"])
    return out


def differences(runs: list[dict[str, Any]], start: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Paired differences of test success between arms (and against the untrained student),
    pooled over the training seeds both ran."""
    finals: dict[str, dict[int, dict[str, float]]] = {}
    for run in runs:
        last = run["points"][-1]
        if "test" in last:
            finals.setdefault(run["settings"]["arm"], {})[run["settings"]["seed"]] = last["test"]["per_task"]
    out = []
    pairs = list(combinations([a for a in ARMS if a in finals], 2))
    pairs = [(b, a) for a, b in pairs]  # later arms first: sft_rl − sft, rl − sft, rl − sft_rl
    if start is not None:
        pairs += [(arm, "base") for arm in ARMS if arm in finals]
    for a, b in pairs:
        xs, ys, items = [], [], []
        per_seed: dict[int, float] = {}
        seeds = sorted(finals[a]) if b == "base" else sorted(set(finals[a]) & set(finals[b]))
        for seed in seeds:
            theirs = start["test"]["per_task"] if b == "base" and start else finals[b][seed]
            shared = [item for item in sorted(finals[a][seed]) if item in theirs]
            xs += [finals[a][seed][item] for item in shared]
            ys += [theirs[item] for item in shared]
            items += shared
            if shared:
                per_seed[seed] = sum(finals[a][seed][i] - theirs[i] for i in shared) / len(shared)
        if not xs:
            continue
        out.append({"a": a, "b": b, "seeds": seeds, **paired(xs, ys, items), "per_seed": per_seed})
    return out


def paired(xs: list[float], ys: list[float], items: list[str]) -> dict[str, Any]:
    """The paired comparison of two systems' binary rewards on the same (task, seed) items:
    the mean difference with its task-stratified bootstrap interval, the items each wins alone,
    and the exact McNemar p-value."""
    est = paired_difference(xs, ys, strata=[_task(item) for item in items], seed=0)
    return {
        "items": len(xs),
        "difference": est.value,
        "low": est.low,
        "high": est.high,
        "a_wins": sum(1 for x, y in zip(xs, ys, strict=True) if x > 0 >= y),
        "b_wins": sum(1 for x, y in zip(xs, ys, strict=True) if y > 0 >= x),
        "mcnemar_p": mcnemar_exact([x > 0 for x in xs], [y > 0 for y in ys]),
    }


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
            f"| untrained | – | {_interval(start.get('test'))} | {_interval(start.get('validation'))} "
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
        "| difference (test success) | seeds | pairs | mean [95 % paired, task-stratified] | "
        "wins / losses | McNemar p | per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in diffs:
        name = "untrained" if d["b"] == "base" else d["b"]
        lines.append(
            f"| {d['a']} − {name} | {','.join(map(str, d['seeds']))} | {d['items']} | "
            f"{d['difference']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | {d['a_wins']} / {d['b_wins']} | "
            f"{d['mcnemar_p']:.3g} | {', '.join(f'{v:+.3f}' for v in d['per_seed'].values())} |"
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
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"start": start, "rows": rows, "differences": diffs, "runs": runs}
    (args.out / "study.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(runs, start, args.out / "frontier.png")
    plot_curriculum(runs, args.out / "curriculum.png")
    print(markdown(rows, diffs, start))


if __name__ == "__main__":
    main()
