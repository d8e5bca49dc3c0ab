"""Pictures and a table of the math SEC study, from its runs' logs (what
``python -m examples.math_study.sec_study`` writes under ``--out``: ``runs/<arm>-s<seed>/``
with ``result.json`` and ``rl/rl_log.jsonl``, and ``summary.json``).

    python scripts/plot_math_sec.py STUDY_DIR --out docs/experiments/math-sec

- ``draws.png``: one panel per arm, the share of each step's drawn problems per level over the
  training steps (redraws included), averaged over the seeds and over the last 5 steps (for
  SEC, what its arm probabilities did);
- ``zero_adv.png``: the share of zero-advantage groups per step, per arm (mean over seeds),
  and each run's test success with its 95 % interval (the SFT student's as a dashed line);
- ``table.md``: every run (``sft``: the SFT student, no RL), each arm's mean over seeds, SEC
  minus each control and each RL arm minus the SFT student, the training seed as the unit
  (``summary.json``, from ``sec_study summary``: the mean over seeds of each seed's mean
  difference with its item-bootstrap interval, problems resampled within levels, and beside it
  the seed-level Student-t interval and p-value, df = seeds − 1; per seed, the McNemar test of
  that seed's pairs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ARMS = ["sft", "sec", "uniform", "reachable", "resample"]
LEVELS = ["level1", "level2", "level3", "level4", "level5"]
SMOOTH = 5  # the curves are means over the last 5 steps (each step draws 8 or 16 problems)


def load(study: Path) -> dict[str, Any]:
    """Every run's result and step log, and the summary."""
    results = sorted((study / "runs").glob("*/result.json"))
    if not results:
        raise SystemExit(f"{study} has no runs/*/result.json: not a sec_study --out folder")
    runs = []
    for path in results:
        run = json.loads(path.read_text())
        log = path.parent / "rl" / "rl_log.jsonl"
        run["log"] = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
        runs.append(run)
    summary_path = study / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return {"runs": runs, "summary": summary}


def _pct(e: dict[str, float]) -> str:
    return f"{100 * e['value']:.1f} [{100 * e['low']:.1f}, {100 * e['high']:.1f}]"


def _seed_pct(e: dict[str, Any] | None) -> str:
    """A seed-level interval in points, or why there is none."""
    if e is None or e.get("low") is None:
        return "undefined (one seed)"
    return f"[{100 * e['low']:.1f}, {100 * e['high']:.1f}]"


def _mcnemar(p: float) -> str:
    return "< 0.01" if p < 0.01 else f"{p:.2f}"


