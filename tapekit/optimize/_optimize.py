"""The one entry point: ``optimize(agent, trainset, valset, metric, optimizer=..., budget=...)``."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapekit.agent import Agent
from tapekit.core import new_id
from tapekit.evaluate import Estimate, EvalReport, Task
from tapekit.optimize._run import BudgetExhausted, Candidate, Judge, Search
from tapekit.optimize._targets import OptimizeError, read_params, resolve_targets, save_optimized, with_params
from tapekit.optimize.base import Optimizer
from tapekit.store.base import TapeStore


@dataclass
class OptimizerRun:
    """What one optimiser did: its best candidate, every candidate it validated, the rollouts
    it used (training and validation tapes), and the ids it gave out (``<name>-1`` ..
    ``<name>-<proposals>``: the validated candidates and the proposals rejected before)."""

    name: str
    best: Candidate
    candidates: list[Candidate]
    rollouts: int
    error: str | None = None
    proposals: int = 0


@dataclass
class OptimizeResult:
    """The outcome of :func:`optimize`: the optimised ``agent`` (the best candidate over all
    optimisers, or a copy of the original when nothing beat it), the ``baseline`` and each
    optimiser's run, and the rollouts used out of the budget."""

    agent: Agent
    targets: list[str]
    baseline: Candidate
    runs: list[OptimizerRun]
    best: Candidate
    budget: int
    rollouts_used: int
    run_id: str
    scorers: list[str] = field(default_factory=list)
    test_baseline: EvalReport | None = None
    test_best: EvalReport | None = None

    def test_difference(self, scorer: str | None = None) -> Estimate:
        """The chosen candidate's test pass@1 minus the baseline's, paired by task with a
        task-stratified bootstrap interval (:meth:`EvalReport.compare`). Needs ``testset``."""
        if self.test_baseline is None or self.test_best is None:
            raise OptimizeError("no test split: pass testset= to optimize() to get test figures")
        return self.test_best.compare(self.test_baseline, scorer)

    def table(self, title: str | None = None) -> Any:
        """The before/after report as a rich table: the validation metric (each scorer) before
        and after each optimiser, candidates tried and rollouts used."""
        from rich.table import Table

        table = Table(title=title or f"optimize {self.run_id}: validation metric before -> after")
        table.add_column("optimiser")
        for scorer in self.scorers:
            table.add_column(f"{scorer} before", justify="right")
            table.add_column(f"{scorer} after", justify="right")
        if self.test_best is not None:
            table.add_column("test before", justify="right")
            table.add_column("test after", justify="right")
        table.add_column("candidates", justify="right")
        table.add_column("rollouts", justify="right")
        for run in self.runs:
            cells = []
            for scorer in self.scorers:
                cells += [f"{self.baseline.mean(scorer):.3f}", f"{run.best.mean(scorer):.3f}"]
            if self.test_baseline is not None and self.test_best is not None:
                chosen = run.best is self.best
                cells += [
                    f"{self.test_baseline.mean_score().value:.3f}",
                    f"{self.test_best.mean_score().value:.3f}" if chosen else "-",
                ]
            table.add_row(
                run.name + (" (error)" if run.error else ""),
                *cells,
                str(len(run.candidates)),
                str(run.rollouts),
            )
        table.caption = (
            f"{self.rollouts_used} of {self.budget} rollouts used; "
            f"{len(self.baseline.task_scores())} validation tasks"
        )
        if self.test_baseline is not None:
            table.caption += (
                f"; test ({self.test_baseline.n_tasks} tasks, evaluated once, after the choice): "
                f"after - before = {self.test_difference()}"
            )
        return table

    def to_text(self, width: int = 140) -> str:
        """The table as plain text."""
        import io

        from rich.console import Console

        console = Console(width=width, file=io.StringIO())
        console.print(self.table())
        return console.file.getvalue()  # type: ignore[attr-defined]

    def print(self) -> None:
        """Print the table."""
        from rich.console import Console

        console = Console()
        if not console.is_terminal:  # piped or captured: wide enough for every column
            console = Console(width=160)
        console.print(self.table())

    def save(self, path: str | Path) -> Path:
        """Save the optimised agent's instructions, demos and the node options its candidate set
        as a JSON config (reload it with :func:`~tapekit.optimize.load_optimized`)."""
        options = {t: list(p.options) for t, p in self.best.params.items() if p.options}
        return save_optimized(self.agent, path, self.targets, options=options)


def _check_tasks(tasks: Sequence[Task], what: str) -> list[Task]:
    items = list(tasks)
    if not items:
        raise OptimizeError(f"{what} is empty")
    for i, task in enumerate(items):
        if not isinstance(task, Task):
            raise OptimizeError(f"{what}[{i}] is a {type(task).__name__}, not a tapekit Task")
    return items


