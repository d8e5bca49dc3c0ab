"""Reflective optimisation (GEPA-like): a reflection LLM reads failing tapes with the metric's
text feedback and rewrites the instruction of one targeted node; candidates are kept on a
Pareto front over the validation tasks.

Each iteration:

1. pick a parent from the Pareto front (a candidate that is best on at least one validation
   task, and not dominated), at random weighted by how many tasks it is best on (seeded);
2. pick the next target node (round robin over the targets);
3. run the parent on a minibatch of training tasks; if every attempt passed, try again;
4. show the reflection LLM the target's current instruction and, for each attempt, what the
   node saw and made with the metric's feedback; it answers with a new instruction (in
   ```` ``` ```` fences, or plain text);
5. run the child on the same minibatch; only if it scores higher than the parent there is it
   scored on the validation tasks and added to the candidates.
"""

from __future__ import annotations

import random
import re

from tapekit.core import Prompt
from tapekit.evaluate import EvalReport
from tapekit.llm.base import LLM
from tapekit.optimize._run import Candidate, Search, merged
from tapekit.optimize.base import Optimizer, feedback_of, node_runs, render_run

_REFLECT_SYSTEM = (
    "You improve one step (a node) of an LLM agent by rewriting its instruction. You see the "
    "current instruction and the node's inputs and outputs on some tasks, with the evaluator's "
    "feedback on each whole attempt. Work out what the node does wrong, then write a new "
    "instruction that fixes it while keeping what works. Give the new instruction between ``` fences."
)


def pareto_front(candidates: list[Candidate]) -> list[tuple[Candidate, int]]:
    """The non-dominated candidates that are best on at least one validation task, each with
    the number of tasks it is best on."""
    scored = [(c, c.task_scores()) for c in candidates if c.val is not None]
    tasks = {t for _, s in scored for t in s}
    wins: dict[str, int] = {}
    for task in tasks:
        top = max(s.get(task, 0.0) for _, s in scored)
        for c, s in scored:
            if s.get(task, 0.0) == top:
                wins[c.id] = wins.get(c.id, 0) + 1

    def dominated(a: dict[str, float]) -> bool:
        return any(
            all(b.get(t, 0.0) >= a.get(t, 0.0) for t in tasks)
            and any(b.get(t, 0.0) > a.get(t, 0.0) for t in tasks)
            for _, b in scored
        )

    return [(c, wins[c.id]) for c, s in scored if c.id in wins and not dominated(s)]


def select_parent(candidates: list[Candidate], rng: random.Random) -> Candidate:
    """A parent from the Pareto front, weighted by the number of tasks it is best on."""
    front = pareto_front(candidates)
    if not front:
        return candidates[0]
    return rng.choices([c for c, _ in front], weights=[w for _, w in front])[0]


def reflection_prompt(target: str, instruction: str, attempts: list[tuple[str, str]]) -> Prompt:
    """The reflection LLM's prompt: ``attempts`` are ``(node run text, feedback)``."""
    parts = [f"Node: {target}", f"Current instruction:\n```\n{instruction or '(none)'}\n```"]
    for i, (run, feedback) in enumerate(attempts, 1):
        parts.append(f"Attempt {i}:\n{run}\nFeedback: {feedback}")
    parts.append("Write the new instruction for this node between ``` fences.")
    return Prompt(
        messages=[
            {"role": "system", "content": _REFLECT_SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)},
        ]
    )


def parse_reflection(text: str) -> str:
    """The instruction in a reflection answer: the last fenced block, else the whole text."""
    blocks = re.findall(r"```[a-zA-Z]*\n?(.*?)```", text, re.S)
    return (blocks[-1] if blocks else text).strip()


def _total(report: EvalReport) -> float:
    scorer = report.scorers[0]
    return sum(s.scores[scorer].value for s in report.samples)


class Reflective(Optimizer):
    """GEPA-like reflective instruction search (see the module docstring). ``reflector`` is
    the reflection LLM; ``minibatch`` training tasks per iteration; at most ``max_iterations``."""

    reflector: LLM
    minibatch: int = 3
    max_iterations: int = 20
    n_attempts_shown: int = 3

    def search(self, search: Search) -> None:
        """Reflect, mutate and keep improving candidates on the Pareto front until the budget
        (or ``max_iterations``) runs out."""
        pool = [search.baseline]
        size = min(self.minibatch, len(search.trainset))
        for iteration in range(self.max_iterations):
            if not search.can(2 * size + len(search.valset)):
                break
            parent = select_parent(pool, search.rng)
            target = search.targets[iteration % len(search.targets)]
            batch = search.rng.sample(search.trainset, size)
            before = search.run(parent.params, batch, parent.id, "train")
            attempts = self._attempts(search, parent, before, target)
            if not attempts:
                continue
            current = parent.params[target].instruction or ""
            answer = self.reflector.generate(reflection_prompt(target, current, attempts)).content or ""
            proposed = parse_reflection(answer)
            if not proposed or proposed == current:
                continue
            child = merged(parent.params, target, instruction=proposed)
            child_id = search.new_id()
            after = search.run(child, batch, child_id, "train")
            if _total(after) <= _total(before):
                continue
            made = search.validate(child, parent=parent.id, note=f"rewrote {target}", candidate_id=child_id)
            if made is not None:
                pool.append(made)

    def _attempts(
        self, search: Search, parent: Candidate, report: EvalReport, target: str
    ) -> list[tuple[str, str]]:
        scorer = report.scorers[0]
        failed = [s for s in report.samples if not s.scores[scorer].passed]
        agent = search.agent_with(parent.params)
        out = []
        for sample in failed[: self.n_attempts_shown]:
            runs = list(node_runs(agent, report.tapes[sample.tape_id], [target]))
            text = "\n---\n".join(render_run(r) for r in runs) or f"(node {target} did not run)"
            if sample.error:
                text += f"\nThe attempt failed with an error: {sample.error}"
            out.append((text, feedback_of(sample, scorer)))
        return out
