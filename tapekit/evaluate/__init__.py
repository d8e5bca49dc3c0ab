"""Evaluate an agent on tasks: k attempts per task through the batch runner, every tape scored.

A :class:`Task` is a start tape (or a question) with an id, a category and whatever its scorers
need (``expected``, ``metadata``). A scorer is a function ``(tape, task) -> Score`` (a ``bool``
is accepted as pass/fail; an ``async def`` scorer is awaited, so an LLM judge fits); several
scorers are reported side by side, e.g. ``{"strict": exact, "lenient": contains}``, so a gain
in format alone never passes for learning.

:func:`evaluate` runs ``k`` attempts of each task with :func:`tapekit.batch.abatch` (attempt
``j`` of task ``t`` starts from the task's tape under the batch id ``"t#j"``, so the k attempts
are k distinct tapes), scores each tape as it finishes, and returns an :class:`EvalReport` with
pass@1, pass@k, pass^k, bootstrap intervals, tokens and cost per attempt and a per-category
breakdown. With a store the tapes are stored as the batch stores them, tagged with the
evaluation's name and each attempt's task and sample index (:func:`eval_tags`), and running the
same evaluation again resumes it. :func:`rescore` scores stored tapes again with new scorers and
makes no LLM call.

The statistics (:mod:`tapekit.evaluate._stats`, formulas there) are exported here too:
:func:`bootstrap_mean`, :func:`paired_difference` and :func:`mcnemar_exact` for one run of each
system, :func:`seed_paired_difference` when each arm was trained with several training seeds
(the seed is the unit: an item bootstrap inside tasks and a seed-level Student-t interval), and
the exact helpers :func:`clopper_pearson`, :func:`student_t_interval` and
:func:`student_t_quantile`. :func:`bootstrap_configs` reads a hyperparameter sweep's runs
(:func:`tapekit.training.run_sweep`): the best configuration's score with an interval that
accounts for choosing it, and each hyperparameter's effect (:mod:`tapekit.evaluate._configs`).
Every bootstrap defaults to 10,000 resamples.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tapekit._sync import run_sync
from tapekit.core import StepSequence, Tape
from tapekit.evaluate._configs import ConfigBootstrap, ConfigScore, ValueEffect, bootstrap_configs
from tapekit.evaluate._distributions import student_t_quantile
from tapekit.evaluate._report import EvalReport, JsonReport, SampleResult, Score, pass_at_k, pass_hat_k
from tapekit.evaluate._scorers import contains_answer, exact_answer, final_answer
from tapekit.evaluate._stats import (
    DEFAULT_RESAMPLES,
    Estimate,
    SeedPairedDifference,
    bootstrap_mean,
    clopper_pearson,
    mcnemar_exact,
    paired_difference,
    seed_paired_difference,
    student_t_interval,
)
from tapekit.llm.base import LLMCall, llm_calls_of
from tapekit.store.base import TapeFilter, TapeStore

__all__ = [
    "ConfigBootstrap",
    "ConfigScore",
    "Estimate",
    "EvalReport",
    "JsonReport",
    "SampleResult",
    "Score",
    "Scorer",
    "SeedPairedDifference",
    "Task",
    "ValueEffect",
    "aevaluate",
    "aevaluate_iter",
    "arescore",
    "bootstrap_configs",
    "bootstrap_mean",
    "clopper_pearson",
    "contains_answer",
    "eval_tags",
    "evaluate",
    "exact_answer",
    "final_answer",
    "mcnemar_exact",
    "paired_difference",
    "pass_at_k",
    "pass_hat_k",
    "rescore",
    "seed_paired_difference",
    "student_t_interval",
    "student_t_quantile",
]

Scorer = Callable[[Tape[Any, Any], "Task"], Score | bool | Awaitable[Score | bool]]
"""A scorer: ``(final tape, task) -> Score`` (or a bool, or an awaitable of either)."""

Scorers = Scorer | Mapping[str, Scorer]

_SEP = "#"
_RETRY = "~"


class Task(BaseModel):
    """One evaluation task.

    ``start`` is the tape the agent starts from; a task with only a ``question`` starts from a
    tape holding one :class:`~tapekit.dialog.UserStep` with it. ``category`` groups tasks in
    the report (difficulty, type); ``expected`` and ``metadata`` are for the scorers.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str
    start: Tape | None = None  # type: ignore[type-arg]  # bare: a typed tape keeps its class
    question: str | None = None
    category: str = ""
    expected: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def start_tape(self) -> Tape[Any, Any]:
        """The tape an attempt starts from (the ``start`` tape, else one made of the question)."""
        if self.start is not None:
            return self.start
        if self.question is None:
            raise ValueError(f"task {self.id!r} has neither a start tape nor a question")
        from tapekit.dialog import UserStep

        return Tape(steps=StepSequence([UserStep(content=self.question)]))


