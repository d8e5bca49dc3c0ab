"""Draw the web agent's test figures from the JSON that ``examples/web_agent/run.py --out`` writes.

One picture: success per MiniWob++ task on the test seeds for each agent (bars), with each
agent's overall success and 95 % interval in the legend. Needs matplotlib (``pip install
'tapekit[plots]'``).

    python scripts/plot_web_agent.py docs/experiments/web-agent/figures.json \
        docs/experiments/web-agent/test-success.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("figures", type=Path, help="the JSON written by examples/web_agent/run.py --out")
    parser.add_argument("picture", type=Path, help="the PNG to write")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "tapekit"  # the same figures make the same file
    import matplotlib.pyplot as plt

    figures = json.loads(args.figures.read_text())
    rows = figures["test"]
    tasks = sorted({t for r in rows for t in r["per_task"]})
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(max(8, len(tasks) * 0.75), 5.6))
    for i, r in enumerate(rows):
        xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(tasks))]
        label = f"{r['agent']}: {r['success']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"
        ax.bar(xs, [r["per_task"].get(t, 0.0) for t in tasks], width, label=label)
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels(tasks, rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success on the test seeds")
    diff = figures.get("test_difference")
    title = "MiniWob++ test seeds, each agent evaluated once"
    if diff:
        interval = f"{diff['value']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]"
        title += f"\noptimised - zero-shot (paired, task-stratified): {interval}"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1, frameon=False)
    fig.tight_layout()
    args.picture.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.picture, dpi=110)
    print(f"wrote {args.picture}")


if __name__ == "__main__":
    main()
