"""The judge and the search state that every optimiser shares.

:class:`Judge` runs candidates through :func:`tapekit.evaluate.aevaluate` and counts every tape
as one rollout; it refuses, before running anything, an evaluation that would go over the
budget, so the budget is never exceeded. With a store, every tape is tagged ``optimize:<run>``
and ``optimize:<run>:candidate:<id>``, the id of the configuration that made it: ``baseline``,
a validated candidate, or a proposal that was tried on training tasks and rejected.

:class:`Search` is what one optimiser sees: the base agent and its targets, the train and
validation tasks, the baseline candidate, a seeded ``rng``, its share of the budget, and the
candidates it has scored so far.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tapekit._sync import run_sync
from tapekit.agent import Agent
from tapekit.errors import TapekitError
from tapekit.evaluate import EvalReport, SampleResult, Task, aevaluate
from tapekit.optimize._targets import NodeParams, Params, with_params
from tapekit.store.base import TapeStore


class BudgetExhausted(TapekitError):
    """An evaluation would need more rollouts than the budget has left (nothing was run)."""


def candidate_tag(run: str, candidate_id: str) -> str:
    """The store tag on every tape of candidate ``candidate_id`` in optimisation run ``run``."""
    return f"optimize:{run}:candidate:{candidate_id}"


@dataclass
class Candidate:
    """One configuration tried: its parameters by target, where it came from, its scores on
    the validation tasks (``val`` is None until it has been validated) and the wall seconds its
    validation took (episodes resumed from a store cost next to nothing)."""

    id: str
    params: Params
    optimizer: str
    parent: str | None = None
    note: str = ""
    val: EvalReport | None = None
    seconds: float = 0.0

    def task_scores(self, scorer: str | None = None) -> dict[str, float]:
        """The mean score per validation task (by the primary scorer unless named)."""
        if self.val is None:
            return {}
        return {t: _mean(g, scorer or self.val.scorers[0]) for t, g in self.val.by_task().items()}

    def mean(self, scorer: str | None = None) -> float:
        """The mean validation score (0 when not validated)."""
        return self.val.mean_score(scorer).value if self.val is not None else 0.0


def _mean(group: list[SampleResult], scorer: str) -> float:
    return sum(s.scores[scorer].value for s in group) / len(group)


class Judge:
    """Evaluates candidates within a rollout budget (every tape of every evaluation counts)."""

    def __init__(
        self,
        environment: Any,
        metric: Any,
        budget: int,
        store: TapeStore | None,
        run: str,
        batch_options: Mapping[str, Any],
    ) -> None:
        self.environment = environment
        self.metric = metric
        self.budget = budget
        self.store = store
        self.run = run
        self.batch_options = dict(batch_options)
        self.used = 0
        self._n = 0

    @property
    def left(self) -> int:
        """Rollouts the budget has left."""
        return self.budget - self.used

    def evaluate(
        self, agent: Agent, tasks: list[Task], candidate_id: str, split: str, counted: bool = True
    ) -> EvalReport:
        """Run ``agent`` once on each task and score it; raises :class:`BudgetExhausted`
        (running nothing) when the tasks do not fit in what is left. ``counted=False`` runs
        outside the budget (the test split, after the choice)."""
        if counted:
            if len(tasks) > self.left:
                raise BudgetExhausted(
                    f"evaluating candidate {candidate_id!r} on {len(tasks)} {split} tasks needs "
                    f"{len(tasks)} rollouts; the budget has {self.left} of {self.budget} left"
                )
            self.used += len(tasks)
        self._n += 1
        name = f"optimize/{self.run}/{self._n}-{candidate_id}-{split}"
        report = run_sync(
            aevaluate(
                agent, self.environment, tasks, self.metric, name=name, store=self.store, **self.batch_options
            )
        )
        if self.store is not None:
            tags = [
                f"optimize:{self.run}",
                candidate_tag(self.run, candidate_id),
                f"optimize:{self.run}:{split}",
            ]
            for sample in report.samples:
                self.store.add_tags(sample.tape_id, tags)
        return report


@dataclass
class Search:
    """The state one optimiser works with (see the module docstring)."""

    name: str
    agent: Agent
    targets: list[str]
    trainset: list[Task]
    valset: list[Task]
    judge: Judge
    baseline: Candidate
    rng: random.Random
    limit: int
    used: int = 0
    candidates: list[Candidate] = field(default_factory=list)
    proposals: int = 0

    @property
    def left(self) -> int:
        """Rollouts left to this optimiser (its share, and what the whole budget has left)."""
        return min(self.limit - self.used, self.judge.left)

    def can(self, n: int) -> bool:
        """Whether ``n`` more rollouts fit."""
        return 0 < n <= self.left

    def agent_with(self, params: Params) -> Agent:
        """The base agent with ``params`` applied."""
        return with_params(self.agent, params)

    def new_id(self) -> str:
        """A fresh candidate id, e.g. ``reflective-3`` (a proposal that is never validated keeps
        its id on the tapes it made)."""
        self.proposals += 1
        return f"{self.name}-{self.proposals}"

    def run(self, params: Params, tasks: list[Task], candidate_id: str, split: str = "train") -> EvalReport:
        """Evaluate the configuration ``params`` on ``tasks`` (counted against this share)."""
        return self.run_agent(self.agent_with(params), tasks, candidate_id, split)

    def run_agent(
        self, agent: Agent, tasks: list[Task], candidate_id: str, split: str = "train"
    ) -> EvalReport:
        """Evaluate another agent (a teacher) on ``tasks``, counted against this share."""
        if len(tasks) > self.left:
            raise BudgetExhausted(
                f"optimiser {self.name!r}: {len(tasks)} rollouts needed, {self.left} left of its share"
            )
        report = self.judge.evaluate(agent, tasks, candidate_id, split)
        self.used += len(tasks)
        return report

    def validate(
        self, params: Params, parent: str | None = None, note: str = "", candidate_id: str | None = None
    ) -> Candidate | None:
        """Score ``params`` on the validation tasks and keep it as a candidate (under
        ``candidate_id``, or a new id); None when the budget cannot pay for it."""
        if not self.can(len(self.valset)):
            return None
        cid = candidate_id or self.new_id()
        candidate = Candidate(id=cid, params=params, optimizer=self.name, parent=parent, note=note)
        started = time.perf_counter()
        candidate.val = self.run(params, self.valset, cid, "val")
        candidate.seconds = time.perf_counter() - started
        self.candidates.append(candidate)
        return candidate

    def best(self) -> Candidate:
        """The candidate with the highest mean validation score (the baseline on ties)."""
        best = self.baseline
        for c in self.candidates:
            if c.val is not None and c.mean() > best.mean():
                best = c
        return best


def merged(base: Params, target: str, **changes: Any) -> Params:
    """``base`` with ``target``'s parameters changed (a new dict; ``base`` is untouched)."""
    out = {t: p.model_copy() for t, p in base.items()}
    current = out.get(target, NodeParams())
    out[target] = current.model_copy(update=changes)
    return out
