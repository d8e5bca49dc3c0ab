"""Prompt optimisation of the untrained SmolLM2 form-filling student: candidate prompts scored on
the validation companies, the best one and the baseline tested once on the fresh companies.

    python examples/form_filler/prompt_study.py --out runs/ff-prompts           # validation, every candidate
    python examples/form_filler/prompt_study.py --out runs/ff-prompts --test    # once: winner and baseline

The student is the embedded SmolLM2-135M-Instruct through llama.cpp, untrained, as
``examples/form_filler/run.py --quick --student smollm2`` builds it; the turns are run.py's: one
agent turn continuing each of 38 partial dialogues of a split's dialogue trees (every user
behaviour represented), scored by the GREADTH rules.

- **Candidates** (:data:`CANDIDATES`, fixed before any was scored): ``(worked examples per node,
  output grammar)`` — zero-shot without and with the grammar (the baseline: run.py's
  "zero-shot, grammar"), 1, 2 and 4 worked examples with the grammar, and 2 without it. The
  examples are run.py's few-shot rule (:func:`~examples.form_filler.distill.few_shot_demos`:
  one from each of the most common answer shapes of the training companies' teacher tapes).
- **Choice**, on the validation companies: the highest GREADTH; a tie goes to the candidate
  with fewer prompt tokens per turn. ``validation.json`` keeps every candidate's scores,
  tokens and seconds (a candidate already there is not run again).
- **Test** (``--test``, once): the chosen candidate and the baseline on the fresh companies'
  turns (``--split fresh`` of run.py, companies no run before issue 44 scored); the paired
  GREADTH difference with a bootstrap interval (10,000 resamples) and the exact McNemar
  p-value, in ``test.json``. A second ``--test`` prints the stored result.

The write-up is docs/experiments/form-filler-prompts.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.form_filler import run
from examples.form_filler.agents import make_student
from examples.form_filler.distill import (
    continue_branches,
    demos_by_node,
    few_shot_demos,
    reusable,
    student_llm,
)
from examples.form_filler.greadth import greadth_report
from examples.form_filler.schema import load_form_set

CANDIDATES: dict[str, tuple[int, bool]] = {
    "zero-shot": (0, False),
    "grammar": (0, True),
    "grammar + 1 example": (1, True),
    "grammar + 2 examples": (2, True),
    "grammar + 4 examples": (4, True),
    "2 examples": (2, False),
}
"""Each candidate's worked examples per node and whether decoding is held to the output grammar."""

BASELINE = "grammar"


def batch_name(split: str, candidate: str) -> str:
    """The batch (and tape-store) name of ``candidate``'s turns on ``split``: its words joined
    by ``-`` (a batch name holds letters, digits, ``_``, ``-``, ``.`` and ``/`` only)."""
    return f"prompt-{split}-" + "-".join(re.findall(r"[A-Za-z0-9]+", candidate))


class Turns:
    """A split's scored turns and what every candidate needs: the partial dialogues, the
    training tapes the examples come from, the untrained student's LLM, the store."""

    def __init__(self, out: Path, split: str, n_eval: int) -> None:
        from tapekit import open_store

        self.settings = run.parse_args(
            ["--quick", "--student", "smollm2", "--split", split, "--out", str(out)]
        )
        self.settings.n_eval = n_eval
        forms = load_form_set()
        self.splits = run.make_splits(forms, self.settings.synthetic)
        self.store = open_store(str(out / "tapes.db"))
        teacher = run.teacher_agent(self.settings)
        s = self.settings
        train = run.grow_trees(teacher, forms.train, s.train_tree, self.store, "train-tree")
        scored = run.grow_trees(
            teacher, self.splits.companies(split), s.scored_tree(), self.store, f"{split}-tree"
        )
        self.branches = run.eval_branches(scored, s.n_eval)
        self.teacher_tapes = [b.tape for b in self.branches]
        self.llm = student_llm(s.student, s.student_model)
        self.train_tapes = reusable([b.tape for b in train if b.error is None], make_student(self.llm))

    def continue_with(self, name: str) -> tuple[list[Any], float]:
        """Candidate ``name``'s turns on the split and the seconds they took."""
        shots, constrain = CANDIDATES[name]
        demos = demos_by_node(few_shot_demos(self.train_tapes, shots)) if shots else None
        agent = make_student(self.llm, demos=demos, constrain=constrain)
        started = time.perf_counter()
        tapes = continue_branches(
            agent, self.branches, self.splits.catalog(), self.store, batch_name(self.settings.split, name)
        )
        return tapes, time.perf_counter() - started

    def report(self, tapes: dict[str, list[Any]]) -> Any:
        """The GREADTH report of the candidates' turns (the teacher's beside them)."""
        return greadth_report(
            {run.TEACHER: self.teacher_tapes, **tapes},
            llm_calls=self.store,
            last_only=True,
            n_bootstrap=10_000,
        )


