"""The tables and the picture of the form-filler prompt study, from its ``validation.json`` and
``test.json`` (what ``examples/form_filler/prompt_study.py`` writes in ``--out``).

    python scripts/plot_form_filler_prompts.py RUN_DIR --to docs/experiments/form-filler-prompts

Writes ``table.md`` (per candidate and split: GREADTH passes with the exact interval, the six
criteria's pass rates, how many of the GREADTH passes had a criterion passed by default, prompt
and output tokens and seconds per turn; the test's paired difference) and ``candidates.png``
(per candidate, validation GREADTH with its interval, labelled with the prompt tokens per turn,
and the test bars of the two tested beside).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CRITERIA = ["grounded", "responsive", "accurate", "disciplined", "transparent", "helpful"]
LETTERS = ["G", "Re", "A", "D", "T", "H"]


def load(run: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The study's validation record and its test record (``None`` before ``--test`` ran)."""
    path = run / "validation.json"
    if not path.is_file():
        raise SystemExit(f"{run} has no validation.json: not the prompt study's --out folder")
    test = run / "test.json"
    return json.loads(path.read_text()), json.loads(test.read_text()) if test.is_file() else None


def _pct(score: dict[str, float]) -> str:
    return f"{100 * score['value']:.1f} [{100 * score['low']:.1f}, {100 * score['high']:.1f}]"


def rows(split: str, candidates: dict[str, Any], chosen: str) -> list[str]:
    """One Markdown row per candidate of ``split``."""
    out = []
    for name, c in candidates.items():
        by_default = c["pass_sources"]["greadth"]["some_default"]
        criteria = " | ".join(f"{100 * c['criteria'][m]:.0f}" for m in CRITERIA)
        mark = " (chosen)" if name == chosen else ""
        out.append(
            f"| {split} | {name}{mark} | {c['passes']} / {c['turns']} | {_pct(c['greadth'])} | {criteria} | "
            f"{by_default} of {c['passes']} | {c['prompt_tokens_per_turn']:.0f} | "
            f"{c['output_tokens_per_turn']:.0f} | {c['seconds_per_turn']:.1f} |"
        )
    return out


def table(validation: dict[str, Any], test: dict[str, Any] | None) -> str:
    """Markdown: every candidate on validation, the tested two on the fresh companies, the paired
    difference."""
    chosen = validation["chosen"]
    lines = [
        "| split | candidate | GREADTH passes | GREADTH % [95 %] | "
        + " | ".join(LETTERS)
        + " | passes with a default | prompt tok/turn | output tok/turn | s/turn |",
        "|---|---|---|---|" + "---|" * len(LETTERS) + "---|---|---|---|",
        *rows("validation", validation["candidates"], chosen),
    ]
    if test is not None:
        lines += rows("test (fresh)", test["candidates"], chosen)
        if "difference" in test:
            d = test["difference"]
            e = d["difference"]
            lines += [
                "",
                f"Test, {d['a']} − {d['b']} (GREADTH, paired over the same {d['n']} turns): "
                f"{100 * e['value']:+.1f} points [{100 * e['low']:+.1f}, {100 * e['high']:+.1f}]; "
                f"{d['a_only']} turns won, {d['b_only']} lost; exact McNemar p = {d['p_value']:.3g}",
            ]
    return "\n".join(lines) + "\n"


def plot(validation: dict[str, Any], test: dict[str, Any] | None, path: Path) -> None:
    """``candidates.png``: per candidate, GREADTH on validation (and on test for the two tested),
    with the interval, labelled with its prompt tokens per turn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(validation["candidates"])
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(names) + 1.4))
    for offset, label, record in ((-0.18, "validation", validation), (0.18, "test (fresh)", test)):
        if record is None:
            continue
        shown = [n for n in names if n in record["candidates"]]
        g = [record["candidates"][n]["greadth"] for n in shown]
        y = [names.index(n) + offset for n in shown]
        width = [100 * x["value"] for x in g]
        err = [[w - 100 * x["low"] for w, x in zip(width, g, strict=True)],
               [100 * x["high"] - w for w, x in zip(width, g, strict=True)]]  # fmt: skip
        ax.barh(y, width, height=0.34, xerr=err, capsize=3, label=label)
    chosen = validation["chosen"]
    labels = [
        f"{n}{' (chosen)' if n == chosen else ''}\n"
        f"{validation['candidates'][n]['prompt_tokens_per_turn']:,.0f} prompt tokens/turn"
        for n in names
    ]
    ax.set_yticks(range(len(names)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GREADTH: % of turns passing every criterion (95 % interval)")
    ax.set_title("Prompts for the untrained SmolLM2-135M form filler", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("run", type=Path, help="the study's --out folder")
    p.add_argument("--to", type=Path, required=True, help="folder for table.md and candidates.png")
    args = p.parse_args(argv)
    validation, test = load(args.run)
    args.to.mkdir(parents=True, exist_ok=True)
    (args.to / "table.md").write_text(table(validation, test))
    plot(validation, test, args.to / "candidates.png")
    print(f"wrote {args.to / 'table.md'} and {args.to / 'candidates.png'}")


if __name__ == "__main__":
    main()
