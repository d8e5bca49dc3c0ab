"""Pictures and a table of form-filler runs, from their ``greadth.json`` (what
``examples/form_filler/run.py`` writes in ``--out``).

    python scripts/plot_form_filler.py RUN_DIR [RUN_DIR ...] --out docs/experiments/form-filler-smollm2

For every run: one group of bars per agent (the six criteria and GREADTH, share of turns passing,
with the 95 % bootstrap interval as error bars), one panel per run, titled with the run's folder
name and split (``criteria.png``); and a Markdown table of the same numbers (``table.md``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

METRICS = ["grounded", "responsive", "accurate", "disciplined", "transparent", "helpful", "greadth"]
LETTERS = ["G", "Re", "A", "D", "T", "H", "GREADTH"]


def load(run: Path) -> dict[str, Any]:
    """A run's GREADTH report, with its folder name."""
    path = run / "greadth.json"
    if not path.is_file():
        raise SystemExit(f"{run} has no greadth.json: not a form-filler run's --out folder")
    report = json.loads(path.read_text())
    report["name"] = run.name
    return report


def table(reports: list[dict[str, Any]]) -> str:
    """Markdown: per run and agent, turns, invalid turns and each metric with its interval."""
    lines = [
        "| run | split | agent | turns | invalid | " + " | ".join(LETTERS) + " |",
        "|---|---|---|---|---|" + "---|" * len(LETTERS),
    ]
    for report in reports:
        for agent, summary in report["summary"].items():
            cells = []
            for metric in METRICS:
                s = summary["scores"][metric]
                cells.append(f"{100 * s['value']:.1f} [{100 * s['low']:.1f}, {100 * s['high']:.1f}]")
            lines.append(
                f"| {report['name']} | {report.get('split', '?')} | {agent} | {summary['turns']} | "
                f"{summary['invalid']} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines) + "\n"


def plot(reports: list[dict[str, Any]], out: Path) -> None:
    """``criteria.png``: one panel per run, bars per agent and metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(reports), 1, figsize=(9, 3.2 * len(reports)), squeeze=False)
    for ax, report in zip(axes[:, 0], reports, strict=True):
        agents = list(report["summary"])
        width = 0.8 / len(agents)
        for i, agent in enumerate(agents):
            scores = [report["summary"][agent]["scores"][m] for m in METRICS]
            values = [100 * s["value"] for s in scores]
            errors = [
                [100 * (s["value"] - s["low"]) for s in scores],
                [100 * (s["high"] - s["value"]) for s in scores],
            ]
            xs = [j + (i - (len(agents) - 1) / 2) * width for j in range(len(METRICS))]
            ax.bar(xs, values, width, yerr=errors, capsize=2, label=agent)
        ax.set_xticks(range(len(METRICS)), LETTERS)
        ax.set_ylim(0, 122)
        ax.set_yticks(range(0, 101, 20))
        ax.set_ylabel("% of turns passing")
        n = next(iter(report["summary"].values()))["turns"]
        ax.set_title(f"{report['name']} ({report.get('split', '?')} split, {n} turns)")
        ax.legend(fontsize=8, loc="upper center", ncol=len(agents), frameon=False)
    fig.tight_layout()
    fig.savefig(out / "criteria.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="--out folders of examples/form_filler/run.py")
    parser.add_argument("--out", type=Path, required=True, help="where criteria.png and table.md go")
    args = parser.parse_args()
    reports = [load(run) for run in args.runs]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table(reports))
    plot(reports, args.out)
    print(f"wrote {args.out / 'table.md'} and {args.out / 'criteria.png'}")


if __name__ == "__main__":
    main()