def eval_tags(name: str) -> tuple[str, str, str]:
    """The store tags of evaluation ``name``: every attempt, the passed ones and the failed ones
    (by the primary scorer). Each attempt also gets ``eval:<name>:task:<task id>`` and
    ``eval:<name>:sample:<j>``."""
    return f"eval:{name}", f"eval:{name}:passed", f"eval:{name}:failed"


def _start_id(task_id: str, sample: int, retry: int = 0) -> str:
    """Attempt ``sample`` of ``task_id``: ``"t#j"``; its ``retry``-th run after the environment
    failed it: ``"t#j~retry"``."""
    return f"{task_id}{_SEP}{sample}" + (f"{_RETRY}{retry}" if retry else "")


def _parse_start_id(start_id: str | None, where: str) -> tuple[str, int]:
    task_id, sep, index = (start_id or "").rpartition(_SEP)
    index, _, retry = index.partition(_RETRY)
    if not sep or not task_id or not index.isdigit() or not (retry == "" or retry.isdigit()):
        raise ValueError(
            f"{where}: parent_id {start_id!r} is not an evaluation attempt id '<task id>#<sample>' "
            "(pass tapes made by evaluate())"
        )
    return task_id, int(index)


# --------------------------------------------------------------------------- scoring


def _named_scorers(scorer: Scorers) -> dict[str, Scorer]:
    if isinstance(scorer, Mapping):
        named = dict(scorer)
        if not named:
            raise ValueError("scorer: the mapping of scorers is empty")
    else:
        named = {getattr(scorer, "__name__", "score") or "score": scorer}
    for name, fn in named.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"scorer names must be non-empty strings, got {name!r}")
        if not callable(fn):
            raise TypeError(f"scorer {name!r} is a {type(fn).__name__}, not a function (tape, task) -> Score")
    return named


async def _score_one(name: str, fn: Scorer, tape: Tape[Any, Any], task: Task) -> tuple[Score, str | None]:
    """The score, or a fail with the exception as feedback (and the scorer's name as error)."""
    try:
        result = fn(tape, task)
        if inspect.isawaitable(result):
            result = await result
    except Exception as e:
        return Score(value=0.0, passed=False, feedback=f"scorer raised {type(e).__name__}: {e}"), name
    if isinstance(result, Score):
        return result, None
    if isinstance(result, bool):
        return Score(value=float(result), passed=result), None
    raise TypeError(
        f"scorer {name!r} returned {type(result).__name__} for task {task.id!r}; return a Score or a bool"
    )


async def _scored(
    scorers: dict[str, Scorer], tape: Tape[Any, Any], task: Task, record: SampleResult
) -> SampleResult:
    scores: dict[str, Score] = {}
    errors: list[str] = []
    for name, fn in scorers.items():
        score, error = await _score_one(name, fn, tape, task)
        scores[name] = score
        if error is not None:
            errors.append(error)
    return record.model_copy(update={"scores": scores, "scorer_errors": errors})


# --------------------------------------------------------------------------- LLM calls of a tape


def _with_costs(record: SampleResult, calls: list[LLMCall]) -> SampleResult:
    return record.model_copy(
        update={
            "llm_calls": len(calls),
            "prompt_tokens": sum(c.prompt_tokens for c in calls),
            "output_tokens": sum(c.output_tokens for c in calls),
            "cost": sum(c.cost for c in calls),
        }
    )


# --------------------------------------------------------------------------- evaluate


