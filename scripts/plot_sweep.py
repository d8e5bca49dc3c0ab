"""The picture of a hyperparameter sweep: per hyperparameter, how likely each value is to be in
the best configuration, and the best score reachable with that value fixed, with its interval
(``tapekit.evaluate.bootstrap_configs`` over the runs of a ``tapekit.training.run_sweep``
results file).

    python scripts/plot_sweep.py RESULTS.jsonl --metric val_success --to DIR [--minimize]

Writes ``DIR/sweep.png`` (one column per hyperparameter: on top the probability that each value
is in the resamples' best configuration, below the best reachable score with its interval and
the overall best setting's interval as a grey band) and ``DIR/sweep.txt`` (the analysis's
summary table).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tapekit.evaluate import ConfigBootstrap, bootstrap_configs
from tapekit.training import read_sweep


def analyse(
    results: Path, metric: str, maximize: bool = True, n_resamples: int = 10_000, seed: int = 0
) -> ConfigBootstrap:
    """The bootstrap over the configurations of the sweep in ``results``."""
    if not results.is_file():
        raise SystemExit(f"{results}: no such results file (run_sweep writes one)")
    return bootstrap_configs(
        read_sweep(results), metric, maximize=maximize, n_resamples=n_resamples, seed=seed
    )


def _label(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def plot(result: ConfigBootstrap, out: Path) -> Path:
    """Draw ``out/sweep.png``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.effects)
    fig, axes = plt.subplots(
        2, len(names), figsize=(2.6 * len(names) + 0.8, 5.4), squeeze=False, sharey="row"
    )
    best = result.best
    for j, name in enumerate(names):
        effects = result.effects[name]
        labels = [_label(e.value) for e in effects]
        xs = range(len(effects))
        top, bottom = axes[0][j], axes[1][j]
        top.bar(xs, [e.win_probability for e in effects], color="C0")
        top.set_ylim(0, 1)
        top.set_title(name)
        top.set_xticks(xs, labels)
        bottom.axhspan(best.low, best.high, color="0.85", label="best setting")
        bottom.errorbar(
            xs,
            [e.best.value for e in effects],
            yerr=[
                [e.best.value - e.best.low for e in effects],
                [e.best.high - e.best.value for e in effects],
            ],
            fmt="o",
            color="C1",
            capsize=3,
        )
        bottom.set_xticks(xs, labels)
        bottom.set_xlim(-0.5, len(effects) - 0.5)
    axes[0][0].set_ylabel("P(value in the best)")
    axes[1][0].set_ylabel(f"best {result.metric} with the value")
    axes[1][0].legend(fontsize=7, loc="lower left")
    fig.suptitle(
        f"{result.metric}: {len(result.configs)} configurations, {result.n_runs} runs, "
        f"{result.n_resamples:,} resamples, {100 * result.confidence:g} % intervals",
        fontsize=9,
    )
    fig.tight_layout()
    path = out / "sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """``plot_sweep.py RESULTS.jsonl --metric M --to DIR``: sweep.png and sweep.txt in DIR."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the sweep's results file (JSONL, from run_sweep)")
    parser.add_argument("--metric", required=True, help="the metric compared (a key of each row's metrics)")
    parser.add_argument("--to", type=Path, required=True, help="where sweep.png and sweep.txt go")
    parser.add_argument("--minimize", action="store_true", help="lower is better (a loss)")
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = analyse(args.results, args.metric, not args.minimize, args.resamples, args.seed)
    args.to.mkdir(parents=True, exist_ok=True)
    (args.to / "sweep.txt").write_text(result.summary())
    print(result.summary(), end="")
    print(f"wrote {plot(result, args.to)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
