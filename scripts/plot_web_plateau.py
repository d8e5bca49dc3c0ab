"""Summarise the plateau study (``examples/web_agent/plateau.py``): curves, tables, statistics.

Reads the folder a study writes (``--out`` of plateau.py) and writes into it:

- ``curves.png``: validation success against SFT steps up to the plateau (with ``--first-run``,
  that run's curve beside it), the grid's scores, and each arm's validation success against
  its charged seconds from the branch point (the branch point's score at 0);
- ``summary.md``: the SFT curve, the grid, every arm run (updates or steps, charged seconds,
  FLOPs, validation points), the teacher's two prices, and, once ``test.json`` exists, each
  policy's test success (the 14 tasks and the held-out tasks apart), per task, and the
  statistic fixed in the protocol: per arm pair, the seed-averaged per-episode difference with
  an item bootstrap inside tasks (10,000 resamples) and the seed-level Student-t interval
  (``tapekit.evaluate.seed_paired_difference``; the training seed is the unit).

Needs matplotlib (``pip install 'tapekit[plots]'``).

    python scripts/plot_web_plateau.py docs/experiments/web-plateau/lora \
        --first-run docs/experiments/web-plateau/run
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path
from typing import Any

from tapekit.evaluate import seed_paired_difference

TEACHER_LLM_FLOPS_PER_TOKEN = 2 * 70e9  # as plateau.py prices the teacher's tokens
HELD_IN = 14  # the teacher's tasks; test.json's other tasks are held out
PAIRS = [("grpo", "sft"), ("grpo", "plateau"), ("sft", "plateau"), ("grpo_kl", "grpo")]


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none when it is missing)."""
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def charged(run: Path) -> dict[int, dict[str, Any]]:
    """``{step: ledger line}`` of a run's ``ledger.jsonl`` (stage ``<name>-<step>``)."""
    return {int(line["stage"].rsplit("-", 1)[1]): line for line in lines(run / "ledger.jsonl")}


def arm_runs(out: Path) -> dict[str, dict[int, Path]]:
    """``{arm: {seed: folder}}`` of the arm runs under ``out``."""
    runs: dict[str, dict[int, Path]] = {}
    for d in sorted(out.glob("*-seed*")):
        m = re.fullmatch(r"(grpo_kl|grpo|sft)-seed(\d+)", d.name)
        if m and d.is_dir():
            runs.setdefault(m[1], {})[int(m[2])] = d
    return runs


def teacher_prices(out: Path) -> dict[str, float]:
    """The teacher's wall seconds and its episodes' tokens (per pool) priced as a 70B model."""
    seconds = sum(x["seconds"] for x in lines(out / "ledger.jsonl") if x["stage"] == "teacher")
    tokens = {"sft": 0, "fresh": 0}
    path = out / "teacher-samples.jsonl.gz"
    if path.exists():
        with gzip.open(path, "rt") as f:
            for row in map(json.loads, f):
                tokens[row["pool"]] += len(row["input_ids"])
    return {
        "seconds": seconds,
        "tokens_sft": tokens["sft"],
        "tokens_fresh": tokens["fresh"],
        "llm_flops_sft": tokens["sft"] * TEACHER_LLM_FLOPS_PER_TOKEN,
        "llm_flops_fresh": tokens["fresh"] * TEACHER_LLM_FLOPS_PER_TOKEN,
    }


def grid_scores(out: Path) -> tuple[int | None, list[dict[str, Any]]]:
    """The grid's updates per run and its scores: ``grid.json`` once the grid is done, else the
    finished runs' last validation points (``grid/lr<lr>-t<T>/val.jsonl``)."""
    path = out / "grid.json"
    if path.exists():
        g = json.loads(path.read_text())
        return g["steps"], g["scores"]
    scores, steps = [], None
    for run in sorted((out / "grid").glob("lr*-t*")):
        points = lines(run / "val.jsonl")
        m = re.fullmatch(r"lr([^-]+(?:-\d+)?)-t(.+)", run.name)
        if points and m:
            steps = points[-1]["step"]
            scores.append({"lr": float(m[1]), "temperature": float(m[2]), "success": points[-1]["success"]})
    return steps, scores


