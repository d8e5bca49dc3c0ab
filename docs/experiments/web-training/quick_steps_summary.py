"""The table of docs/experiments/web-training.md's fixed-student probes, from their logs.

    python docs/experiments/web-training/quick_steps_summary.py docs/experiments/web-training/quick-steps-*

Per run: greedy pool success at the start, after SFT and after GRPO; sampled success per GRPO
step; the paired difference (last two steps minus step 0, per pool seed) with its bootstrap
interval over the 8 seeds. Then the same difference over every run's seeds together, resampled
within each run (``paired_difference`` with the run as the stratum).
"""

import json
import sys
from pathlib import Path

from tapekit.evaluate import paired_difference

rows, last, first, runs = [], [], [], []
for folder in map(Path, sys.argv[1:]):
    results = json.loads((folder / "results.json").read_text())
    greedy = " → ".join(f"{round(c['pool']['success'] * 8)}/8" for c in results["checkpoints"])
    sampled = results["rl_sampled"]
    d = sampled["difference"]
    steps = " ".join(f"{x:.2f}" for x in sampled["per_step"])
    s = results["settings"]
    rows.append(
        f"| {folder.name} | {s['seed']} | {s['rl_lr']:g} | {greedy} | {steps} | "
        f"{d['value']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] |"
    )
    for task in sampled["first"]:
        first.append(sampled["first"][task])
        last.append(sampled["last"][task])
        runs.append(folder.name)
print(
    "| run | seed | GRPO lr | greedy pool: start → SFT → GRPO | sampled success per step | last 2 − step 0 [95 %] |"
)
print("|---|---|---|---|---|---|")
print("\n".join(rows))
pooled = paired_difference(last, first, strata=runs)
print(
    f"\npooled over {len(runs)} (run, seed) pairs of {len(set(runs))} runs: "
    f"{pooled.value:+.3f} [{pooled.low:+.3f}, {pooled.high:+.3f}]"
)
print(
    "seeds up / down / same:",
    sum(a > b for a, b in zip(last, first)),
    sum(a < b for a, b in zip(last, first)),
    sum(a == b for a, b in zip(last, first)),
)