def summary(report: Any, name: str, seconds: float) -> dict[str, Any]:
    """A candidate's GREADTH with its interval, per-criterion rates, tokens and seconds per turn."""
    turns = len(report.outcomes(name))
    costs = report.costs(name)
    return {
        "greadth": report.score(name).model_dump(),
        "criteria": {m: report.score(name, m).value for m in run.METRICS},
        "passes": sum(report.outcomes(name)),
        "turns": turns,
        "prompt_tokens_per_turn": costs["prompt_tokens_per_turn"],
        "output_tokens_per_turn": costs["completion_tokens_per_turn"],
        "seconds_per_turn": seconds / turns if turns else None,
        "pass_sources": report.pass_sources(name),
    }


def choose(scores: dict[str, dict[str, Any]]) -> str:
    """The candidate with the most validation passes; a tie goes to fewer prompt tokens per
    turn, then to the earlier candidate."""
    order = list(scores)
    return max(
        order,
        key=lambda n: (scores[n]["passes"], -(scores[n]["prompt_tokens_per_turn"] or 0.0), -order.index(n)),
    )


def validate(out: Path) -> dict[str, Any]:
    """Every candidate on the validation companies (resumes), and the choice."""
    path = out / "validation.json"
    done: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"candidates": {}}
    turns = Turns(out, "val", 38)
    for name in CANDIDATES:
        if name in done["candidates"]:
            continue
        tapes, seconds = turns.continue_with(name)
        done["candidates"][name] = summary(turns.report({name: tapes}), name, seconds)
        path.write_text(json.dumps(done, indent=1) + "\n")
        print(
            f"validation {name}: {done['candidates'][name]['passes']}/{done['candidates'][name]['turns']}",
            flush=True,
        )
    done["chosen"] = choose(done["candidates"])
    path.write_text(json.dumps(done, indent=1) + "\n")
    turns.store.close()
    return done


def test(out: Path) -> dict[str, Any]:
    """The chosen candidate and the baseline, once, on the fresh companies."""
    path = out / "test.json"
    if path.exists():
        return json.loads(path.read_text())
    chosen = validate(out)["chosen"]
    turns = Turns(out, "fresh", 38)
    names = [BASELINE] if chosen == BASELINE else [BASELINE, chosen]
    tapes, seconds = {}, {}
    for name in names:
        tapes[name], seconds[name] = turns.continue_with(name)
    report = turns.report(tapes)
    result: dict[str, Any] = {
        "chosen": chosen,
        "candidates": {n: summary(report, n, seconds[n]) for n in names},
    }
    if chosen != BASELINE:
        result["difference"] = report.paired(chosen, BASELINE).model_dump()
    path.write_text(json.dumps(result, indent=1) + "\n")
    turns.store.close()
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/ff-prompts"))
    p.add_argument("--test", action="store_true", help="once: the chosen candidate and the baseline on fresh")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(test(args.out) if args.test else validate(args.out), indent=1))


if __name__ == "__main__":
    main()
