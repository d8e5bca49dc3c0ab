"""The local backend of :func:`tapekit.batch.abatch`: many tapes in one event loop.

Worker tasks pull tapes from one iterator and push results to one queue. Each tape runs the
main loop with a :class:`~tapekit.recording.SessionRecorder` that stores it one step behind,
so a stored tape without the done tag always lacks at least one step and resuming it never
starts a new turn on a tape that had already finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import PrivateAttr, SerializeAsAny

from tapekit.agent import Agent
from tapekit.batch._config import BatchConfig, LLMConcurrency, team
from tapekit.batch._results import BatchResult, BatchStats, batch_tags, batch_tape_id
from tapekit.core import LLMOutput, Prompt, Tape
from tapekit.effects import InDoubtToolCall
from tapekit.environment import Environment
from tapekit.llm.base import LLM, LLMEvent, TrainingText
from tapekit.orchestrator import amain_loop
from tapekit.recording import SessionRecorder, stored_form
from tapekit.store.base import TapeFilter, TapeStore


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


def _with_llm_limits(agent: Agent, llm_concurrency: LLMConcurrency) -> Agent:
    """A clone of ``agent`` whose limited LLMs sit behind one semaphore each (one per LLM
    object: an LLM shared by several agents or keys shares its limit)."""
    if llm_concurrency is None:
        return agent
    clone = agent.clone()
    wrapped: dict[int, LLM] = {}
    for member in team(clone):
        for key, llm in list(member.llms.items()):
            limit = llm_concurrency if isinstance(llm_concurrency, int) else llm_concurrency.get(key)
            if limit is None:
                continue
            if id(llm) not in wrapped:
                wrapped[id(llm)] = _LimitedLLM(llm=llm, limit=limit)
            member.llms[key] = wrapped[id(llm)]
    return clone


# --------------------------------------------------------------------------- what is stored


@dataclass
class _Plan:
    """What the store already holds for this batch (stored tape ids)."""

    started: set[str]
    done: set[str]
    failed: set[str]


async def _read_plan(store: TapeStore, name: str) -> _Plan:
    started, done, failed = batch_tags(name)

    def read() -> _Plan:
        return _Plan(
            set(store.list_tapes(TapeFilter(tag=started))),
            set(store.list_tapes(TapeFilter(tag=done))),
            set(store.list_tapes(TapeFilter(tag=failed))),
        )

    return await asyncio.to_thread(read)


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


# --------------------------------------------------------------------------- one tape


@dataclass
class _Run:
    """Everything the tapes of one batch share."""

    agent: Agent
    environment: Environment
    config: BatchConfig
    stats: BatchStats
    plan: _Plan | None


@dataclass
class _Counts:
    """This run's LLM calls and tokens for one tape."""

    calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0


async def _prepare(run: _Run, key: str, start: Tape[Any, Any]) -> tuple[Tape[Any, Any], str]:
    """Where tape ``key`` stands in the store: ``(tape to run from, "new" | "resumed" | "done")``
    (for "done", the stored tape). A new tape is stored with the batch's started tag."""
    store, plan = run.config.store, run.plan
    assert store is not None and plan is not None
    _, done_tag, failed_tag = batch_tags(run.config.name)
    retry = run.config.retry_failed and key in plan.failed
    if key in plan.done and not retry:
        return await asyncio.to_thread(store.get_tape, key, type(start)), "done"
    if key in plan.started:
        stored = await asyncio.to_thread(store.get_tape, key, type(start))
        if retry:
            await asyncio.to_thread(store.remove_tags, key, [done_tag, failed_tag])
        return stored, "resumed"
    return start, "new"


async def _run_one(run: _Run, index: int, start: Tape[Any, Any]) -> BatchResult:
    config, stats = run.config, run.stats
    start_id = start.metadata.id
    key = batch_tape_id(config.name, start_id)
    started_tag, done_tag, failed_tag = batch_tags(config.name)
    tape = final = start
    state = "new"
    external = False
    counts = _Counts()
    recorder: SessionRecorder | None = None
    stats.running += 1
    try:
        if config.store is not None:
            tape, state = await _prepare(run, key, start)
            if state == "done":
                return BatchResult(index, start_id, key, tape, error=tape.metadata.error, skipped=True)
            recorder = SessionRecorder(
                config.store,
                tape,
                key,
                parent_id=start_id,  # the start tape: batches over the same tapes pair up by it
                tags=[started_tag] if state == "new" else [],
                hold_last=True,
                done_tags=[done_tag],
                failed_tags=[done_tag, failed_tag],
                base_len=len(start),
            )
        max_loops = config.max_loops
        if state == "resumed" and max_loops is not None:
            max_loops = max(0, max_loops - _loops_done(tape, len(start)))
        final = tape
        on_llm_call = config.on_llm_call
        async for event in amain_loop(run.agent, tape, run.environment, max_loops, recorder=recorder):
            call = event.llm_call
            if call is not None:
                if on_llm_call is not None:
                    on_llm_call(call)
                counts.calls += 1
                counts.prompt_tokens += call.prompt_tokens
                counts.output_tokens += call.output_tokens
                stats.llm_calls += 1
                stats.prompt_tokens += call.prompt_tokens
                stats.output_tokens += call.output_tokens
            elif event.tape is not None:
                final = event.tape
            elif event.external is not None:
                external = True
                if recorder is not None and isinstance(event.external, InDoubtToolCall):
                    recorder.done_tags = ()  # not done until resolved: the next run resumes it
        final = recorder.tape if recorder is not None else stored_form(final, key, start_id, len(start))
    except Exception as e:  # anything unexpected fails this tape only
        message = f"{type(e).__name__}: {e} (in batch {config.name!r})"
        if recorder is not None:
            final = _finished(recorder, recorder.tape.with_metadata(error=message))
        else:
            final = stored_form(final.with_metadata(error=message), key, start_id, len(start))
    finally:
        stats.running -= 1
    return BatchResult(
        index,
        start_id,
        key,
        final,
        error=final.metadata.error,
        resumed=state == "resumed",
        external=external,
        llm_calls=counts.calls,
        prompt_tokens=counts.prompt_tokens,
        output_tokens=counts.output_tokens,
    )


def _finished(recorder: SessionRecorder, final: Tape[Any, Any]) -> Tape[Any, Any]:
    """Store a failed tape with its error and the failed tag (the steps stored so far, when the
    whole tape cannot be written); return it as stored."""
    try:
        return recorder.finish(final)
    except Exception as e:
        error = f"{final.metadata.error}; then saving the tape failed: {type(e).__name__}: {e}"
        return recorder.tape.with_metadata(error=error)


# --------------------------------------------------------------------------- the batch


async def alocal(
    agent: Agent, environment: Environment, items: list[tuple[int, Tape[Any, Any]]], config: BatchConfig
) -> AsyncIterator[BatchResult]:
    """The local backend on ``(index, tape)`` pairs: worker tasks pull tapes from one iterator
    and push results to one queue, so a finished tape costs O(1) however many run."""
    store = config.store
    plan = await _read_plan(store, config.name) if store is not None else None
    stats = config.stats if config.stats is not None else BatchStats()
    run = _Run(_with_llm_limits(agent, config.llm_concurrency), environment, config, stats, plan)
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

    workers = [asyncio.create_task(worker()) for _ in range(min(config.max_concurrency, len(items)))]
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
