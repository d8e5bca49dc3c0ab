"""Each configuration of a sweep against the model it started from: the mean change in the metric
over the configuration's training seeds, with a seed-level Student-t interval (the training seed
is the unit; the starting model's score is one fixed number).

    python scripts/sweep_vs_baseline.py OUT [--metric val_success]

Reads ``OUT/sweep.jsonl`` (``tapekit.training.run_sweep``) and ``OUT/baseline.json`` (the metric
before training, as ``examples/grpo_sweep.py`` writes it) and writes ``OUT/vs_baseline.md``: one
row per configuration, best mean first. A configuration with one seed gets no interval.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tapekit.evaluate import student_t_interval
from tapekit.training import read_sweep


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def table(out: Path, metric: str) -> str:
    """The markdown table described in the module docstring."""
    for name in ("sweep.jsonl", "baseline.json"):
        if not (out / name).is_file():
            raise SystemExit(f"{out}: no {name} (see this script's docstring)")
    before = float(json.loads((out / "baseline.json").read_text())[metric])
    by_config: dict[str, list[float]] = {}
    for row in read_sweep(out / "sweep.jsonl"):
        if row.error is None and metric in row.metrics:
            name = " ".join(f"{k}={_text(v)}" for k, v in row.config.items())
            by_config.setdefault(name, []).append(float(row.metrics[metric]) - before)
    if not by_config:
        raise SystemExit(f"{out}/sweep.jsonl: no finished run with {metric}")
    lines = [
        f"{metric} before training: {before:.3f}",
        "",
        f"| configuration | seeds | {metric} (mean) | change | seed-level 95 % interval |",
        "|---|---|---|---|---|",
    ]
    ranked = sorted(by_config.items(), key=lambda item: -sum(item[1]) / len(item[1]))
    for name, changes in ranked:
        mean = sum(changes) / len(changes)
        if len(changes) > 1:
            ci = student_t_interval(changes)
            interval = f"[{ci.low:+.3f}, {ci.high:+.3f}]"
        else:
            interval = "(one seed)"
        lines.append(f"| {name} | {len(changes)} | {before + mean:.3f} | {mean:+.3f} | {interval} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the sweep's folder (sweep.jsonl, baseline.json)")
    parser.add_argument("--metric", default="val_success")
    args = parser.parse_args(argv)
    text = table(args.out, args.metric)
    (args.out / "vs_baseline.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