def _check_tasks(tasks: Iterable[Task]) -> list[Task]:
    if isinstance(tasks, Task):
        raise TypeError("tasks must be a list of tasks, not one Task: pass [task]")
    items = list(tasks)
    seen: set[str] = set()
    for i, task in enumerate(items):
        if not isinstance(task, Task):
            raise TypeError(f"tasks[{i}] is a {type(task).__name__}, not a Task")
        if not task.id:
            raise ValueError(f"tasks[{i}] has an empty id")
        if task.id in seen:
            raise ValueError(f"tasks[{i}]: duplicate task id {task.id!r}")
        seen.add(task.id)
    if not items:
        raise ValueError("tasks is empty: nothing to evaluate")
    return items


async def aevaluate_iter(
    agent: Any,
    environment: Any,
    tasks: Iterable[Task],
    scorer: Scorers,
    *,
    k: int = 1,
    name: str = "eval",
    store: TapeStore | None = None,
    report: EvalReport | None = None,
    environment_retries: int = 0,
    **batch_options: Any,
) -> AsyncIterator[SampleResult]:
    """Like :func:`aevaluate`, but yield each scored attempt as its tape finishes; ``report``,
    when given, collects the records and tapes as they come. An attempt the environment failed
    while retries are left is held back and run again after the round (see :func:`aevaluate`)."""
    from tapekit.batch import abatch
    from tapekit.environment import environment_failure

    items = _check_tasks(tasks)
    scorers = _named_scorers(scorer)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int (attempts per task), got {k!r}")
    if (
        isinstance(environment_retries, bool)
        or not isinstance(environment_retries, int)
        or environment_retries < 0
    ):
        raise ValueError(f"environment_retries must be an int >= 0, got {environment_retries!r}")
    starts, owners = [], []
    for task in items:
        start = task.start_tape()
        for j in range(k):
            starts.append(start.with_metadata(id=_start_id(task.id, j)))
            owners.append((task, j))
    # each attempt's tokens and cost come from the calls this run made (kept as the batch
    # reports them) and, for a resumed attempt's earlier calls, from the store; Ray workers
    # make their calls in other processes, so there every call is read back from the store
    ray = batch_options.get("backend") == "ray"
    if ray and store is None:
        raise ValueError("an evaluation on the Ray backend needs a store (its workers store the LLM calls)")
    captured: dict[str, LLMCall] = {}
    if not ray:
        also = batch_options.get("on_llm_call")

        def keep(call: LLMCall) -> None:
            captured[call.prompt.id] = call
            if also is not None:
                also(call)

        batch_options["on_llm_call"] = keep
    # round r runs the attempts the environment failed in round r - 1, under ids of their own
    # ("t#j~r"), so a resumed evaluation reads every round back instead of running it again
    todo = list(range(len(starts)))
    for round_ in range(environment_retries + 1):
        if not todo:
            break
        again: list[int] = []
        ids = [starts[i].with_metadata(id=_start_id(owners[i][0].id, owners[i][1], round_)) for i in todo]
        async for result in abatch(agent, environment, ids, store=store, name=name, **batch_options):
            index = todo[result.index]
            failure = environment_failure(result.tape)
            if failure is not None and round_ < environment_retries:
                again.append(index)
                continue
            yield await _attempt_record(
                owners[index], result, failure, round_, scorers, store, captured, name, report
            )
        todo = sorted(again)


async def _attempt_record(
    owner: tuple[Task, int],
    result: Any,
    failure: str | None,
    retries: int,
    scorers: dict[str, Scorer],
    store: TapeStore | None,
    captured: dict[str, LLMCall],
    name: str,
    report: EvalReport | None,
) -> SampleResult:
    """Score one finished attempt, tag its tape in the store and add it to ``report``."""
    task, j = owner
    all_tag, passed_tag, failed_tag = eval_tags(name)
    record = SampleResult(
        task_id=task.id,
        category=task.category,
        sample=j,
        tape_id=result.tape_id,
        error=result.error,
        environment_failure=failure,
        environment_retries=retries,
    )

    def lookup(pid: str) -> LLMCall | None:
        if pid in captured:
            return captured[pid]
        return store.get_llm_call(pid) if store is not None else None

    calls = await asyncio.to_thread(llm_calls_of, result.tape.steps, lookup)
    record = await _scored(scorers, result.tape, task, _with_costs(record, calls))
    if store is not None:
        verdict = passed_tag if record.scores[next(iter(scorers))].passed else failed_tag
        tags = [all_tag, verdict, f"eval:{name}:task:{task.id}", f"eval:{name}:sample:{j}"]
        store.remove_tags(result.tape_id, [passed_tag, failed_tag])
        store.add_tags(result.tape_id, tags)
    if report is not None:
        report.samples.append(record)
        report.tapes[result.tape_id] = result.tape
        report.llm_calls.update((c.prompt.id, c) for c in calls)
    return record


