"""Run one agent over many tapes at once, and pick up where a stopped batch left off.

``abatch`` runs the main loop on each input tape with a bound on how many tapes run at the same
time and, optionally, on how many requests each LLM has in flight. Results come out as each
tape finishes. With a store, every step is written as it is made and every LLM call when it
completes; a tape that finishes is written whole and tagged done in one write. Running the same
batch (same name, same store) again returns the finished tapes from the store without running
them and resumes the unfinished ones from their stored steps, so a batch stopped by Ctrl-C, a
crash or ``kill -9`` loses nothing that was committed and never runs a finished tape twice.

A failure of one tape (the agent, the environment, or anything unexpected) is recorded in that
tape's ``metadata.error`` and never stops the others. ``backend="ray"`` spreads the tapes over
a Ray cluster (see :mod:`tapekit._batch_ray`).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import PrivateAttr, SerializeAsAny

from tapekit._sync import run_sync
from tapekit.agent import Agent
from tapekit.core import LLMOutput, Prompt, Tape
from tapekit.environment import Environment
from tapekit.llm.base import LLM, LLMEvent, TrainingText
from tapekit.orchestrator import async_main_loop

__all__ = [
    "DEFAULT_CONCURRENCY",
    "BatchResult",
    "BatchStats",
    "abatch",
    "batch",
    "batch_tags",
    "batch_tape_id",
    "load_factory",
    "load_object",
]

DEFAULT_CONCURRENCY = 64
_NAME = re.compile(r"^[\w.\-/]+$")

LLMConcurrency = int | Mapping[str, int] | None


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What became of one input tape.

    ``index`` is its position in the input, ``start_id`` the input tape's id and ``tape_id``
    the id it is stored under (:func:`batch_tape_id`; the same whether or not there is a store).
    ``tape`` is the final tape (its ``metadata.id`` is ``tape_id`` and its ``parent_id`` the
    start id, as stored) and ``error`` its ``metadata.error``. ``skipped``: it was already
    done in the store and was not run; ``resumed``: it was continued from its stored steps.
    ``external``: the loop stopped on an action that waits on the outside world. The counters
    are this run's LLM calls and tokens for the tape (0 when skipped).
    """

    index: int
    start_id: str
    tape_id: str
    tape: Tape[Any, Any]
    error: str | None = None
    skipped: bool = False
    resumed: bool = False
    external: bool = False
    llm_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        """True when the tape finished without an error."""
        return self.error is None


