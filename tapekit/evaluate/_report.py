"""The evaluation report: per-attempt records, pass@k / pass^k estimators, bootstrap intervals,
a rich table and JSON. :mod:`tapekit.evaluate` fills it; nothing here runs an agent. The statistics are
:mod:`tapekit.evaluate._stats` (exported by :mod:`tapekit.evaluate`).

Estimators (per task with ``n`` attempts of which ``c`` passed, then averaged over tasks):

- pass@1 = c / n;
- pass@k = 1 - C(n - c, k) / C(n, k): the chance that at least one of k attempts drawn without
  replacement from the n passes (the unbiased estimator of the Codex paper);
- pass^k = C(c, k) / C(n, k): the chance that all k drawn attempts pass (tau-bench's reliability
  measure; with n == k it is 1 when every attempt passed, else 0).

Confidence intervals are percentile bootstraps over tasks (tasks resampled with replacement),
seeded, so the same report always prints the same intervals.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from tapekit.evaluate._stats import DEFAULT_RESAMPLES, Estimate, bootstrap_mean, paired_difference


class Score(BaseModel):
    """What a scorer says about one tape: a ``value`` (higher is better, usually in [0, 1]),
    whether the attempt ``passed``, and optional text ``feedback`` (why; what to fix), which
    optimisers and reflection models read."""

    model_config = ConfigDict(frozen=True)

    value: float
    passed: bool
    feedback: str | None = None


class SampleResult(BaseModel):
    """One attempt at one task: where its tape is, what each scorer said, and what it cost.

    ``sample`` is the attempt's index (0 .. k-1); ``error`` the tape's ``metadata.error`` (the
    run failed) and ``scorer_errors`` the scorers that raised (their score is a fail whose
    feedback holds the exception). ``environment_failure`` says why the environment ended the
    episode by failing (a page that never loaded, a crashed browser:
    :func:`tapekit.environment.environment_failure`), None otherwise; such an attempt's score
    says nothing about the agent. ``environment_retries``: how many earlier tries of this attempt
    the environment failed (``evaluate(..., environment_retries=n)`` runs them again). ``cost``
    is in the LLMs' price units (dollars usually).
    """

    task_id: str
    category: str = ""
    sample: int = 0
    tape_id: str = ""
    scores: dict[str, Score] = Field(default_factory=dict)
    error: str | None = None
    scorer_errors: list[str] = Field(default_factory=list)
    environment_failure: str | None = None
    environment_retries: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    @property
    def tokens(self) -> int:
        """Prompt plus output tokens of the attempt's LLM calls."""
        return self.prompt_tokens + self.output_tokens