def _order(report: EvalReport, tasks: list[Task]) -> EvalReport:
    rank = {t.id: i for i, t in enumerate(tasks)}
    report.samples.sort(key=lambda s: (rank.get(s.task_id, len(rank)), s.task_id, s.sample))
    return report


async def aevaluate(
    agent: Any,
    environment: Any,
    tasks: Iterable[Task],
    scorer: Scorers,
    *,
    k: int = 1,
    name: str = "eval",
    store: TapeStore | None = None,
    seed: int = 0,
    n_bootstrap: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    on_sample: Callable[[SampleResult], None] | None = None,
    environment_retries: int = 0,
    **batch_options: Any,
) -> EvalReport:
    """Run ``k`` attempts of every task with the batch runner and score each final tape.

    - ``scorer``: a function ``(tape, task) -> Score`` or ``{name: scorer}`` (the first is the
      primary one, used for the store's passed/failed tags).
    - ``name``: the evaluation's name; it is the batch's name too, so with a ``store`` the
      same name resumes (finished attempts are read back, not run again).
    - ``store``: a tapekit store; every attempt's tape and LLM calls are stored and tagged
      (:func:`eval_tags`).
    - ``seed``, ``n_bootstrap``, ``confidence``: the bootstrap intervals of the report
      (10,000 resamples by default).
    - ``on_sample``: called with each scored attempt as it finishes (for progress displays).
    - ``environment_retries``: an attempt the environment ended by failing (a page that never
      loaded, a browser that crashed: :func:`tapekit.environment.environment_failure`) is run
      again from its start tape, up to this many times, after the other attempts; the report
      keeps its last try (``SampleResult.environment_failure`` and ``environment_retries`` say
      what happened, ``EvalReport.n_environment_failures`` counts those still failed and
      :meth:`EvalReport.without_environment_failures` leaves them out). 0 (the default) scores
      such attempts as they are.
    - ``batch_options``: passed to :func:`tapekit.batch.abatch` (``max_concurrency``,
      ``llm_concurrency``, ``max_loops``, ``stats``, ``retry_failed``).
    """
    items = _check_tasks(tasks)
    report = EvalReport(
        name=name,
        k=k,
        scorers=list(_named_scorers(scorer)),
        seed=seed,
        n_bootstrap=n_bootstrap,
        confidence=confidence,
    )
    async for record in aevaluate_iter(
        agent,
        environment,
        items,
        scorer,
        k=k,
        name=name,
        store=store,
        report=report,
        environment_retries=environment_retries,
        **batch_options,
    ):
        if on_sample is not None:
            on_sample(record)
    return _order(report, items)


def evaluate(
    agent: Any,
    environment: Any,
    tasks: Iterable[Task],
    scorer: Scorers,
    *,
    k: int = 1,
    name: str = "eval",
    store: TapeStore | None = None,
    seed: int = 0,
    n_bootstrap: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    on_sample: Callable[[SampleResult], None] | None = None,
    environment_retries: int = 0,
    **batch_options: Any,
) -> EvalReport:
    """The synchronous form of :func:`aevaluate` (works inside a running event loop too)."""
    return run_sync(
        aevaluate(
            agent,
            environment,
            tasks,
            scorer,
            k=k,
            name=name,
            store=store,
            seed=seed,
            n_bootstrap=n_bootstrap,
            confidence=confidence,
            on_sample=on_sample,
            environment_retries=environment_retries,
            **batch_options,
        )
    )