def optimize(
    agent: Agent,
    trainset: Sequence[Task],
    valset: Sequence[Task],
    metric: Any,
    optimizer: Optimizer | Sequence[Optimizer],
    budget: int,
    store: TapeStore | None = None,
    targets: list[str] | None = None,
    seed: int = 0,
    *,
    environment: Any = None,
    run_id: str | None = None,
    testset: Sequence[Task] | None = None,
    **batch_options: Any,
) -> OptimizeResult:
    """Optimise the instructions and demos of ``agent``'s optimisable nodes.

    - ``metric``: a scorer ``(tape, task) -> Score | bool`` or ``{name: scorer}`` (the first
      is what optimisers maximise; its ``Score.feedback`` is what reflection reads).
    - ``optimizer``: one optimiser or several; each starts from ``agent`` and gets an equal
      share of what the budget has left after the baseline.
    - ``budget``: the most rollouts (agent runs on a task, every evaluation tape counts,
      the baseline's validation included); never exceeded.
    - ``store``: every tape is stored, tagged ``optimize:<run_id>`` and
      ``optimize:<run_id>:candidate:<candidate id>``.
    - ``targets``: the nodes to optimise (``["agent.node", ...]``); all optimisable nodes by default.
    - ``environment``: answers the agent's actions (tools); ``batch_options`` go to the batch runner.
    - ``testset``: tasks no choice is made on. After the best candidate is chosen on ``valset``,
      the baseline and the chosen agent are evaluated once on them (``test_baseline``,
      ``test_best``, :meth:`OptimizeResult.test_difference`); these rollouts are outside
      ``budget``, and their tapes are tagged ``optimize:<run_id>:test`` (and with their
      candidate's tag, as every tape of the run).
    """
    if environment is None:
        from tapekit.environment import ToolEnvironment

        environment = ToolEnvironment()
    train = _check_tasks(trainset, "trainset")
    val = _check_tasks(valset, "valset")
    test = _check_tasks(testset, "testset") if testset is not None else None
    if test is not None:
        shared = {t.id for t in test} & {t.id for t in [*train, *val]}
        if shared:
            raise OptimizeError(
                f"testset shares task ids with trainset/valset: {sorted(shared)[:5]}; a test split "
                "must be disjoint from what choices are made on"
            )
    optimizers = [optimizer] if isinstance(optimizer, Optimizer) else list(optimizer)
    if not optimizers or not all(isinstance(o, Optimizer) for o in optimizers):
        raise OptimizeError("optimizer must be an Optimizer or a non-empty list of them (AddDemos(), ...)")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < len(val):
        raise OptimizeError(
            f"budget must be an int of at least len(valset) = {len(val)} rollouts "
            f"(the baseline's validation), got {budget!r}"
        )
    names = resolve_targets(agent, targets)
    run_id = run_id or new_id()[:8]
    judge = Judge(environment, metric, budget, store, run_id, batch_options)
    baseline = Candidate(id="baseline", params=read_params(agent, names), optimizer="baseline")
    started = time.perf_counter()
    baseline.val = judge.evaluate(with_params(agent, baseline.params), val, "baseline", "val")
    baseline.seconds = time.perf_counter() - started
    scorers = list(baseline.val.scorers) if isinstance(metric, Mapping) else baseline.val.scorers[:1]
    share = judge.left // len(optimizers)
    runs: list[OptimizerRun] = []
    for i, opt in enumerate(optimizers):
        search = Search(
            name=opt.name or f"optimizer{i}",
            agent=agent,
            targets=names,
            trainset=train,
            valset=val,
            judge=judge,
            baseline=baseline,
            rng=random.Random(f"{seed}:{i}:{opt.name}"),
            limit=share,
        )
        error = None
        try:
            opt.search(search)
        except BudgetExhausted as e:
            error = str(e)
        runs.append(
            OptimizerRun(
                opt.name, search.best(), list(search.candidates), search.used, error, search.proposals
            )
        )
    best = baseline
    for run in runs:
        if run.best.mean() > best.mean():
            best = run.best
    chosen = with_params(agent, best.params)
    test_baseline = test_best = None
    if test is not None:
        test_baseline = judge.evaluate(agent, test, "baseline", "test", counted=False)
        test_best = judge.evaluate(chosen, test, best.id, "test", counted=False)
    return OptimizeResult(
        agent=chosen,
        targets=names,
        baseline=baseline,
        runs=runs,
        best=best,
        budget=budget,
        rollouts_used=judge.used,
        run_id=run_id,
        scorers=scorers,
        test_baseline=test_baseline,
        test_best=test_best,
    )