@dataclass
class BatchStats:
    """Live counters of a running batch, for progress displays: pass one as ``stats=``.

    ``finished`` counts every tape that has a result (``failed`` and ``skipped`` included);
    the token counters cover the LLM calls made by this run.
    """

    total: int = 0
    finished: int = 0
    failed: int = 0
    skipped: int = 0
    resumed: int = 0
    running: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        """Seconds since the batch started."""
        return time.monotonic() - self.started_at

    @property
    def llm_calls_per_s(self) -> float:
        """LLM calls completed per second so far."""
        return self.llm_calls / max(self.elapsed_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        """Prompt plus output tokens per second so far."""
        return (self.prompt_tokens + self.output_tokens) / max(self.elapsed_s, 1e-9)

    def _count(self, result: BatchResult) -> None:
        self.finished += 1
        self.failed += result.error is not None
        self.skipped += result.skipped
        self.resumed += result.resumed


def batch_tape_id(name: str, start_id: str) -> str:
    """The id under which batch ``name`` stores the run of the tape whose id is ``start_id``.

    It depends on the batch name, so two batches over the same tapes (two agents compared on
    one task set, say) keep separate results in one store.
    """
    return hashlib.sha256(f"tapekit-batch\0{name}\0{start_id}".encode()).hexdigest()[:32]


def batch_tags(name: str) -> tuple[str, str, str]:
    """The store tags of batch ``name``: every tape it started, the finished ones, the failed ones."""
    return f"batch:{name}", f"batch:{name}:done", f"batch:{name}:failed"


def load_object(target: str) -> Any:
    """The object that ``target`` (``package.module:attr``, ``attr`` may be dotted) names."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"target {target!r} must look like 'package.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import {module_name!r} for target {target!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no attribute {attr!r} (target {target!r})")
        obj = getattr(obj, part)
    return obj


def load_factory(target: str) -> tuple[Agent, Environment]:
    """Call the ``module:attr`` factory ``target`` and check it returns ``(agent, environment)``."""
    factory = load_object(target)
    if not callable(factory):
        raise ValueError(f"target {target!r} is not callable")
    try:
        made = factory()
    except Exception as e:
        raise ValueError(f"calling {target!r} failed: {type(e).__name__}: {e}") from e
    if (
        not isinstance(made, tuple)
        or len(made) != 2
        or not isinstance(made[0], Agent)
        or not isinstance(made[1], Environment)
    ):
        raise ValueError(f"target {target!r} must return (agent, environment), got {made!r:.200}")
    return made


# --------------------------------------------------------------------------- LLM limits


class _LimitedLLM(LLM):
    """Another LLM behind a semaphore: at most ``limit`` of its requests in flight. It reports
    the wrapped LLM's name, prices and training text, so calls are recorded as without it."""

    llm: SerializeAsAny[LLM]
    limit: int
    _semaphore: asyncio.Semaphore | None = PrivateAttr(None)

    def model_post_init(self, context: Any, /) -> None:
        """Take the wrapped model's name and prices."""
        self.model_name = self.llm.model_name
        self.cost_per_prompt_token = self.llm.cost_per_prompt_token
        self.cost_per_output_token = self.llm.cost_per_output_token

    def cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """The wrapped LLM's price."""
        return self.llm.cost(prompt_tokens, output_tokens)

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return self.astream(prompt)

    async def astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        """The wrapped LLM's stream, once one of the ``limit`` slots is free."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.limit)
        async with self._semaphore:
            async for event in self.llm.astream(prompt):
                yield event

    def count_tokens(self, text: str) -> int:
        """The wrapped LLM's token count."""
        return self.llm.count_tokens(text)

    def make_training_text(self, prompt: Prompt, output: LLMOutput) -> TrainingText:
        """The wrapped LLM's training text."""
        return self.llm.make_training_text(prompt, output)


def _team(agent: Agent) -> list[Agent]:
    members, stack = [], [agent]
    while stack:
        member = stack.pop()
        members.append(member)
        stack.extend(member.subagents)
    return members


def _check_llm_concurrency(agent: Agent, llm_concurrency: LLMConcurrency) -> None:
    if llm_concurrency is None:
        return
    if isinstance(llm_concurrency, Mapping):
        keys = {key for member in _team(agent) for key in member.llms}
        unknown = sorted(set(llm_concurrency) - keys)
        if unknown:
            raise ValueError(
                f"llm_concurrency names LLMs {unknown} that the agent does not have (its LLM keys: "
                f"{sorted(keys)})"
            )
        for key, limit in llm_concurrency.items():
            _check_positive(limit, f"llm_concurrency[{key!r}]")
    else:
        _check_positive(llm_concurrency, "llm_concurrency")


def _with_llm_limits(agent: Agent, llm_concurrency: LLMConcurrency) -> Agent:
    """A clone of ``agent`` whose limited LLMs sit behind one semaphore each (one per LLM
    object: an LLM shared by several agents or keys shares its limit)."""
    if llm_concurrency is None:
        return agent
    clone = agent.clone()
    wrapped: dict[int, LLM] = {}
    for member in _team(clone):
        for key, llm in list(member.llms.items()):
            limit = llm_concurrency if isinstance(llm_concurrency, int) else llm_concurrency.get(key)
            if limit is None:
                continue
            if id(llm) not in wrapped:
                wrapped[id(llm)] = _LimitedLLM(llm=llm, limit=limit)
            member.llms[key] = wrapped[id(llm)]
    return clone


# --------------------------------------------------------------------------- validation


def _check_positive(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")


def _check_inputs(
    agent: Agent,
    environment: Environment,
    tapes: Iterable[Tape[Any, Any]],
    max_concurrency: int,
    llm_concurrency: LLMConcurrency,
    name: str,
    max_loops: int | None,
) -> list[Tape[Any, Any]]:
    if not isinstance(agent, Agent):
        raise TypeError(f"agent must be an Agent, got {type(agent).__name__}")
    if agent.manager is not None:
        raise ValueError(f"run the root agent {agent.root.name!r}, not its subagent {agent.full_name!r}")
    if not isinstance(environment, Environment):
        raise TypeError(f"environment must be an Environment, got {type(environment).__name__}")
    if isinstance(tapes, Tape):
        raise TypeError("tapes must be an iterable of tapes, not one tape: pass [tape]")
    items = list(tapes)
    seen: dict[str, int] = {}
    for i, tape in enumerate(items):
        if not isinstance(tape, Tape):
            raise TypeError(f"tapes[{i}] is a {type(tape).__name__}, not a Tape")
        tape_id = tape.metadata.id
        if not tape_id:
            raise ValueError(f"tapes[{i}] has an empty metadata.id; every start tape needs a unique id")
        if tape_id in seen:
            raise ValueError(
                f"tapes[{seen[tape_id]}] and tapes[{i}] have the same id {tape_id!r}; a batch needs "
                "unique start ids (they key the stored results)"
            )
        seen[tape_id] = i
    _check_positive(max_concurrency, "max_concurrency")
    _check_llm_concurrency(agent, llm_concurrency)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"batch name {name!r} must be non-empty letters, digits, '_', '-', '.' or '/'")
    if max_loops is not None:
        _check_positive(max_loops, "max_loops")
    return items


def _check_store(store: Any) -> None:
    needed = ("save_tape", "save_llm_call", "get_tape", "list_tapes", "add_tags", "remove_tags", "flush")
    missing = [m for m in needed if not callable(getattr(store, m, None))]
    if missing:
        raise TypeError(
            f"store {type(store).__name__} lacks {missing}: pass a tapekit store (SQLite, PostgreSQL)"
        )


# --------------------------------------------------------------------------- one tape


@dataclass
class _Plan:
    """What the store already holds for this batch (stored tape ids)."""

    started: set[str]
    done: set[str]
    failed: set[str]


async def _read_plan(store: Any, name: str) -> _Plan:
    started, done, failed = batch_tags(name)

    def read() -> _Plan:
        return _Plan(
            set(store.list_tapes(tag=started)),
            set(store.list_tapes(tag=done)),
            set(store.list_tapes(tag=failed)),
        )

    return await asyncio.to_thread(read)


class _Recorder:
    """Writes a running tape to the store one step behind: the newest step is written only when
    the next one arrives, and the last one with the final tape and its done tag in one write.
    So a stored tape without the done tag always lacks at least one step, and resuming it never
    starts a new turn on a tape that had already finished."""

    __slots__ = ("key", "parent_id", "saved", "store", "tape")

    def __init__(self, store: Any, key: str, tape: Tape[Any, Any], saved: int, parent_id: str) -> None:
        self.store = store
        self.key = key
        self.tape = tape
        self.saved = saved
        self.parent_id = parent_id  # the start tape: batches over the same tapes pair up by it

    def _write(self, n: int) -> None:
        if n > self.saved:
            tape = _as_stored(
                self.tape.model_copy(update={"steps": self.tape.steps[:n]}), self.key, self.parent_id
            )
            self.store.save_tape(tape, self.key)
            self.saved = n

    def step(self, step: Any) -> None:
        self._write(len(self.tape))
        self.tape = self.tape.model_copy(update={"steps": self.tape.steps.appended([step])})

    def turn(self, tape: Tape[Any, Any]) -> None:
        self.tape = tape
        self._write(len(tape) - 1)

    def write_all(self) -> None:
        self._write(len(self.tape))


def _as_stored(tape: Tape[Any, Any], key: str, start_id: str) -> Tape[Any, Any]:
    """``tape`` as the batch stores it: under its batch id, continuing the start tape (so runs of
    two batches over the same tapes pair up by ``parent_id``)."""
    meta = tape.metadata.model_copy(update={"id": key, "parent_id": start_id})
    return tape.model_copy(update={"metadata": meta})


def _loops_done(tape: Tape[Any, Any], start_len: int) -> int:
    """How many main-loop rounds completed on ``tape`` after its first ``start_len`` steps: one
    per block of environment steps (steps no agent made)."""
    rounds, in_env = 0, False
    steps = tape.steps
    for i in range(start_len, len(steps)):
        env = not steps[i].metadata.agent
        rounds += env and not in_env
        in_env = env
    return rounds


@dataclass
class _Run:
    """Everything the tapes of one batch share."""

    agent: Agent
    environment: Environment
    store: Any
    name: str
    max_loops: int | None
    retry_failed: bool
    stats: BatchStats
    plan: _Plan | None


async def _run_one(run: _Run, index: int, start: Tape[Any, Any]) -> BatchResult:
    start_id = start.metadata.id
    key = batch_tape_id(run.name, start_id)
    store, stats = run.store, run.stats
    started_tag, done_tag, failed_tag = batch_tags(run.name)
    tape = final = start
    resumed = external = False
    calls = prompt_tokens = output_tokens = 0
    recorder: _Recorder | None = None
    stats.running += 1
    try:
        if store is not None and run.plan is not None:
            plan = run.plan
            retry = run.retry_failed and key in plan.failed
            if key in plan.done and not retry:
                stored = await asyncio.to_thread(store.get_tape, key, type(start))
                return BatchResult(index, start_id, key, stored, error=stored.metadata.error, skipped=True)
            if key in plan.started:
                tape = final = await asyncio.to_thread(store.get_tape, key, type(start))
                resumed = True
                if retry:
                    await asyncio.to_thread(store.remove_tags, key, [done_tag, failed_tag])
            else:
                await asyncio.to_thread(
                    store.save_tape, _as_stored(start, key, start_id), key, tags=[started_tag]
                )
            recorder = _Recorder(store, key, tape, len(tape), start_id)
        max_loops = run.max_loops
        if resumed and max_loops is not None:
            max_loops = max(0, max_loops - _loops_done(tape, len(start)))
        async for event in async_main_loop(run.agent, tape, run.environment, max_loops):
            agent_event = event.agent_event
            if agent_event is not None:
                if agent_event.step is not None:
                    if recorder is not None:
                        recorder.step(agent_event.step)
                elif agent_event.llm_call is not None:
                    call = agent_event.llm_call
                    calls += 1
                    prompt_tokens += call.prompt_tokens
                    output_tokens += call.output_tokens
                    stats.llm_calls += 1
                    stats.prompt_tokens += call.prompt_tokens
                    stats.output_tokens += call.output_tokens
                    if store is not None:
                        store.save_llm_call(call)
                continue
            if event.tape is not None:
                final = event.tape
                if recorder is not None:
                    recorder.turn(final)
            elif event.external is not None:
                external = True
    except Exception as e:  # anything unexpected fails this tape only
        last = recorder.tape if recorder is not None else final
        final = last.with_metadata(error=f"{type(e).__name__}: {e} (in batch {run.name!r})")
    except BaseException:  # cancelled: keep every step made so far, resumable
        if recorder is not None:
            recorder.write_all()
        raise
    finally:
        stats.running -= 1
    error = final.metadata.error
    final = _as_stored(final, key, start_id)
    if store is not None:
        try:
            store.save_tape(final, key, tags=[done_tag, failed_tag] if error else [done_tag])
        except Exception as e:
            error = error or f"{type(e).__name__}: {e} (saving the tape in batch {run.name!r})"
    return BatchResult(
        index,
        start_id,
        key,
        final,
        error=error,
        resumed=resumed,
        external=external,
        llm_calls=calls,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
    )


# --------------------------------------------------------------------------- the batch


async def _alocal(
    agent: Agent,
    environment: Environment,
    items: list[tuple[int, Tape[Any, Any]]],
    *,
    max_concurrency: int,
    llm_concurrency: LLMConcurrency,
    store: Any,
    name: str,
    max_loops: int | None,
    retry_failed: bool,
    stats: BatchStats,
) -> AsyncIterator[BatchResult]:
    """The local backend on ``(index, tape)`` pairs: worker tasks pull tapes from one iterator
    and push results to one queue, so a finished tape costs O(1) however many run."""
    plan = await _read_plan(store, name) if store is not None else None
    run = _Run(
        _with_llm_limits(agent, llm_concurrency),
        environment,
        store,
        name,
        max_loops,
        retry_failed,
        stats,
        plan,
    )
    results: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()
    pending = iter(items)

    async def worker() -> None:
        try:
            for index, tape in pending:
                results.put_nowait((True, await _run_one(run, index, tape)))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a bug in the batch itself, not in a tape: stop everything
            results.put_nowait((False, e))

    workers = [asyncio.create_task(worker()) for _ in range(min(max_concurrency, len(items)))]
    try:
        for _ in range(len(items)):
            ok, item = await results.get()
            if not ok:
                raise item
            yield item
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if store is not None:
            store.flush()


def abatch(
    agent: Agent,
    environment: Environment,
    tapes: Iterable[Tape[Any, Any]],
    *,
    max_concurrency: int = DEFAULT_CONCURRENCY,
    llm_concurrency: LLMConcurrency = None,
    store: Any = None,
    name: str = "batch",
    max_loops: int | None = None,
    retry_failed: bool = False,
    stats: BatchStats | None = None,
    backend: Literal["local", "ray"] = "local",
    ray_workers: int | None = None,
    ray_factory: str | None = None,
) -> AsyncIterator[BatchResult]:
    """Run the main loop on every tape in ``tapes``; yield a :class:`BatchResult` as each
    tape finishes (not in input order).

    - ``max_concurrency``: how many tapes run at the same time.
    - ``llm_concurrency``: how many requests each LLM may have in flight: one int for every
      LLM, or ``{llm_key: int}`` by the keys of the agents' ``llms`` (others unlimited). The
      calls and tapes are the same as without a limit; only the timing changes.
    - ``store``: a tapekit store (SQLite or PostgreSQL). Tapes are written as they run under
      :func:`batch_tape_id` and tagged (:func:`batch_tags`); running the same ``name`` again
      skips the done tapes (returned from the store) and resumes the others.
      ``retry_failed=True`` resumes the failed ones too.
    - ``max_loops``: agent/environment rounds per tape (a resumed tape counts the rounds its
      stored steps already made).
    - ``stats``: a :class:`BatchStats` the batch keeps up to date (for progress displays).
    - ``backend="ray"``: spread the tapes over a Ray cluster (``ray.init`` is called if Ray
      is not initialised; ``RAY_ADDRESS`` picks the cluster). ``ray_workers`` tasks (default:
      the cluster's CPUs) each run a share of the tapes and of both concurrency limits;
      ``ray_factory`` (``module:attr``) makes the workers build the agent and environment
      themselves instead of unpickling them.

    Cancelling the iteration (Ctrl-C, ``task.cancel()``, ``break``) stops the running tapes,
    writes what they made, and flushes the store. Bad arguments raise here, before anything
    runs.
    """
    items = _check_inputs(agent, environment, tapes, max_concurrency, llm_concurrency, name, max_loops)
    if store is not None:
        _check_store(store)
    if backend not in ("local", "ray"):
        raise ValueError(f"backend {backend!r}: choose 'local' or 'ray'")
    if ray_workers is not None:
        _check_positive(ray_workers, "ray_workers")
    stats = stats if stats is not None else BatchStats()
    stats.total = len(items)
    stats.started_at = time.monotonic()
    indexed = list(enumerate(items))
    if backend == "ray":
        from tapekit._batch_ray import aray_batch

        results = aray_batch(
            agent,
            environment,
            indexed,
            max_concurrency=max_concurrency,
            llm_concurrency=llm_concurrency,
            store=store,
            name=name,
            max_loops=max_loops,
            retry_failed=retry_failed,
            stats=stats,
            workers=ray_workers,
            factory=ray_factory,
        )
    else:
        results = _alocal(
            agent,
            environment,
            indexed,
            max_concurrency=max_concurrency,
            llm_concurrency=llm_concurrency,
            store=store,
            name=name,
            max_loops=max_loops,
            retry_failed=retry_failed,
            stats=stats,
        )
    return _counted(results, stats)


async def _counted(results: AsyncIterator[BatchResult], stats: BatchStats) -> AsyncIterator[BatchResult]:
    try:
        async for result in results:
            stats._count(result)
            yield result
    finally:
        await results.aclose()  # type: ignore[attr-defined]


def batch(
    agent: Agent,
    environment: Environment,
    tapes: Iterable[Tape[Any, Any]],
    *,
    max_concurrency: int = DEFAULT_CONCURRENCY,
    llm_concurrency: LLMConcurrency = None,
    store: Any = None,
    name: str = "batch",
    max_loops: int | None = None,
    retry_failed: bool = False,
    stats: BatchStats | None = None,
    backend: Literal["local", "ray"] = "local",
    ray_workers: int | None = None,
    ray_factory: str | None = None,
    on_result: Callable[[BatchResult], None] | None = None,
) -> list[BatchResult]:
    """Sync version of :func:`abatch`: the results in input order (``on_result`` sees each one
    as its tape finishes). Works inside a running event loop too (a notebook)."""

    async def collect() -> list[BatchResult]:
        out = []
        async for result in abatch(
            agent,
            environment,
            tapes,
            max_concurrency=max_concurrency,
            llm_concurrency=llm_concurrency,
            store=store,
            name=name,
            max_loops=max_loops,
            retry_failed=retry_failed,
            stats=stats,
            backend=backend,
            ray_workers=ray_workers,
            ray_factory=ray_factory,
        ):
            if on_result is not None:
                on_result(result)
            out.append(result)
        return sorted(out, key=lambda r: r.index)

    return run_sync(collect())