def plot(out: Path, first: Path | None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    for label, folder in (("first run (full FT)", first), ("LoRA run", out)):
        if folder is None:
            continue
        points = lines(folder / "sft" / "val.jsonl")
        if points:
            ax1.plot([p["step"] for p in points], [p["success"] for p in points], marker="o", label=label)
        done = folder / "sft" / "plateau.json"
        if done.exists():
            best = json.loads(done.read_text())
            ax1.plot([best["step"]], [best["success"]], marker="*", markersize=16, color="k")
    ax1.set(xlabel="SFT step (8 rows of 1,024 tokens)", ylabel="validation success (140 episodes)")
    ax1.set_title("SFT to the plateau (star: branch point)")
    ax1.legend()
    steps, scores = grid_scores(out)
    if scores:
        names = [f"lr {s['lr']:g}\nT {s['temperature']:g}" for s in scores]
        ax2.bar(names, [s["success"] for s in scores], color="tab:orange")
        ax2.set_title(f"GRPO grid, {steps} updates each (validation)")
    branch = branch_point(out)
    if branch is not None:
        ax2.axhline(branch, color="k", ls="--", lw=1, label="branch point")
        ax2.legend()
    ax2.set(ylabel="validation success")
    colors = {"grpo": "tab:red", "grpo_kl": "tab:purple", "sft": "tab:blue"}
    for arm, seeds in arm_runs(out).items():
        for seed, run in seeds.items():
            ledger = charged(run)
            xs, ys = [0.0], [branch if branch is not None else float("nan")]
            for p in lines(run / "val.jsonl"):
                xs.append(ledger[p["step"]]["seconds"] if p["step"] in ledger else float("nan"))
                ys.append(p["success"])
            ax3.plot(xs, ys, marker="o", color=colors[arm], alpha=0.8, label=f"{arm} seed {seed}")
    ax3.set(xlabel="charged CPU seconds from the branch point", ylabel="validation success")
    ax3.set_title("Arms from the branch point")
    if ax3.lines:
        ax3.legend(fontsize=8)
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    return path


def branch_point(out: Path) -> float | None:
    """The branch point's validation success (the plateau), None before it is reached."""
    done = out / "sft" / "plateau.json"
    return json.loads(done.read_text())["success"] if done.exists() else None


def success(per_task: dict[str, dict[str, float]], tasks: list[str]) -> tuple[float, int]:
    scores = [r for t in tasks for r in per_task.get(t, {}).values()]
    return (sum(scores) / len(scores) if scores else float("nan")), len(scores)


def test_tables(out: Path, held_in: list[str]) -> list[str]:
    """The test section of summary.md (empty before ``test.json`` exists)."""
    path = out / "test.json"
    if not path.exists():
        return []
    read = json.loads(path.read_text())
    results = {name: r["per_task"] for name, r in read.items()}
    failures = {name: r["environment_failures"] for name, r in read.items()}
    tasks = sorted({t for r in results.values() for t in r})
    held_out = [t for t in tasks if t not in held_in]
    md = [
        "## Test (once per final policy)",
        "",
        "| policy | 14 tasks | held-out tasks | env. failures |",
        "|---|---|---|---|",
    ]
    for name, per_task in results.items():
        a, na = success(per_task, held_in)
        b, nb = success(per_task, held_out)
        md.append(f"| {name} | {a:.3f} ({na}) | {b:.3f} ({nb}) | {failures[name]} |")
    md += ["", "| task | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for t in tasks:
        md.append(f"| {t} | " + " | ".join(f"{success(r, [t])[0]:.2f}" for r in results.values()) + " |")
    md += ["", "### Differences (the protocol's statistic)", ""]
    md += ["| a − b | tasks | seeds | value | item bootstrap 95 % | seed-level t 95 % | per seed |"]
    md += ["|---|---|---|---|---|---|---|"]
    by_arm: dict[str, dict[int, str]] = {}
    for name in results:
        m = re.fullmatch(r"(grpo_kl|grpo|sft)-seed(\d+)", name)
        if m:
            by_arm.setdefault(m[1], {})[int(m[2])] = name
    for a, b in PAIRS:
        for label, group in (("14", held_in), ("held-out", held_out)):
            pairs: dict[int, dict[str, tuple[float, float]]] = {}
            for seed, name in by_arm.get(a, {}).items():
                other = "plateau" if b == "plateau" else by_arm.get(b, {}).get(seed)
                if other is None or other not in results:
                    continue
                ra, rb = results[name], results[other]
                pairs[seed] = {
                    f"{t}/{s}": (ra[t][s], rb[t][s])
                    for t in group
                    for s in ra.get(t, {})
                    if s in rb.get(t, {})
                }
            pairs = {s: p for s, p in pairs.items() if p}
            if not pairs:
                continue
            d = seed_paired_difference(pairs, strata=lambda item: item.rsplit("/", 1)[0], n_resamples=10_000)
            seed_ci = "n/a (one seed)" if d.seed_low is None else f"[{d.seed_low:+.3f}, {d.seed_high:+.3f}]"
            per_seed = ", ".join(f"{s}: {v:+.3f}" for s, v in d.per_seed.items())
            md.append(
                f"| {a} − {b} | {label} | {d.n_seeds} | {d.value:+.3f} | "
                f"[{d.item_low:+.3f}, {d.item_high:+.3f}] | {seed_ci} | {per_seed} |"
            )
    return md


def summary(out: Path) -> Path:
    md = ["# Plateau study: summary (written by scripts/plot_web_plateau.py)", ""]
    points = lines(out / "sft" / "val.jsonl")
    ledger = charged(out / "sft")
    md += [
        "## SFT to the plateau",
        "",
        "| step | validation success | charged s | FLOPs |",
        "|---|---|---|---|",
    ]
    for p in points:
        line = ledger.get(p["step"], {"seconds": 0.0, "flops": 0.0})
        md.append(f"| {p['step']} | {p['success']:.3f} | {line['seconds']:.0f} | {line['flops']:.2e} |")
    done = out / "sft" / "plateau.json"
    if done.exists():
        d = json.loads(done.read_text())
        md += [
            "",
            f"Branch point: step {d['step']} ({d['success']:.3f}); stopped at step {d['stopped_at']}"
            f" ({'plateau reached' if d['plateau'] else 'step limit, plateau NOT reached'}).",
        ]
    held_in = sorted(points[0]["per_task"]) if points else []
    t = teacher_prices(out)
    md += [
        "",
        "## The teacher's two prices",
        "",
        f"As the program it is: {t['seconds']:.0f} wall s for both pools. As a 70B-class LLM on the "
        f"same tokens (2 × 70e9 FLOPs a token): SFT pool {t['tokens_sft']:,} tokens = "
        f"{t['llm_flops_sft']:.2e} FLOPs; fresh pool {t['tokens_fresh']:,} tokens = "
        f"{t['llm_flops_fresh']:.2e} FLOPs.",
    ]
    steps, scores = grid_scores(out)
    if scores:
        md += [
            "",
            f"## GRPO grid ({steps} updates each, validation)",
            "",
            "| lr | T | success |",
            "|---|---|---|",
        ]
        md += [f"| {s['lr']:g} | {s['temperature']:g} | {s['success']:.3f} |" for s in scores]
        grid = out / "grid.json"
        if grid.exists():
            g = json.loads(grid.read_text())["choice"]
            md += ["", f"Choice: lr {g['lr']:g}, temperature {g['temperature']:g}."]
        else:
            md += ["", "The grid is not finished: no choice yet."]
    runs = arm_runs(out)
    if runs:
        md += [
            "",
            "## Arm runs",
            "",
            "| run | last step | charged s | FLOPs | validation (step: success) |",
            "|---|---|---|---|---|",
        ]
        for arm, seeds in runs.items():
            for seed, run in seeds.items():
                ledger = charged(run)
                last = ledger[max(ledger)] if ledger else {"seconds": 0.0, "flops": 0.0}
                vals = ", ".join(f"{p['step']}: {p['success']:.3f}" for p in lines(run / "val.jsonl"))
                step = max(ledger, default=0)
                md.append(
                    f"| {arm}-seed{seed} | {step} | {last['seconds']:.0f} | {last['flops']:.2e} | {vals} |"
                )
    md += ["", *test_tables(out, held_in)]
    path = out / "summary.md"
    path.write_text("\n".join(md) + "\n")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the study's folder (plateau.py --out)")
    p.add_argument("--first-run", type=Path, default=None, help="another run's folder, drawn beside it")
    args = p.parse_args()
    if not (args.out / "sft" / "val.jsonl").exists():
        p.error(f"{args.out}: no sft/val.jsonl (is this a plateau.py --out folder?)")
    print(summary(args.out).read_text())
    print("wrote", plot(args.out, args.first_run))


if __name__ == "__main__":
    main()
