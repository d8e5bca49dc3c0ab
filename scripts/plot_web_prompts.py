"""The tables and the picture of the web prompt study (``examples/web_agent/prompt_study.py``).

    python scripts/plot_web_prompts.py RUN_DIR --to DIR

Reads ``RUN_DIR/figures.json`` and writes ``DIR/prompts.md`` (every candidate on validation:
success with its exact interval, per-task successes, prompt and output tokens and seconds per
episode; the two configurations tested once, on the test seeds and the held-out tasks, with
the paired, task-stratified difference) and ``DIR/prompts.png`` (validation success against
prompt tokens per episode, one point per candidate, the tested ones ringed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tapekit.evaluate import clopper_pearson


def load(run: Path) -> dict[str, Any]:
    """The study's figures; a clear exit when the run has not written them."""
    path = run / "figures.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no figures (run examples/web_agent/prompt_study.py --out {run} first)")
    figures: dict[str, Any] = json.loads(path.read_text())
    return figures


def validation_table(figures: dict[str, Any]) -> list[str]:
    """One line per candidate, in the order scored."""
    seeds = int(figures["args"]["val_seeds"])
    tasks = sorted(figures["validation"][0]["per_task"])
    lines = [
        "| candidate | success [95 % exact] | prompt tokens / episode | output tokens / episode "
        "| s / episode | " + " | ".join(tasks) + " |",
        "|---|---|---|---|---|" + "---|" * len(tasks),
    ]
    for row in figures["validation"]:
        n = seeds * len(row["per_task"])
        k = round(row["success"] * n)
        est = clopper_pearson(k, n)
        cells = [f"{round(row['per_task'][t] * seeds)}/{seeds}" for t in tasks]
        lines.append(
            f"| {row['variant']} | {k}/{n} [{est.low:.2f}, {est.high:.2f}] | "
            f"{row['prompt_tokens_per_episode']:.0f} | {row['output_tokens_per_episode']:.1f} | "
            f"{row['seconds_per_episode']:.1f} | " + " | ".join(cells) + " |"
        )
    return lines


def test_table(figures: dict[str, Any]) -> list[str]:
    """The two tested configurations on each split, and the paired difference."""
    test = figures.get("test") or {}
    lines = [
        "| split | configuration | success [95 %] | episodes | prompt tokens / episode |",
        "|---|---|---|---|---|",
    ]
    for split in ("test", "held_out"):
        for label in ("zero_shot", "demos"):
            row = test.get(f"{split}/{label}")
            if row is None:
                continue
            lines.append(
                f"| {split} | {row['variant']} | {row['success']:.3f} [{row['low']:.3f}, {row['high']:.3f}] "
                f"| {row['episodes']} | {row['prompt_tokens_per_episode']:.0f} |"
            )
    lines.append("")
    for split, diff in (test.get("summary") or {}).items():
        lines.append(
            f"- {split}: demos − zero-shot {diff['difference']:+.3f} "
            f"[{diff['low']:+.3f}, {diff['high']:+.3f}] (paired, task-stratified bootstrap)"
        )
    return lines


def plot(figures: dict[str, Any], out: Path) -> Path:
    """Draw ``out/prompts.png``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tested = set((figures.get("tested") or {}).values())
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for row in figures["validation"]:
        name = row["variant"]
        key = "baseline" if name.startswith("baseline") else name
        x, y = row["prompt_tokens_per_episode"], row["success"]
        ax.scatter([x], [y], s=60, color="C1" if row["demos"] else "C0", zorder=3)
        if key in tested:
            ax.scatter([x], [y], s=220, facecolors="none", edgecolors="k", zorder=2)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xlabel("prompt tokens per episode (validation)")
    ax.set_ylabel("validation success")
    ax.set_title("Prompt variants of the untrained SmolLM2-135M web agent (ringed: tested once)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "prompts.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path)
    p.add_argument("--to", type=Path, required=True)
    args = p.parse_args(argv)
    figures = load(args.run)
    args.to.mkdir(parents=True, exist_ok=True)
    text = ["## Validation (every candidate)", "", *validation_table(figures), "", "## Test, once", ""]
    text += test_table(figures)
    (args.to / "prompts.md").write_text("\n".join(text) + "\n")
    plot(figures, args.to)
    print(f"wrote {args.to / 'prompts.md'} and {args.to / 'prompts.png'}")


if __name__ == "__main__":
    main()