def _signed_points(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "undefined (one seed)"
    return f"[{100 * low:+.1f}, {100 * high:+.1f}]"


def table(data: dict[str, Any]) -> str:
    """Markdown: the runs, the arms over seeds and the paired comparisons."""
    lines = [
        "| arm | seed | pool | steps | rollouts | zero-adv groups | validation before → after |"
        " test strict [95 %] | test by level (1 / 2 / 3 / 4 / 5) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {a: i for i, a in enumerate(ARMS)}
    for r in sorted(data["runs"], key=lambda r: (order.get(r["arm"], 99), r["seed"])):
        levels = " / ".join(f"{100 * r['test_by_level'].get(c, float('nan')):.0f}" for c in LEVELS)
        pool = ",".join(c.removeprefix("level") for c in r["pool_levels"]) or "–"
        zero = "–" if r["zero_adv_share"] is None else f"{r['zero_adv_share']:.2f}"
        lines.append(
            f"| {r['arm']} | {r['seed']} | {pool} | {r['steps']} | {r['rollouts']} | "
            f"{zero} | {100 * r['val_before']['value']:.1f} → "
            f"{100 * r['val_after']['value']:.1f} | {_pct(r['test'])} | {levels} |"
        )
    arms = data["summary"].get("arms", {})
    if arms:
        lines += [
            "",
            "| arm | seeds | test strict, mean over seeds [95 % problems] | 95 % seeds (t) "
            "| zero-adv groups | steps |",
            "|---|---|---|---|---|---|",
        ]
        for arm in sorted(arms, key=lambda a: order.get(a, 99)):
            a = arms[arm]
            zero = "–" if a["zero_adv_share"] is None else f"{a['zero_adv_share']:.2f}"
            lines.append(
                f"| {'sft (no RL)' if arm == 'sft' else arm} | {len(a['seeds'])} | {_pct(a['test'])} | "
                f"{_seed_pct(a.get('test_seeds'))} "
                f"| {zero} | {a['steps']:.0f} |"
            )
    comparisons = data["summary"].get("comparisons", {})
    if comparisons:
        lines += [
            "",
            "| comparison | seeds | difference, points: mean over seeds [95 % problems, by level] "
            "| 95 % seeds (t, df = seeds − 1) | seed p | per seed (McNemar p of the seed's pairs) |",
            "|---|---|---|---|---|---|",
        ]
        for name, c in comparisons.items():
            per_seed = ", ".join(
                f"{100 * v['difference']:+.1f} (p {_mcnemar(v['mcnemar_p'])})"
                for _, v in sorted(c["per_seed"].items())
            )
            d, seeds = c["difference"], c.get("seed_level", {})
            p = seeds.get("p")
            lines.append(
                f"| {name.replace('-', ' − ')} | {len(c['seeds'])} | "
                f"{100 * d['value']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] | "
                f"{_signed_points(seeds.get('low'), seeds.get('high'))} | "
                f"{'–' if p is None else f'{p:.2g}'} | {per_seed} |"
            )
    return "\n".join(lines) + "\n"


def _mean_curves(runs: list[dict[str, Any]], value: Any, window: int = 1) -> list[float]:
    """The per-step mean over ``runs`` of ``value(record)``, up to the shortest run, averaged
    over the last ``window`` steps (fewer at the start)."""
    n = min(len(r["log"]) for r in runs)
    means = [sum(value(r["log"][i]) for r in runs) / len(runs) for i in range(n)]
    windows = [means[max(0, i - window + 1) : i + 1] for i in range(n)]
    return [sum(w) / len(w) for w in windows]


def plot(data: dict[str, Any], out: Path) -> None:
    """``draws.png`` and ``zero_adv.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in data["runs"]:
        if r["log"]:
            by_arm.setdefault(r["arm"], []).append(r)
    arms = [a for a in ARMS if a in by_arm]
    fig, axes = plt.subplots(1, len(arms), figsize=(3.4 * len(arms), 3.2), squeeze=False, sharey=True)
    for ax, arm in zip(axes[0], arms, strict=True):
        runs = by_arm[arm]

        def share(record: dict[str, Any], level: str) -> float:
            counts = record["categories"]
            return counts.get(level, 0) / max(sum(counts.values()), 1)

        curves = [_mean_curves(runs, lambda rec, c=c: share(rec, c), SMOOTH) for c in LEVELS]
        ax.stackplot(range(len(curves[0])), curves, labels=LEVELS)
        ax.set_title(f"{arm} ({len(runs)} seeds)")
        ax.set_xlabel(f"RL step (mean of {SMOOTH})")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("share of the step's problems")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "draws.png", dpi=110)

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for arm in arms:
        left.plot(_mean_curves(by_arm[arm], lambda rec: rec["zero_adv_share"], SMOOTH), label=arm)
    left.set_xlabel(f"RL step (mean of {SMOOTH})")
    left.set_ylabel("zero-advantage groups (mean over seeds)")
    left.set_ylim(0, 1)
    left.legend(fontsize=8)
    for i, arm in enumerate(arms):
        for j, r in enumerate(sorted(by_arm[arm], key=lambda r: r["seed"])):
            t = r["test"]
            x = i + (j - 1) * 0.15
            right.errorbar(
                x,
                100 * t["value"],
                yerr=[[100 * (t["value"] - t["low"])], [100 * (t["high"] - t["value"])]],
                fmt="o",
                color=f"C{i}",
                capsize=2,
            )
    for r in data["runs"]:
        if r["arm"] == "sft":  # the SFT student every run started from
            right.axhline(100 * r["test"]["value"], color="grey", linestyle="--", label="SFT student (no RL)")
            right.legend(fontsize=8)
    right.set_xticks(range(len(arms)), arms)
    right.set_ylabel("test strict success, % (each seed)")
    right.set_title("test split, greedy, one evaluation per run")
    fig.tight_layout()
    fig.savefig(out / "zero_adv.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("study", type=Path, help="the --out folder of examples.math_study.sec_study")
    parser.add_argument(
        "--out", type=Path, required=True, help="where draws.png, zero_adv.png and table.md go"
    )
    args = parser.parse_args()
    data = load(args.study)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table(data))
    plot(data, args.out)
    print(f"wrote {args.out / 'table.md'}, {args.out / 'draws.png'} and {args.out / 'zero_adv.png'}")


if __name__ == "__main__":
    main()