# --------------------------------------------------------------------------- rescore


def _stored_attempts(store: TapeStore, name: str) -> list[Tape[Any, Any]]:
    all_tag = eval_tags(name)[0]
    ids = store.list_tapes(TapeFilter(tag=all_tag))
    if not ids:
        raise ValueError(
            f"the store has no tapes tagged {all_tag!r}: no evaluation named {name!r} was stored"
        )
    return [store.get_tape(tape_id) for tape_id in ids]


async def arescore(
    source: EvalReport | TapeStore | Iterable[Tape[Any, Any]],
    scorer: Scorers,
    tasks: Iterable[Task],
    *,
    name: str | None = None,
    k: int | None = None,
    seed: int = 0,
    n_bootstrap: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
) -> EvalReport:
    """Score the tapes of an evaluation again with new scorers; no agent runs and no LLM is
    called (unless a scorer itself calls one).

    ``source`` is an :class:`EvalReport` made in this process (its tapes; its tokens and costs
    are kept), a store (the tapes tagged by evaluation ``name``; tokens and costs from the
    stored LLM calls) or an iterable of final tapes as :func:`evaluate` made them (their
    ``parent_id`` is ``<task id>#<sample>``; no tokens or costs). ``tasks`` must hold every
    task the tapes belong to.
    """
    by_id = {t.id: t for t in _check_tasks(tasks)}
    scorers = _named_scorers(scorer)
    base: dict[str, SampleResult] = {}
    lookup: Callable[[str], LLMCall | None] | None = None
    if isinstance(source, EvalReport):
        if not source.tapes:
            raise ValueError(
                "this EvalReport holds no tapes (it was loaded from JSON): rescore from the store"
            )
        tapes = list(source.tapes.values())
        base = {s.tape_id: s for s in source.samples}
        name = name or source.name
        k = k or source.k
    elif isinstance(source, TapeStore):
        if name is None:
            raise ValueError("rescoring from a store needs name= (the evaluation's name)")
        tapes = await asyncio.to_thread(_stored_attempts, source, name)
        lookup = source.get_llm_call
    elif isinstance(source, Tape):
        raise TypeError("source must be many tapes, not one Tape: pass [tape]")
    else:
        tapes = list(source)
    records: list[SampleResult] = []
    for i, tape in enumerate(tapes):
        task_id, j = _parse_start_id(tape.metadata.parent_id, f"tape {i} ({tape.metadata.id})")
        if task_id not in by_id:
            raise ValueError(
                f"tape {tape.metadata.id!r} is an attempt at task {task_id!r}, which is not in tasks"
            )
        task = by_id[task_id]
        record = base.get(tape.metadata.id) or SampleResult(
            task_id=task_id,
            category=task.category,
            sample=j,
            tape_id=tape.metadata.id,
            error=tape.metadata.error,
        )
        if lookup is not None:
            record = _with_costs(record, await asyncio.to_thread(llm_calls_of, tape.steps, lookup))
        records.append(await _scored(scorers, tape, task, record))
    counts = [len(g) for g in _group_sizes(records)]
    report = EvalReport(
        name=name or "rescore",
        k=k or (min(counts) if counts else 1),
        scorers=list(scorers),
        samples=records,
        seed=seed,
        n_bootstrap=n_bootstrap,
        confidence=confidence,
    )
    report.tapes.update({t.metadata.id: t for t in tapes})
    return _order(report, list(by_id.values()))


def _group_sizes(records: list[SampleResult]) -> list[list[SampleResult]]:
    groups: dict[str, list[SampleResult]] = {}
    for r in records:
        groups.setdefault(r.task_id, []).append(r)
    return list(groups.values())


def rescore(
    source: EvalReport | TapeStore | Iterable[Tape[Any, Any]],
    scorer: Scorers,
    tasks: Iterable[Task],
    *,
    name: str | None = None,
    k: int | None = None,
    seed: int = 0,
    n_bootstrap: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
) -> EvalReport:
    """The synchronous form of :func:`arescore`."""
    return run_sync(
        arescore(
            source, scorer, tasks, name=name, k=k, seed=seed, n_bootstrap=n_bootstrap, confidence=confidence
        )
    )
