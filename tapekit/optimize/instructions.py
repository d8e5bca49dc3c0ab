"""Instruction proposals and a search over instruction x demo-set candidates (MIPRO-like,
with a seeded random search instead of a Bayesian one).

The proposer LLM sees, for each target node, its current instruction, the task (the node's
name and the first training questions) and a few runs of that node on good and bad training
tapes with the metric's feedback; it answers with new instructions, one per line after
``Instruction:``. Candidates then pair an instruction per target (the current one included)
with a demo set from the bootstrapped pool (or none), and the best on the validation tasks wins.
"""

from __future__ import annotations

import re
from typing import Any

from tapekit.core import Prompt
from tapekit.evaluate import EvalReport
from tapekit.llm.base import LLM
from tapekit.optimize._run import Search
from tapekit.optimize._targets import NodeParams, Params
from tapekit.optimize.base import Optimizer, demos_from_report, feedback_of, node_runs, render_run

_PROPOSER_SYSTEM = (
    "You improve the instructions of one step (a node) of an LLM agent. You see its current "
    "instruction and examples of what it did on tasks that went well and tasks that went wrong, "
    "with the evaluator's feedback. Propose better instructions: each one complete, specific and "
    "self-contained, on a single line starting with 'Instruction:'."
)


def proposal_prompt(
    target: str, instruction: str, examples: list[tuple[bool, str, str]], n: int, questions: list[str]
) -> Prompt:
    """The proposer's prompt for ``target``: ``examples`` are ``(passed, run text, feedback)``."""
    parts = [f"Node: {target}", f"Current instruction: {instruction or '(none)'}"]
    if questions:
        parts.append("Tasks the agent solves look like:\n" + "\n".join(f"- {q}" for q in questions))
    for i, (passed, run, feedback) in enumerate(examples, 1):
        verdict = "GOOD" if passed else "BAD"
        parts.append(f"Example {i} ({verdict}):\n{run}\nFeedback: {feedback}")
    parts.append(f"Propose {n} new instructions for {target}.")
    return Prompt(
        messages=[
            {"role": "system", "content": _PROPOSER_SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)},
        ]
    )


def parse_instructions(text: str) -> list[str]:
    """The instructions in a proposer's answer (``Instruction: ...`` lines), without repeats."""
    found = [m.strip() for m in re.findall(r"^\s*(?:\d+[.)]\s*)?Instruction\s*:\s*(.+)$", text, re.M | re.I)]
    return list(dict.fromkeys(f for f in found if f))


def examples_for(
    search: Search, report: EvalReport, target: str, n_good: int, n_bad: int
) -> list[tuple[bool, str, str]]:
    """Up to ``n_good`` passed and ``n_bad`` failed runs of ``target`` from ``report``, as text."""
    scorer = report.scorers[0]
    agent = search.agent_with(search.baseline.params)
    out: list[tuple[bool, str, str]] = []
    counts = {True: 0, False: 0}
    for sample in report.samples:
        passed = sample.scores[scorer].passed
        if counts[passed] >= (n_good if passed else n_bad):
            continue
        runs = list(node_runs(agent, report.tapes[sample.tape_id], [target]))
        if runs:
            counts[passed] += 1
            out.append((passed, "\n---\n".join(render_run(r) for r in runs), feedback_of(sample, scorer)))
    return out


class InstructionSearch(Optimizer):
    """An LLM proposes ``n_instructions`` instructions per target from the task and a few
    good/bad tapes; a seeded random search over (instruction per target) x (demo set) validates
    up to ``n_candidates`` of them. ``use_demos=False`` searches instructions only."""

    proposer: LLM
    n_instructions: int = 3
    n_candidates: int = 6
    max_demos: int = 3
    use_demos: bool = True
    n_examples: int = 2

    def search(self, search: Search) -> None:
        """Bootstrap training tapes, ask for proposals, then validate random combinations."""
        n = min(len(search.trainset), search.left - len(search.valset))
        if n <= 0:
            return
        report = search.run(search.baseline.params, search.trainset[:n], search.baseline.id, "train")
        pool = demos_from_report(search.agent_with(search.baseline.params), report, search.targets)
        questions = [t.question for t in search.trainset[:3] if t.question]
        options: dict[str, list[str]] = {}
        for target in search.targets:
            current = search.baseline.params[target].instruction or ""
            examples = examples_for(search, report, target, self.n_examples, self.n_examples)
            prompt = proposal_prompt(target, current, examples, self.n_instructions, questions)
            proposed = parse_instructions(self.proposer.generate(prompt).content or "")[: self.n_instructions]
            options[target] = list(dict.fromkeys([current, *proposed]))
        demo_sets: list[dict[str, list[Any]]] = [{}]
        if self.use_demos and any(pool.values()):
            for _ in range(self.n_candidates):
                k = search.rng.randint(1, self.max_demos)
                demo_sets.append({t: search.rng.sample(d, min(k, len(d))) for t, d in pool.items()})
        grid = [(i, j) for i in range(max(len(v) for v in options.values())) for j in range(len(demo_sets))]
        grid.remove((0, 0))  # the baseline itself
        search.rng.shuffle(grid)
        for i, j in grid[: self.n_candidates]:
            if not search.can(len(search.valset)):
                break
            params = _combine(search.baseline.params, options, i, demo_sets[j])
            search.validate(params, note=f"instructions #{i}, demo set #{j}")


def _combine(base: Params, options: dict[str, list[str]], i: int, demos: dict[str, list[Any]]) -> Params:
    out: Params = {}
    for target, p in base.items():
        choices = options.get(target) or [p.instruction or ""]
        update: dict[str, Any] = {"instruction": choices[i % len(choices)]}
        if demos.get(target):
            update["demos"] = demos[target]
        out[target] = (p if p is not None else NodeParams()).model_copy(update=update)
    return out
