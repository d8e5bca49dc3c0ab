"""Demo optimisers: demos taken from the node runs of good training tapes.

- :class:`AddDemos` is the paper's Listing 1: run the agent on the training tasks, take a demo
  from every run of each target node on the tapes that passed, and keep a seeded random
  ``max_demos`` of them per node.
- :class:`BootstrapFewShot` makes the same pool, then runs a seeded random search over demo
  sets (sizes 1..``max_demos``) and keeps the set with the best validation score.

Both take an optional ``teacher`` agent: the pool then comes from the teacher's passed tapes on
the training tasks (a stronger policy, a programmatic one, a larger model), read by the target
nodes' ``extract_demo``. The teacher's rollouts count against the budget like any other.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import ConfigDict

from tapekit.agent import Agent
from tapekit.evaluate import EvalReport
from tapekit.optimize._run import Search
from tapekit.optimize._targets import NodeParams, Params
from tapekit.optimize.base import Optimizer, demos_from_report, demos_from_teacher


def bootstrap_report(
    search: Search, params: Params | None = None, teacher: Agent | None = None
) -> EvalReport | None:
    """Run the training tasks (as many as the budget allows after one validation) with
    ``params`` (the base agent's own by default), or with ``teacher`` when given; None when the
    budget leaves no training rollout."""
    params = params if params is not None else search.baseline.params
    n = min(len(search.trainset), search.left - len(search.valset))
    if n <= 0:
        return None
    if teacher is not None:
        return search.run_agent(teacher, search.trainset[:n], "teacher", "train")
    source = search.baseline.id if params is search.baseline.params else search.new_id()
    return search.run(params, search.trainset[:n], source, "train")


def pool_from_report(
    search: Search, report: EvalReport | None, params: Params, teacher: Agent | None = None
) -> dict[str, list[Any]]:
    """The demos of ``report``'s passed tapes, read by the target nodes of the agent with
    ``params`` (so the reading follows the node's own settings, e.g. its rationale)."""
    if report is None:
        return {t: [] for t in search.targets}
    agent = search.agent_with(params)
    if teacher is not None:
        return demos_from_teacher(agent, teacher, report, search.targets)
    return demos_from_report(agent, report, search.targets)


def bootstrap_pool(
    search: Search, params: Params | None = None, teacher: Agent | None = None
) -> dict[str, list[Any]]:
    """Run the training tasks (:func:`bootstrap_report`) and collect demos from the passed
    tapes."""
    params = params if params is not None else search.baseline.params
    return pool_from_report(search, bootstrap_report(search, params, teacher), params, teacher)


def with_demos(base: Params, chosen: dict[str, list[Any]]) -> Params:
    out = {t: p.model_copy() for t, p in base.items()}
    for target, demos in chosen.items():
        if demos:
            out[target] = out.get(target, NodeParams()).model_copy(update={"demos": demos})
    return out


def sample_demos(pool: dict[str, list[Any]], k: int, rng: random.Random) -> dict[str, list[Any]]:
    return {t: rng.sample(demos, min(k, len(demos))) for t, demos in pool.items()}


class AddDemos(Optimizer):
    """Demos from the runs of successful training tapes (the paper's ``add_demos``): at most
    ``max_demos`` per target node, picked at random (seeded) when there are more. With
    ``teacher``, the tapes are the teacher's."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    max_demos: int = 4
    teacher: Agent | None = None

    def search(self, search: Search) -> None:
        """Bootstrap the demo pool, then validate one demo set."""
        pool = bootstrap_pool(search, teacher=self.teacher)
        if not any(pool.values()):
            return
        chosen = sample_demos(pool, self.max_demos, search.rng)
        search.validate(with_demos(search.baseline.params, chosen), note=_count(chosen))


class BootstrapFewShot(Optimizer):
    """Random search over demo sets from the bootstrapped pool: up to ``n_candidates`` sets of
    1..``max_demos`` demos per target (seeded), each scored on the validation tasks. With
    ``teacher``, the pool comes from the teacher's tapes."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    max_demos: int = 4
    n_candidates: int = 6
    teacher: Agent | None = None

    def search(self, search: Search) -> None:
        """Bootstrap the pool, then validate random demo sets while the budget lasts."""
        pool = bootstrap_pool(search, teacher=self.teacher)
        if not any(pool.values()):
            return
        tried: set[str] = set()
        for _ in range(self.n_candidates * 3):
            if len(tried) >= self.n_candidates or not search.can(len(search.valset)):
                break
            k = search.rng.randint(1, self.max_demos)
            chosen = sample_demos(pool, k, search.rng)
            key = repr(sorted((t, [repr(d) for d in ds]) for t, ds in chosen.items()))
            if key in tried:
                continue
            tried.add(key)
            search.validate(with_demos(search.baseline.params, chosen), note=_count(chosen))


def _count(chosen: dict[str, list[Any]]) -> str:
    return ", ".join(f"{t}: {len(d)} demos" for t, d in chosen.items() if d)