def _check_nck(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"passed count c={c} must be between 0 and n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} needs 1 <= k <= n={n} attempts per task")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: n attempts, c passed; 1 - C(n-c, k) / C(n, k)."""
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k for one task (every one of k attempts passes): C(c, k) / C(n, k)."""
    _check_nck(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


class JsonReport(BaseModel):
    """A report written as one JSON file: its fields, and its headline figures under
    ``"summary"`` (for people and other tools; recomputed, never read back; a NaN figure, such
    as the score of a group with no member, is written as ``null``, valid JSON).

    Subclasses give :meth:`summary_data`; :meth:`save` writes :meth:`to_json` and
    :meth:`load` reads a saved file back into the same class.
    """

    def summary_data(self) -> Any:
        """The figures written under ``"summary"`` (``None``: no summary)."""
        return None

    def to_json(self, indent: int | None = 2) -> str:
        """The report's fields as JSON, with :meth:`summary_data` under ``"summary"``."""
        data = self.model_dump(mode="json")
        summary = self.summary_data()
        if summary is not None:
            data["summary"] = _nan_as_null(summary)
        return json.dumps(data, indent=indent)

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path``; returns the path."""
        out = Path(path)
        out.write_text(self.to_json(), encoding="utf-8")
        return out

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """A report written by :meth:`save` (the summary is recomputed, not read)."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        data.pop("summary", None)
        return cls.model_validate(data)


def _nan_as_null(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_as_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_as_null(v) for v in value]
    return value


class EvalReport(JsonReport):
    """The outcome of an evaluation: every attempt's scores and costs, and the metrics over them.

    ``scorers`` lists the scorer names in order; the first is the primary one (the default of
    every metric). ``k`` is the number of attempts per task the evaluation made. Metrics are
    means over tasks with seeded bootstrap intervals (``n_bootstrap`` resamples of the tasks,
    ``confidence`` level, ``seed``). ``tapes`` and ``llm_calls`` (not saved) hold the final tapes
    by tape id and their LLM calls by prompt id when the report was made in this process.
    """

    name: str = "eval"
    k: int = 1
    scorers: list[str] = Field(default_factory=list)
    samples: list[SampleResult] = Field(default_factory=list)
    seed: int = 0
    n_bootstrap: int = DEFAULT_RESAMPLES
    confidence: float = 0.95
    _tapes: dict[str, Any] = PrivateAttr(default_factory=dict)
    _calls: dict[str, Any] = PrivateAttr(default_factory=dict)

    # ------------------------------------------------------------------ grouping

    @property
    def tapes(self) -> dict[str, Any]:
        """The final tapes by tape id (empty for a report loaded from JSON)."""
        return self._tapes

    @property
    def llm_calls(self) -> dict[str, Any]:
        """The attempts' LLM calls by prompt id, token ids included when the backend gave them
        (empty for a report loaded from JSON; the store keeps them too)."""
        return self._calls

    @property
    def task_ids(self) -> list[str]:
        """Task ids in the order their first attempt appears."""
        return list(dict.fromkeys(s.task_id for s in self.samples))

    @property
    def categories(self) -> list[str]:
        """The tasks' categories, sorted ("" is the category of uncategorised tasks)."""
        return sorted({s.category for s in self.samples})

    def by_task(self) -> dict[str, list[SampleResult]]:
        """Attempts grouped by task id, each group ordered by sample index."""
        groups: dict[str, list[SampleResult]] = {}
        for s in self.samples:
            groups.setdefault(s.task_id, []).append(s)
        return {t: sorted(g, key=lambda s: s.sample) for t, g in groups.items()}

    def for_category(self, category: str) -> EvalReport:
        """The same report restricted to the tasks of ``category``."""
        if category not in self.categories:
            raise KeyError(f"no tasks of category {category!r}; categories: {self.categories}")
        sub = self.model_copy(update={"samples": [s for s in self.samples if s.category == category]})
        sub._tapes = self._tapes
        sub._calls = self._calls
        return sub

    def by_category(self) -> dict[str, EvalReport]:
        """One sub-report per category."""
        return {c: self.for_category(c) for c in self.categories}

    # ------------------------------------------------------------------ metrics

    def _scorer(self, scorer: str | None) -> str:
        if scorer is None:
            if not self.scorers:
                raise ValueError("the report has no scorers")
            return self.scorers[0]
        if scorer not in self.scorers:
            raise KeyError(f"no scorer {scorer!r} in the report; scorers: {self.scorers}")
        return scorer

    def _per_task(self, fn: Callable[[list[SampleResult]], float]) -> list[float]:
        return [fn(group) for group in self.by_task().values()]

    def _estimate(self, values: list[float]) -> Estimate:
        return bootstrap_mean(values, self.n_bootstrap, self.confidence, self.seed)

    def _counts(self, group: list[SampleResult], scorer: str) -> tuple[int, int]:
        return len(group), sum(s.scores[scorer].passed for s in group if scorer in s.scores)

    def pass_at(self, k: int = 1, scorer: str | None = None) -> Estimate:
        """Mean over tasks of unbiased pass@k (at least one of k attempts passes), with its CI."""
        name = self._scorer(scorer)
        return self._estimate(self._per_task(lambda g: pass_at_k(*self._counts(g, name), k)))

    def pass_hat(self, k: int | None = None, scorer: str | None = None) -> Estimate:
        """Mean over tasks of unbiased pass^k (all k attempts pass; default k: the report's),
        with its CI."""
        name = self._scorer(scorer)
        kk = self.k if k is None else k
        return self._estimate(self._per_task(lambda g: pass_hat_k(*self._counts(g, name), kk)))

    def pass_at_1(self, scorer: str | None = None) -> Estimate:
        """Share of attempts that pass, averaged per task, with its CI."""
        return self.pass_at(1, scorer)

    def pass_at_k(self, scorer: str | None = None) -> Estimate:
        """pass@k for the report's own k."""
        return self.pass_at(self.k, scorer)

    def pass_hat_k(self, scorer: str | None = None) -> Estimate:
        """pass^k for the report's own k."""
        return self.pass_hat(self.k, scorer)

    def compare(self, other: EvalReport, scorer: str | None = None, by_category: bool = True) -> Estimate:
        """This report's pass@1 minus ``other``'s, paired by task, with a bootstrap interval.

        Both reports must hold the same task ids (two systems on one task set). The bootstrap
        resamples tasks within each category when ``by_category`` (a task-stratified bootstrap,
        see :func:`~tapekit.evaluate.paired_difference`). A difference whose interval holds 0 is
        no win (:meth:`Estimate.excludes_zero`).
        """
        name = self._scorer(scorer)
        mine, theirs = self.by_task(), other.by_task()
        if set(mine) != set(theirs):
            only_here = sorted(set(mine) - set(theirs))[:5]
            only_there = sorted(set(theirs) - set(mine))[:5]
            raise ValueError(
                f"compare needs the same tasks in both reports; only in this one: {only_here}, "
                f"only in the other: {only_there}"
            )
        order = sorted(mine)
        a = [pass_at_k(*self._counts(mine[t], name), 1) for t in order]
        b = [pass_at_k(*other._counts(theirs[t], other._scorer(scorer)), 1) for t in order]
        strata = [mine[t][0].category for t in order] if by_category else None
        return paired_difference(a, b, strata, self.n_bootstrap, self.confidence, self.seed)

    def mean_score(self, scorer: str | None = None) -> Estimate:
        """Mean score value (per task, then over tasks), with its CI."""
        name = self._scorer(scorer)

        def mean(group: list[SampleResult]) -> float:
            values = [s.scores[name].value for s in group if name in s.scores]
            return sum(values) / len(values) if values else 0.0

        return self._estimate(self._per_task(mean))

    @property
    def n_tasks(self) -> int:
        """How many tasks were evaluated."""
        return len(self.task_ids)

    @property
    def n_errors(self) -> int:
        """Attempts whose run failed (a tape with ``metadata.error``)."""
        return sum(s.error is not None for s in self.samples)

    @property
    def n_environment_failures(self) -> int:
        """Attempts the environment ended by failing (their scores say nothing of the agent;
        :meth:`without_environment_failures` leaves them out)."""
        return sum(s.environment_failure is not None for s in self.samples)

    def without_environment_failures(self) -> EvalReport:
        """This report without the attempts the environment failed: what the agent's figures
        should be computed from when the environment, not the agent, ended some episodes."""
        return self.model_copy(update={"samples": [s for s in self.samples if s.environment_failure is None]})

    @property
    def tokens_per_attempt(self) -> float:
        """Mean prompt plus output tokens of one attempt."""
        return sum(s.tokens for s in self.samples) / max(len(self.samples), 1)

    @property
    def cost_per_attempt(self) -> float:
        """Mean cost of one attempt."""
        return sum(s.cost for s in self.samples) / max(len(self.samples), 1)

    @property
    def tokens_per_task(self) -> float:
        """Mean tokens spent on one task (all its attempts together)."""
        return self.total_tokens / max(self.n_tasks, 1)

    @property
    def cost_per_task(self) -> float:
        """Mean cost of one task (all its attempts together)."""
        return self.total_cost / max(self.n_tasks, 1)

    @property
    def total_tokens(self) -> int:
        """Tokens of every attempt together."""
        return sum(s.tokens for s in self.samples)

    @property
    def total_cost(self) -> float:
        """Cost of every attempt together."""
        return sum(s.cost for s in self.samples)

    def summary(self, scorer: str | None = None) -> dict[str, Any]:
        """The headline figures for one scorer as plain data (what a table row shows)."""
        name = self._scorer(scorer)
        return {
            "scorer": name,
            "tasks": self.n_tasks,
            "attempts": len(self.samples),
            "k": self.k,
            "pass@1": self.pass_at_1(name).model_dump(),
            f"pass@{self.k}": self.pass_at_k(name).model_dump(),
            f"pass^{self.k}": self.pass_hat_k(name).model_dump(),
            "mean_score": self.mean_score(name).model_dump(),
            "run_errors": self.n_errors,
            "environment_failures": self.n_environment_failures,
            "scorer_errors": sum(name in s.scorer_errors for s in self.samples),
            "tokens_per_attempt": self.tokens_per_attempt,
            "cost_per_attempt": self.cost_per_attempt,
            "tokens_per_task": self.tokens_per_task,
            "cost_per_task": self.cost_per_task,
            "total_tokens": self.total_tokens,
            "total_cost": self.total_cost,
        }

    def failures(self, scorer: str | None = None) -> list[SampleResult]:
        """The attempts that did not pass ``scorer`` (what a reflection step reads first)."""
        name = self._scorer(scorer)
        return [s for s in self.samples if name in s.scores and not s.scores[name].passed]

    # ------------------------------------------------------------------ output

    def table(self, title: str | None = None) -> Any:
        """A ``rich.table.Table``: one row per scorer for all tasks, then per category."""
        from rich.table import Table

        k = self.k
        table = Table(title=title or f"eval {self.name}: {self.n_tasks} tasks x {k} attempts")
        metrics = ["pass@1", f"pass@{k}", f"pass^{k}"] if k > 1 else ["pass@1"]
        for col in ("scorer", "category", "tasks", *metrics, "mean score"):
            table.add_column(col, justify="left" if col in ("scorer", "category") else "right")
        table.add_column("tokens/attempt", justify="right")
        table.add_column("cost/attempt", justify="right")
        table.add_column("errors", justify="right")
        groups: list[tuple[str, EvalReport]] = [("all", self)]
        if self.categories != [""]:
            groups += [(c or "(none)", r) for c, r in self.by_category().items()]
        for name in self.scorers:
            for label, report in groups:
                values = [report.pass_at_1(name)]
                if k > 1:
                    values += [report.pass_at_k(name), report.pass_hat_k(name)]
                table.add_row(
                    name,
                    label,
                    str(report.n_tasks),
                    *(v.short() for v in values),
                    report.mean_score(name).short(),
                    f"{report.tokens_per_attempt:,.0f}",
                    f"{report.cost_per_attempt:.4g}",
                    str(report.n_errors),
                )
        return table

    def to_text(self, width: int = 160) -> str:
        """The table as plain text (no colours), e.g. for logs and tests."""
        import io

        from rich.console import Console

        console = Console(width=width, record=True, color_system=None, file=io.StringIO())
        console.print(self.table())
        return console.export_text()

    def print(self) -> None:
        """Print the table to the terminal."""
        from rich.console import Console

        Console().print(self.table())

    def summary_data(self) -> dict[str, Any]:
        """Each scorer's :meth:`summary`, by scorer name (written under ``"summary"``)."""
        return {name: self.summary(name) for name in self.scorers}
