"""The table of docs/experiments/web-training.md's fixed-student runs, from their logs.

    python docs/experiments/web-training/quick_steps_summary.py docs/experiments/web-training/quick-steps/*

Per run: greedy pool success at the start, after SFT and after GRPO; sampled success per GRPO
step (step 0: the SFT student); the paired difference of the last two steps' sampled success and
step 0's per pool seed, with its bootstrap interval over the 8 seeds; where the run scored k
sampled episodes per seed at its checkpoints (``--pool-samples k``: 8 until 2026-11-27 13:00
UTC, 16 since), that success after SFT and after GRPO and their paired difference. Then the
differences over every run's seeds together, resampled within each run (``paired_difference``
with the run as the stratum).
"""

import json
import sys
from pathlib import Path

from tapekit.evaluate import paired_difference

HEAD = (
    "| run | seed | GRPO lr | greedy pool: start → SFT → GRPO | sampled success per GRPO step "
    "| last 2 − step 0 [95 %] | k samples per seed: SFT → GRPO, difference [95 %] |"
)


def interval(value: float, low: float, high: float) -> str:
    return f"{value:+.2f} [{low:+.2f}, {high:+.2f}]"


rows: list[str] = []
pairs: dict[str, list[tuple[float, float, str]]] = {"steps": [], "checkpoints": [], "greedy": []}
for folder in map(Path, sys.argv[1:]):
    results = json.loads((folder / "results.json").read_text())
    points = {c["label"]: c for c in results["checkpoints"]}
    greedy = " → ".join(f"{round(c['pool']['success'] * 8)}/8" for c in results["checkpoints"])
    sampled = results["rl_sampled"]
    s = results["settings"]
    checked = "–"
    gain = results.get("pool_sampled_gain")
    if gain:
        before, after = points[gain["from"]]["pool_sampled"], points[gain["to"]]["pool_sampled"]
        checked = f"k={s['pool_samples']}: {before['success']:.2f} → {after['success']:.2f}: " + interval(
            gain["value"], gain["low"], gain["high"]
        )
        for t in before["per_task"]:
            pairs["checkpoints"].append((after["per_task"][t], before["per_task"][t], folder.name))
    d = sampled["difference"]
    rows.append(
        f"| {folder.name} | {s['seed']} | {s['rl_lr']:g} | {greedy} | "
        f"{' '.join('–' if x is None else f'{x:.2f}' for x in sampled['per_step'])} | "
        f"{interval(d['value'], d['low'], d['high'])} | {checked} |"
    )
    for t in sampled["first"]:
        pairs["steps"].append((sampled["last"][t], sampled["first"][t], folder.name))
    sft, rl = points["sft0"]["pool"]["per_task"], points["rl0"]["pool"]["per_task"]
    for t in sft:
        pairs["greedy"].append((rl[t], sft[t], folder.name))
print(HEAD)
print("|---|---|---|---|---|---|---|")
print("\n".join(rows))
for name, items in pairs.items():
    if items:
        a, b, runs = zip(*items, strict=True)
        pooled = paired_difference(a, b, strata=runs)
        up = sum(x > y for x, y, _ in items)
        down = sum(x < y for x, y, _ in items)
        print(
            f"\n{name}: pooled over {len(items)} (run, seed) pairs of {len(set(runs))} runs: "
            f"{interval(pooled.value, pooled.low, pooled.high)}; seeds up {up}, down {down}"
        )
