"""SEC against uniform sampling and against dynamic sampling, from one SFT student per seed.

Reads the runs of the curricula comparison in ``docs/experiments/web-training.md`` (section
"Curricula over tasks"): per training seed ``s``, ``sft-seed{s}`` (the SFT student, the branch
point) and ``{uniform,dynamic,sec}-seed{s}`` (``study.py --arm sft_rl --branch-from`` it, one
curriculum each, the same budget). Writes into ``--out``:

- ``curricula.json``: one row per run (test success at the branch point and at the end of
  GRPO, GRPO steps, rollouts, groups with a signal, seconds) and the paired differences of test
  success between the curricula, and of each against the branch point, over the seeds both ran
  with the **training seed as the unit** (``tapekit.evaluate.seed_paired_difference``: the mean
  over seeds of each seed's mean difference, an item-bootstrap interval within tasks and a
  seed-level Student-t interval and p-value; the pooled McNemar p-value stays in the JSON only,
  labelled as ignoring the seeds' variance);
- ``curricula.png``: per run, the curriculum's task probabilities and the share of
  zero-advantage groups at each GRPO step; below, groups with a signal (rewards that differ)
  gathered against GRPO seconds, one line per run;
- ``table.md``: the table in Markdown (also printed).

    python scripts/plot_web_curricula.py docs/experiments/web-training/curricula \
        --out docs/experiments/web-training/curricula
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from plot_web_study import _columns, rl_logs, seed_difference, success  # scripts/: the study's

CURRICULA = ("uniform", "dynamic", "sec")
COLOURS = {"uniform": "tab:grey", "dynamic": "tab:green", "sec": "tab:purple"}


def _read(folder: Path) -> dict[str, Any]:
    path = folder / "results.json"
    if not path.is_file():
        raise SystemExit(f"{folder}: no results.json (is it a study.py --out folder?)")
    return dict(json.loads(path.read_text()))


def live_groups(record: dict[str, Any]) -> int:
    """Groups of a step whose rewards differed (the ones that give GRPO a gradient; a step
    that scored no rollout logs a zero-advantage share of 1.0)."""
    return round(record["groups"] * (1.0 - record["zero_adv_share"]))


def load(root: Path) -> list[dict[str, Any]]:
    """Every finished curriculum run under ``root`` with its branch point and GRPO log."""
    runs = []
    for curriculum in CURRICULA:
        for folder in sorted(root.glob(f"{curriculum}-seed*")):
            if not folder.is_dir() or not (folder / "results.json").is_file():
                continue
            data = _read(folder)
            points = data["checkpoints"]
            if len(points) < 2 or "test" not in points[-1]:
                continue  # a run that did not reach its final evaluation
            records = rl_logs(folder)
            runs.append(
                {
                    "curriculum": curriculum,
                    "seed": data["settings"]["seed"],
                    "folder": str(folder),
                    "branch": points[0]["test"],
                    "final": points[-1]["test"],
                    "records": records,
                    "settings": data["settings"],
                    "seconds": points[-1]["seconds"] - points[0]["seconds"],
                }
            )
    return runs


def row(run: dict[str, Any]) -> dict[str, Any]:
    records = run["records"]
    final = success(run["final"]) or {}
    live = [live_groups(r) for r in records]
    groups = sum(r["groups"] for r in records)
    return {
        "curriculum": run["curriculum"],
        "seed": run["seed"],
        "branch_test": run["branch"]["success"],
        "test": final["success"],
        "test_low": final["low"],
        "test_high": final["high"],
        "test_pairs": len(run["final"]["per_task"]),
        "grpo_steps": len(records),
        "rollouts": sum(r["rollouts"] for r in records),
        "environment_failures": sum(r.get("environment_failures", 0) for r in records),
        "groups": groups,
        "live_groups": sum(live),
        "live_share": sum(live) / groups if groups else None,
        "rollout_reward": [r["reward_mean"] for r in records],
        "grpo_seconds": round(run["seconds"], 1),
        "rollout_seconds": round(sum(r["rollout_seconds"] for r in records), 1),
        "drawn": _drawn(records),
    }


def _drawn(records: list[dict[str, Any]]) -> dict[str, int]:
    """Groups drawn per MiniWob++ task over the run."""
    out: dict[str, int] = {}
    for r in records:
        for task, n in r.get("categories", {}).items():
            out[task] = out.get(task, 0) + n
    return dict(sorted(out.items()))


def difference(pairs: list[tuple[dict[str, float], dict[str, float]]], seeds: list[int]) -> dict[str, Any]:
    """Paired difference a − b over the (task, test seed) items of each seed's pair of runs,
    the training seed as the unit (``plot_web_study.seed_difference``)."""
    return seed_difference(dict(zip(seeds, pairs, strict=True)))


def differences(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["curriculum"], r["seed"]): r for r in runs}
    out = []
    for curriculum in CURRICULA:  # each against its own branch point (the SFT student)
        seeds = sorted(s for c, s in by if c == curriculum)
        if seeds:
            pairs = [
                (by[curriculum, s]["final"]["per_task"], by[curriculum, s]["branch"]["per_task"])
                for s in seeds
            ]
            out.append({"a": curriculum, "b": "sft student", **difference(pairs, seeds)})
    for a, b in (("sec", "uniform"), ("dynamic", "uniform"), ("sec", "dynamic")):
        seeds = sorted(s for c, s in by if c == a and (b, s) in by)
        if seeds:
            pairs = [(by[a, s]["final"]["per_task"], by[b, s]["final"]["per_task"]) for s in seeds]
            out.append({"a": a, "b": b, **difference(pairs, seeds)})
    return out


def markdown(rows: list[dict[str, Any]], diffs: list[dict[str, Any]]) -> str:
    lines = [
        "| curriculum | seed | test at branch | test after GRPO | GRPO steps | rollouts "
        "| groups with a signal / groups | GRPO s | groups drawn per task |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["seed"], CURRICULA.index(r["curriculum"]))):
        drawn = ", ".join(f"{t.removeprefix('click-')} {n}" for t, n in r["drawn"].items())
        lines.append(
            f"| {r['curriculum']} | {r['seed']} | {r['branch_test']:.3f} | {r['test']:.3f} "
            f"[{r['test_low']:.3f}, {r['test_high']:.3f}] | {r['grpo_steps']} | {r['rollouts']} | "
            f"{r['live_groups']} / {r['groups']} | {r['grpo_seconds']:.0f} | {drawn} |"
        )
    lines += [
        "",
        "| difference | seeds | pairs | mean over seeds [95 % items, task-stratified] "
        "| 95 % seeds (t, df = seeds − 1) | seed p | wins / losses | per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in diffs:
        lines.append(f"| {d['a']} − {d['b']} | {len(d['seeds'])} | {d['items']} | {_columns(d)}")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], picture: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({r["seed"] for r in runs})
    by = {(r["curriculum"], r["seed"]): r for r in runs}
    fig, axes = plt.subplots(
        len(seeds) + 1, len(CURRICULA), figsize=(3.7 * len(CURRICULA), 2.7 * (len(seeds) + 1)), squeeze=False
    )
    tasks = sorted({t for r in runs for rec in r["records"] for t in rec.get("sampler_probs", {})})
    for i, seed in enumerate(seeds):
        for j, curriculum in enumerate(CURRICULA):
            ax = axes[i][j]
            run = by.get((curriculum, seed))
            if run is None:
                ax.set_axis_off()
                continue
            steps = list(range(len(run["records"])))
            for task in tasks:
                probs = [rec.get("sampler_probs", {}).get(task, float("nan")) for rec in run["records"]]
                ax.plot(steps, probs, label=task.removeprefix("click-"))
            ax.plot(
                steps, [rec["zero_adv_share"] for rec in run["records"]], "k:", label="zero-advantage share"
            )
            ax.set_title(f"{curriculum}, seed {seed}", fontsize=9)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("probability / share")
    drawn = [ax for ax in axes[0] if ax.get_legend_handles_labels()[0]]
    if drawn:
        drawn[-1].legend(fontsize=7, loc="upper right")
    for j, curriculum in enumerate(CURRICULA):
        ax = axes[-1][j]
        for seed in seeds:
            run = by.get((curriculum, seed))
            if run is None:
                continue
            seconds, live, t, n = [0.0], [0], 0.0, 0
            for rec in run["records"]:
                t += rec["step_seconds"]
                n += live_groups(rec)
                seconds.append(t)
                live.append(n)
            style = ("-", "--", "-.", ":")[seeds.index(seed) % 4]
            ax.plot(seconds, live, style, color=COLOURS[curriculum], label=f"seed {seed}")
        ax.set_title(f"{curriculum}: groups with a signal", fontsize=9)
        ax.set_xlabel("GRPO seconds")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[-1][0].set_ylabel("cumulative groups")
    fig.tight_layout()
    fig.savefig(picture, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", type=Path, help="the folder holding sft-seed*/ and <curriculum>-seed*/ runs")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    runs = load(a.root)
    if not runs:
        raise SystemExit(f"{a.root}: no finished curriculum runs ({', '.join(CURRICULA)}-seed*)")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [row(r) for r in runs]
    diffs = differences(runs)
    (a.out / "curricula.json").write_text(json.dumps({"runs": rows, "differences": diffs}, indent=1) + "\n")
    plot(runs, a.out / "curricula.png")
    table = markdown(rows, diffs)
    (a.out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
