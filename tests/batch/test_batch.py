"""Batch runs: concurrency bounds, per-tape failures, the store (skip, resume, cancel, kill -9)
and the ``tapekit batch`` command.

The agent here is small but takes every path a real one does: two LLM nodes per loop, a
two-step node run (``SetNextNode`` then an action) that a crash can cut in the middle, an
environment that answers actions, and deterministic LLM answers (a function of the prompt), so
that a resumed tape must come out exactly as a sequential run makes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from typer.testing import CliRunner

from tapekit import (
    LLM,
    Action,
    Agent,
    Environment,
    FunctionLLM,
    LLMOutput,
    Node,
    Observation,
    Prompt,
    SetNextNode,
    StopStep,
    Tape,
    Thought,
    ToolEnvironment,
    UserStep,
    main_loop,
    unanswered_actions,
)
from tapekit.batch import BatchResult, BatchStats, abatch, batch, batch_tags, batch_tape_id
from tapekit.cli import app
from tapekit.llm.base import LLMCall, LLMEvent
from tapekit.store import MemoryStore, SQLiteStore, TapeFilter
from tests.store.test_store_llm_text import check_half_emoji_session, half_emoji_agent

ROOT = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------- the test agent


class BTask(Observation):
    kind: Literal["batch_test.task"] = "batch_test.task"
    word: str
    n: int
    fail: str = ""  # "agent", "env", "bug", "flaky" or "surrogate": where this tape fails


class BNote(Thought):
    kind: Literal["batch_test.note"] = "batch_test.note"
    text: str


class BWork(Action):
    kind: Literal["batch_test.work"] = "batch_test.work"
    i: int


class BDone(Observation):
    kind: Literal["batch_test.done"] = "batch_test.done"
    i: int
    value: str


def _task(tape: Tape[Any, Any]) -> BTask:
    first = tape.steps[0]
    assert isinstance(first, BTask)
    return first


def _dones(tape: Tape[Any, Any]) -> int:
    return sum(isinstance(s, BDone) for s in tape.steps)


class NoteNode(Node):
    """Writes a note about the progress so far."""

    name: str = "note"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        task = _task(tape)
        return Prompt(messages=[{"role": "user", "content": f"note {task.word} after {_dones(tape)}"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: Any) -> Iterator[Any]:
        yield BNote(text=llm_stream.get_text())


class ActNode(Node):
    """Asks for another piece of work until the task's ``n`` are done, then stops."""

    name: str = "act"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        task = _task(tape)
        return Prompt(messages=[{"role": "user", "content": f"act {task.word} {_dones(tape)}/{task.n}"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: Any) -> Iterator[Any]:
        task, done = _task(tape), _dones(tape)
        if task.fail == "agent" and done == 1:
            raise ValueError(f"the act node refuses {task.word}")
        if done >= task.n:
            yield StopStep(reason=llm_stream.get_text())
        else:
            yield SetNextNode(next_node="note")
            yield BWork(i=done)


def answer(prompt: Prompt) -> str:
    """The deterministic 'model': a digest of the prompt."""
    text = prompt.messages[-1]["content"]
    return f"{text.split()[0]}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


class BEnv(Environment):
    """Answers each BWork; fails on purpose for tasks marked so."""

    name = "batch_test_env"

    def __init__(self, flaky: bool = True) -> None:
        self.flaky = flaky

    async def areact(self, tape: Tape[Any, Any]) -> Any:
        task = _task(tape)
        if task.fail == "env" or (task.fail == "flaky" and self.flaky):
            raise RuntimeError(f"the environment is down for {task.word}")
        if task.fail == "bug":
            return "not a tape"  # the loop itself then fails: an unexpected error
        half = " \ud83d" if task.fail == "surrogate" else ""  # text the store refuses
        answers = [BDone(i=a.i, value=f"{task.word}:{a.i}{half}") for a in unanswered_actions(tape)]  # type: ignore[attr-defined]
        return tape.with_new_steps(answers, author=self.name)


def make_agent(llm: LLM | None = None, latency_s: float = 0.0) -> Agent:
    """The test agent on ``llm`` (default: the deterministic FunctionLLM)."""
    return Agent.create(
        "worker", llms=llm or FunctionLLM(fn=answer, latency_s=latency_s), nodes=[NoteNode(), ActNode()]
    )


def factory() -> tuple[Agent, Environment]:
    """``module:attr`` target for the CLI and subprocess tests."""
    return make_agent(), BEnv()


def slow_factory() -> tuple[Agent, Environment]:
    """The same agent with 30 ms per LLM call, so that a batch takes a few seconds."""
    return make_agent(latency_s=0.03), BEnv()


def make_tapes(n: int, fail: dict[int, str] | None = None) -> list[Tape[Any, Any]]:
    """``n`` start tapes with ids task-0..task-{n-1}; task i needs ``1 + i % 4`` loops."""
    fail = fail or {}
    return [
        Tape(steps=[BTask(word=f"w{i}", n=1 + i % 4, fail=fail.get(i, ""))]).with_metadata(id=f"task-{i}")
        for i in range(n)
    ]


def content(tape: Tape[Any, Any]) -> list[Any]:
    """What must be identical between runs: each step's content and authorship (ids aside)."""
    return [(s.kind, s.llm_dict(), s.metadata.agent, s.metadata.node, s.metadata.run_end) for s in tape.steps]


def sequential(tapes: list[Tape[Any, Any]], max_loops: int | None = None) -> list[Tape[Any, Any]]:
    """The reference: each tape through the plain main loop, one after the other."""
    agent, env = factory()
    return [main_loop(agent, t, env, max_loops).get_final_tape() for t in tapes]


def calls_left(final: Tape[Any, Any], prefix_len: int) -> int:
    """LLM calls a run must make to finish ``final`` from its first ``prefix_len`` steps: every
    node run (all are LLM-backed here) not complete within the prefix."""
    runs = list(dict.fromkeys(s.metadata.prompt_id for s in final.steps if s.metadata.prompt_id))
    complete = {s.metadata.prompt_id for s in final.steps[:prefix_len] if s.metadata.run_end}
    return len([r for r in runs if r not in complete])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "batch.db") as s:
        yield s


class GaugeLLM(LLM):
    """Answers like ``answer`` after a short wait, counting the requests in flight."""

    model_name: str = "gauge"
    delay_s: float = 0.004
    in_flight: int = 0
    peak: int = 0
    probe: Callable[[], None] | None = None

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.probe is not None:
            self.probe()
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        yield LLMEvent(output=LLMOutput(content=answer(prompt)), prompt_tokens=7, output_tokens=3)


# ----------------------------------------------------------------------------- running


def test_results_match_a_sequential_run_and_come_as_tapes_finish() -> None:
    tapes = [Tape(steps=[BTask(word="long", n=6)]), Tape(steps=[BTask(word="short", n=1)])]
    agent, env = make_agent(latency_s=0.01), BEnv()

    async def collect() -> list[BatchResult]:
        return [r async for r in abatch(agent, env, tapes)]

    results = asyncio.run(collect())
    assert [r.index for r in results] == [1, 0]  # the short tape finishes first
    reference = sequential(tapes)
    for r in results:
        assert r.ok and not r.skipped and not r.resumed
        assert r.start_id == tapes[r.index].metadata.id and r.tape_id == batch_tape_id("batch", r.start_id)
        assert content(r.tape) == content(reference[r.index])
        assert r.llm_calls == 2 * (_task(r.tape).n + 1)

    many = make_tapes(24)
    out = batch(make_agent(), BEnv(), many, max_concurrency=5)  # the sync API returns input order
    assert [r.index for r in out] == list(range(24))
    assert [content(r.tape) for r in out] == [content(t) for t in sequential(many)]


def test_max_concurrency_bounds_the_tapes_in_flight() -> None:
    stats = BatchStats()
    running: list[int] = []
    llm = GaugeLLM(probe=lambda: running.append(stats.running))
    results = batch(make_agent(llm), BEnv(), make_tapes(20), max_concurrency=3, stats=stats)
    assert all(r.ok for r in results)
    assert max(running) == 3 and llm.peak == 3  # reached, never exceeded
    assert (stats.finished, stats.failed, stats.running, stats.total) == (20, 0, 0, 20)
    assert stats.llm_calls == sum(r.llm_calls for r in results) == sum(2 * (1 + i % 4 + 1) for i in range(20))
    assert stats.prompt_tokens == 7 * stats.llm_calls and stats.tokens_per_s > 0


def test_llm_concurrency_bounds_requests_and_changes_nothing_else() -> None:
    tapes = make_tapes(16)

    def run(limit: Any, llms: dict[str, GaugeLLM]) -> list[BatchResult]:
        agent = Agent.create("worker", llms=dict(llms), nodes=[NoteNode(llm="fast"), ActNode(llm="slow")])
        calls: list[Any] = []

        async def collect() -> list[BatchResult]:
            out = []
            async for r in abatch(agent, BEnv(), tapes, max_concurrency=16, llm_concurrency=limit):
                out.append(r)
            return out

        out = asyncio.run(collect())
        assert all(r.ok for r in out), calls
        return sorted(out, key=lambda r: r.index)

    free = {"fast": GaugeLLM(), "slow": GaugeLLM()}
    unlimited = run(None, free)
    assert free["fast"].peak > 2 and free["slow"].peak > 2

    limited = {"fast": GaugeLLM(), "slow": GaugeLLM()}
    by_key = run({"slow": 2}, limited)
    assert limited["slow"].peak == 2 and limited["fast"].peak > 2
    assert [content(r.tape) for r in by_key] == [content(r.tape) for r in unlimited]
    assert [r.llm_calls for r in by_key] == [r.llm_calls for r in unlimited]

    shared = GaugeLLM()  # one LLM under two keys shares one limit
    run(3, {"fast": shared, "slow": shared})
    assert shared.peak == 3


def test_llm_concurrency_keeps_the_recorded_calls(store: SQLiteStore) -> None:
    tapes = make_tapes(6)
    batch(make_agent(GaugeLLM()), BEnv(), tapes, store=store, llm_concurrency=1, name="limited")
    for start, reference in zip(tapes, sequential(tapes), strict=True):
        stored = store.get_tape(batch_tape_id("limited", start.metadata.id))
        assert content(stored) == content(reference)
        for step in stored.steps[1:]:
            if step.metadata.prompt_id:
                call = store.llm_call_for_step(step)
                assert call is not None and call.model == "gauge" and call.prompt_tokens == 7


def test_one_failing_tape_never_stops_the_others() -> None:
    fail = {1: "agent", 2: "env", 3: "bug"}
    tapes = make_tapes(8, fail)
    results = batch(make_agent(), BEnv(), tapes, max_concurrency=8)
    errors = {r.index: r.error for r in results if r.error}
    assert set(errors) == {1, 2, 3}
    assert "ValueError: the act node refuses w1" in errors[1] and "worker.act" in errors[1]
    assert "RuntimeError: the environment is down for w2" in errors[2]
    assert "AttributeError" in errors[3] and "in batch 'batch'" in errors[3]
    for r in results:
        assert r.tape.metadata.error == r.error
        assert len(r.tape) > 1  # the steps made before the failure are kept
    reference = sequential([t for i, t in enumerate(tapes) if i not in fail])
    assert [content(r.tape) for r in results if r.ok] == [content(t) for t in reference]


def test_a_tape_with_text_the_store_refuses_fails_alone_and_every_other_tape_is_stored(
    store: SQLiteStore,
) -> None:
    """Text from the caller's own code (here the environment's observation) that the store
    cannot hold fails that tape alone (a model's output is escaped instead: see below)."""
    tapes = make_tapes(6, {2: "surrogate"})
    results = batch(make_agent(), BEnv(), tapes, store=store, name="s")
    errors = {r.index: r.error for r in results if r.error}
    assert set(errors) == {2} and "lone surrogate" in (errors[2] or "")
    _, done, failed = batch_tags("s")
    assert set(store.list_tapes(TapeFilter(tag=done))) == {batch_tape_id("s", f"task-{i}") for i in range(6)}
    assert store.list_tapes(TapeFilter(tag=failed)) == [batch_tape_id("s", "task-2")]
    assert "lone surrogate" in (store.get_tape(batch_tape_id("s", "task-2")).metadata.error or "")
    reference = sequential([t for i, t in enumerate(tapes) if i != 2])
    stored = [store.get_tape(batch_tape_id("s", f"task-{i}")) for i in (0, 1, 3, 4, 5)]
    assert [content(t) for t in stored] == [content(t) for t in reference]


def test_a_model_answering_half_an_emoji_fails_no_tape_of_a_batch(store: SQLiteStore) -> None:
    """A model whose text and JSON hold lone surrogates: every tape finishes and is stored,
    with the escapes in its steps and its LLM calls."""
    tapes = [Tape(steps=[UserStep(content=f"hi {i}")]).with_metadata(id=f"t{i}") for i in range(3)]
    results = batch(half_emoji_agent(), ToolEnvironment(), tapes, store=store, name="h", max_concurrency=3)
    assert [r.error for r in results] == [None] * 3
    _, done, failed = batch_tags("h")
    assert set(store.list_tapes(TapeFilter(tag=done))) == {batch_tape_id("h", f"t{i}") for i in range(3)}
    assert store.list_tapes(TapeFilter(tag=failed)) == []
    for r in results:
        stored = store.get_tape(r.tape_id)
        assert [s.llm_dict() for s in stored.steps] == [s.llm_dict() for s in r.tape.steps]
        check_half_emoji_session(store, stored)


def test_bad_arguments_fail_at_the_call() -> None:
    agent, env = factory()
    tapes = make_tapes(2)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"tapes": [*tapes, tapes[0]]}, "same id 'task-0'"),
        ({"tapes": [Tape(steps=[]).with_metadata(id="")]}, "empty metadata.id"),
        ({"tapes": tapes[0]}, "not one tape"),
        ({"tapes": [tapes[0], "x"]}, "tapes[1] is a str"),
        ({"max_concurrency": 0}, "max_concurrency must be a positive int"),
        ({"max_concurrency": True}, "max_concurrency must be a positive int"),
        ({"llm_concurrency": -1}, "llm_concurrency must be a positive int"),
        ({"llm_concurrency": {"nope": 2}}, "does not have (its LLM keys: ['default'])"),
        ({"llm_concurrency": {"default": 0}}, "llm_concurrency['default']"),
        ({"name": "a b"}, "batch name 'a b'"),
        ({"max_loops": 0}, "max_loops must be a positive int"),
        ({"store": object()}, "store must be a TapeStore"),
        ({"on_llm_call": 3}, "on_llm_call must be a function"),
        ({"on_llm_call": print, "backend": "ray"}, "on_llm_call runs in this process"),
        ({"backend": "dask"}, "choose 'local' or 'ray'"),
        ({"agent": env}, "agent must be an Agent"),
        ({"environment": agent}, "environment must be an Environment"),
    ]
    for change, message in bad:
        kwargs: dict[str, Any] = {"agent": agent, "environment": env, "tapes": tapes, **change}
        with pytest.raises((ValueError, TypeError)) as caught:
            abatch(kwargs.pop("agent"), kwargs.pop("environment"), kwargs.pop("tapes"), **kwargs)
        assert message in str(caught.value), (change, caught.value)
    team = Agent.create("boss", subagents=[Agent.create("helper")])
    with pytest.raises(ValueError, match="not its subagent 'boss/helper'"):
        batch(team.subagents[0], env, tapes)
    assert batch(agent, env, []) == []


def test_sync_batch_works_inside_a_running_loop() -> None:
    async def main() -> list[BatchResult]:
        return batch(make_agent(), BEnv(), make_tapes(3))

    results = asyncio.run(main())
    assert [r.ok for r in results] == [True] * 3


# ----------------------------------------------------------------------------- the store


def test_the_store_holds_every_tape_and_a_rerun_skips_them(store: SQLiteStore) -> None:
    tapes = make_tapes(10, {4: "env"})
    first = batch(make_agent(), BEnv(), tapes, store=store, name="eval")
    started, done, failed = batch_tags("eval")
    ids = {batch_tape_id("eval", t.metadata.id) for t in tapes}
    assert (
        set(store.list_tapes(TapeFilter(tag=started))) == set(store.list_tapes(TapeFilter(tag=done))) == ids
    )
    assert store.list_tapes(TapeFilter(tag=failed)) == [batch_tape_id("eval", "task-4")]
    for r in first:
        stored = store.get_tape(r.tape_id)
        assert content(stored) == content(r.tape) and stored.metadata.error == r.error
        assert [s.metadata.id for s in stored.steps] == [s.metadata.id for s in r.tape.steps]
        prompt_ids = {s.metadata.prompt_id for s in stored.steps if s.metadata.prompt_id}
        assert all(store.get_llm_call(p) is not None for p in prompt_ids)
        assert len(prompt_ids) == r.llm_calls

    again = batch(make_agent(), BEnv(), tapes, store=store, name="eval")
    assert all(r.skipped and r.llm_calls == 0 for r in again)
    assert [content(r.tape) for r in again] == [content(r.tape) for r in first]
    assert again[4].error == first[4].error and not again[4].ok
    assert len(store.list_tapes()) == 10  # nothing duplicated

    other = batch(make_agent(), BEnv(), tapes, store=store, name="other")  # another batch: its own tapes
    assert not any(r.skipped for r in other) and len(store.list_tapes()) == 20
    # each stored run continues its start tape, so two batches over the same tapes pair up
    for t, a, b in zip(tapes, first, other, strict=True):
        assert a.tape.metadata.id == a.tape_id and a.tape.metadata.parent_id == t.metadata.id
        assert set(store.list_tapes(TapeFilter(parent_id=t.metadata.id))) == {a.tape_id, b.tape_id}


def test_a_memory_store_holds_and_resumes_a_batch_as_sqlite_does() -> None:
    tapes = make_tapes(6, {2: "env"})
    with MemoryStore() as store:
        first = batch(make_agent(), BEnv(), tapes, store=store, name="mem")
        _, done, failed = batch_tags("mem")
        assert len(store.list_tapes(TapeFilter(tag=done))) == 6
        assert store.list_tapes(TapeFilter(tag=failed)) == [batch_tape_id("mem", "task-2")]
        again = batch(make_agent(), BEnv(), tapes, store=store, name="mem")
        assert all(r.skipped for r in again)
        assert [content(r.tape) for r in again] == [content(r.tape) for r in first]


def test_on_llm_call_sees_every_call_as_it_completes(store: SQLiteStore) -> None:
    tapes = make_tapes(5)
    seen: list[LLMCall] = []
    results = batch(make_agent(), BEnv(), tapes, store=store, on_llm_call=seen.append)
    assert len(seen) == sum(r.llm_calls for r in results) > 0
    assert len({c.prompt.id for c in seen}) == len(seen)
    for call in seen:
        assert store.get_llm_call(call.prompt.id) == call  # the same calls the store holds

    def fail(call: LLMCall) -> None:
        raise RuntimeError("the hook broke")

    broken = batch(make_agent(), BEnv(), tapes[:1], on_llm_call=fail)
    assert broken[0].error is not None and "the hook broke" in broken[0].error  # fails that tape only


def test_retry_failed_runs_the_failed_tapes_again(store: SQLiteStore) -> None:
    tapes = make_tapes(4, {2: "flaky"})
    first = batch(make_agent(), BEnv(flaky=True), tapes, store=store)
    assert [r.ok for r in first] == [True, True, False, True]
    kept = batch(make_agent(), BEnv(flaky=False), tapes, store=store)
    assert all(r.skipped for r in kept) and not kept[2].ok
    retried = batch(make_agent(), BEnv(flaky=False), tapes, store=store, retry_failed=True)
    assert [r.skipped for r in retried] == [True, True, False, True]
    assert retried[2].ok and retried[2].resumed
    reference = main_loop(make_agent(), tapes[2], BEnv(flaky=False)).get_final_tape()
    assert content(retried[2].tape) == content(reference)
    assert store.list_tapes(TapeFilter(tag=batch_tags("batch")[2])) == []
    assert store.get_tape(retried[2].tape_id).metadata.error is None


class WatchedStore(SQLiteStore):
    """The real SQLite store, noting each save (id, number of steps, tags) as it is queued."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saves: list[tuple[str, int, tuple[str, ...]]] = []

    def save_tape(self, tape: Tape[Any, Any], tape_id: str | None = None, *, tags: Any = ()) -> str:
        key = super().save_tape(tape, tape_id, tags=tags)
        self.saves.append((key, len(tape), tuple(tags)))
        return key


def test_a_complete_tape_is_only_ever_written_with_its_done_tag(tmp_path: Path) -> None:
    # each save is one transaction: if a kill can never leave a complete tape without its done
    # tag, a re-run never starts a new turn on a tape that had finished
    tapes = make_tapes(8, {2: "env", 3: "agent"})
    with WatchedStore(tmp_path / "w.db") as store:
        results = batch(make_agent(), BEnv(), tapes, store=store, max_concurrency=8)
    done = batch_tags("batch")[1]
    for r in results:
        saves = [(n, tags) for key, n, tags in store.saves if key == r.tape_id]
        assert saves[-1] == (len(r.tape), (done, batch_tags("batch")[2]) if r.error else (done,))
        assert all(n < len(r.tape) for n, tags in saves[:-1]), saves
        assert len(saves) >= len(r.tape) - 1  # and the steps were written as they were made


@pytest.mark.parametrize("max_loops", [None, 2])
def test_a_stored_tape_cut_anywhere_resumes_to_the_sequential_result(
    store: SQLiteStore, max_loops: int | None
) -> None:
    start = make_tapes(4)[3]  # four loops: 10 node runs, some of them two steps long
    reference = sequential([start], max_loops)[0]
    for cut in range(1, len(reference)):
        name = f"cut{cut}"
        prefix = reference.model_copy(update={"steps": reference.steps[:cut]})
        store.save_tape(prefix, batch_tape_id(name, start.metadata.id), tags=[batch_tags(name)[0]])
        [result] = batch(make_agent(), BEnv(), [start], store=store, name=name, max_loops=max_loops)
        assert result.resumed and result.ok, (cut, result.error)
        assert content(result.tape) == content(reference), cut
        assert result.llm_calls == calls_left(reference, cut), cut
        stored = store.get_tape(result.tape_id)
        assert content(stored) == content(reference) and len(stored) == len(reference)


def test_cancelling_keeps_finished_tapes_and_leaves_the_rest_resumable(store: SQLiteStore) -> None:
    tapes = make_tapes(24)
    reference = {t.metadata.id: content(r) for t, r in zip(tapes, sequential(tapes), strict=True)}
    seen: list[BatchResult] = []

    async def run_then_cancel() -> None:
        async def consume() -> None:
            async for r in abatch(make_agent(latency_s=0.01), BEnv(), tapes, store=store, max_concurrency=6):
                seen.append(r)

        task = asyncio.create_task(consume())
        while len(seen) < 5:
            await asyncio.sleep(0.002)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run_then_cancel())
    started, done, _ = batch_tags("batch")
    done_ids = set(store.list_tapes(TapeFilter(tag=done)))
    assert {r.tape_id for r in seen} <= done_ids and len(done_ids) < len(tapes)
    unfinished = set(store.list_tapes(TapeFilter(tag=started))) - done_ids
    assert unfinished  # some tapes were cut while running
    by_key = {batch_tape_id("batch", t.metadata.id): t.metadata.id for t in tapes}
    for key in unfinished:  # stored as far as they got: a prefix of the sequential tape
        stored = content(store.get_tape(key))
        assert stored == reference[by_key[key]][: len(stored)]

    rerun = batch(make_agent(), BEnv(), tapes, store=store)
    assert {r.tape_id for r in rerun if r.skipped} == done_ids
    assert {r.tape_id for r in rerun if r.resumed} == unfinished
    assert all(content(r.tape) == reference[r.start_id] for r in rerun)
    assert len(store.list_tapes()) == len(tapes)


# ----------------------------------------------------------------------------- kill -9

KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    from tapekit.batch import batch
    from tapekit.store import SQLiteStore
    from tests.batch.test_batch import make_tapes, slow_factory

    agent, env = slow_factory()
    with SQLiteStore(sys.argv[1]) as store:
        batch(agent, env, make_tapes(int(sys.argv[2])), store=store, name="killed", max_concurrency=4)
    print("finished")
    """
)


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_batch_killed_with_sigkill_resumes_without_losing_or_repeating_work(tmp_path: Path) -> None:
    n = 40
    path = tmp_path / "killed.db"
    SQLiteStore(path).close()  # the schema exists before the reader looks
    started_tag, done_tag, _ = batch_tags("killed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(path), str(n)], cwd=ROOT, env=env, stderr=subprocess.PIPE
    )
    try:
        with SQLiteStore(path) as watcher:
            _wait_for(lambda: watcher.count_tapes(TapeFilter(tag=done_tag)) >= 8, 30, "some tapes to finish")
            process.send_signal(signal.SIGKILL)
            process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL, process.stderr.read() if process.stderr else ""

    tapes = make_tapes(n)
    reference = {t.metadata.id: r for t, r in zip(tapes, sequential(tapes), strict=True)}
    key_of = {t.metadata.id: batch_tape_id("killed", t.metadata.id) for t in tapes}
    with SQLiteStore(path) as store:
        done_before = set(store.list_tapes(TapeFilter(tag=done_tag)))
        started_before = set(store.list_tapes(TapeFilter(tag=started_tag)))
        assert 8 <= len(done_before) < n, "the kill came too late to test anything"
        stored_len = {key: store.get_tape_info(key).n_steps for key in started_before}
        for start_id, key in key_of.items():  # what survived the kill is a prefix of the truth
            if key in started_before:
                stored = content(store.get_tape(key))
                assert stored == content(reference[start_id])[: len(stored)]
                assert (key in done_before) == (len(stored) == len(reference[start_id]))

        agent, environment = factory()
        rerun = batch(agent, environment, tapes, store=store, name="killed")

        expected_calls = 0
        for r in rerun:
            truth = reference[r.start_id]
            assert r.ok and content(r.tape) == content(truth)
            if r.tape_id in done_before:
                assert r.skipped and r.llm_calls == 0
            else:  # only the missing node runs were made
                left = calls_left(truth, stored_len.get(r.tape_id, 1))
                assert not r.skipped and r.resumed == (r.tape_id in started_before)
                assert r.llm_calls == left, (r.start_id, stored_len.get(r.tape_id))
                expected_calls += left
        assert sum(r.llm_calls for r in rerun) == expected_calls > 0

        # nothing duplicated, nothing lost: one stored tape per input, each done and complete,
        # each step's LLM call stored with the output that made it
        assert sorted(store.list_tapes(TapeFilter(tag=started_tag))) == sorted(key_of.values())
        assert sorted(store.list_tapes(TapeFilter(tag=done_tag))) == sorted(key_of.values())
        assert len(store.list_tapes()) == n
        for start_id, key in key_of.items():
            stored = store.get_tape(key)
            assert content(stored) == content(reference[start_id])
            for step in stored.steps:
                if step.metadata.prompt_id and step.metadata.run_end:
                    call = store.llm_call_for_step(step)
                    assert call is not None and call.prompt.messages == _prompt_messages(stored, step)


def _prompt_messages(tape: Tape[Any, Any], step: Any) -> list[dict[str, Any]]:
    """The messages of the node run that made ``step``, rebuilt from the tape."""
    index = next(i for i, s in enumerate(tape.steps) if s.metadata.prompt_id == step.metadata.prompt_id)
    node = NoteNode() if step.metadata.node == "note" else ActNode()
    return node.make_prompt(make_agent(), tape[:index]).messages


# ----------------------------------------------------------------------------- the command


def _write_tapes(path: Path, tapes: list[Tape[Any, Any]]) -> Path:
    path.write_text("".join(t.model_dump_json() + "\n" for t in tapes))
    return path


def test_the_batch_command_runs_stores_and_resumes(tmp_path: Path) -> None:
    tapes_file = _write_tapes(tmp_path / "tasks.jsonl", make_tapes(12))
    db = tmp_path / "cli.db"
    args = ["batch", "tests.batch.test_batch:factory", "--tapes", str(tapes_file), "--db", str(db)]
    runner = CliRunner()
    first = runner.invoke(app, [*args, "--concurrency", "4", "--llm-concurrency", "2", "--name", "cli"])
    assert first.exit_code == 0, first.output
    assert "12 of 12 finished (0 failed, 0 already done" in first.output
    again = runner.invoke(app, [*args, "--name", "cli"])
    assert again.exit_code == 0 and "12 already done" in again.output and "0 LLM calls" in again.output
    with SQLiteStore(db) as store:
        assert len(store.list_tapes(TapeFilter(tag="batch:cli:done"))) == 12
        reference = sequential(make_tapes(12))
        for t, ref in zip(make_tapes(12), reference, strict=True):
            assert content(store.get_tape(batch_tape_id("cli", t.metadata.id))) == content(ref)


def test_the_batch_command_reports_failures_and_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    tapes_file = _write_tapes(tmp_path / "tasks.jsonl", make_tapes(5, {3: "env"}))
    db = str(tmp_path / "cli.db")
    failed = runner.invoke(
        app, ["batch", "tests.batch.test_batch:factory", "--tapes", str(tapes_file), "--db", db]
    )
    assert failed.exit_code == 1
    assert "1 failed" in failed.output and "RuntimeError: the environment is down for w3" in failed.output

    no_ids = tmp_path / "plain.jsonl"  # lines without ids get ids from their content: reruns match
    no_ids.write_text(json.dumps({"steps": [{"kind": "batch_test.task", "word": "a", "n": 1}]}) + "\n")
    for _ in range(2):
        out = runner.invoke(
            app, ["batch", "tests.batch.test_batch:factory", "--tapes", str(no_ids), "--db", db]
        )
        assert out.exit_code == 0, out.output
    assert "1 already done" in out.output

    dup = tmp_path / "dup.jsonl"
    dup.write_text(no_ids.read_text() * 2)
    cases = [
        (["tests.batch.test_batch:nothing", "--tapes", str(tapes_file)], "has no attribute 'nothing'"),
        (["tests.batch.test_batch", "--tapes", str(tapes_file)], "must look like 'package.module:attr'"),
        (
            ["tests.batch.test_batch:make_agent", "--tapes", str(tapes_file)],
            "must return (agent, environment)",
        ),
        (
            ["tests.batch.test_batch:make_tapes", "--tapes", str(tapes_file)],
            "calling 'tests.batch.test_batch:make_tapes' failed",
        ),
        (["tests.batch.test_batch:factory", "--tapes", str(dup)], "lines 1 and 2 are the same tape"),
        (["tests.batch.test_batch:factory", "--tapes", str(tmp_path / "none.jsonl")], "No such file"),
        (
            ["tests.batch.test_batch:factory", "--tapes", str(tapes_file), "--concurrency", "0"],
            "max_concurrency",
        ),
        (
            ["tests.batch.test_batch:factory", "--tapes", str(tapes_file), "--backend", "x"],
            "choose local or ray",
        ),
    ]
    for extra, message in cases:
        out = runner.invoke(app, ["batch", *extra, "--db", db])
        assert out.exit_code == 2 and message in " ".join(out.output.split()), (extra, out.output)


def test_the_batch_command_names_the_file_and_line_of_an_unreadable_tapes_file(tmp_path: Path) -> None:
    good = make_tapes(1)[0].model_dump_json() + "\n"
    bad_lines = {
        "deep.jsonl": b'{"steps": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        "latin1.jsonl": b'{"steps": [{"kind": "batch_test.task", "word": "caf\xe9", "n": 1}]}\n',
        "long-int.jsonl": b'{"steps": [{"kind": "batch_test.task", "n": ' + b"9" * 5000 + b"}]}\n",
    }
    for file_name, bad in bad_lines.items():
        path = tmp_path / file_name
        path.write_bytes(good.encode() + b"\n" + bad)
        out = CliRunner().invoke(
            app,
            ["batch", "tests.batch.test_batch:factory", "--tapes", str(path), "--db", str(tmp_path / "x.db")],
        )
        text = " ".join(out.output.split())
        assert out.exit_code == 2 and f"{file_name}, line 3:" in text, (file_name, out.output)
        assert "Traceback" not in out.output


def test_the_batch_command_finds_the_projects_own_modules_and_retry_failed_is_a_flag(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(
        "from tests.batch.test_batch import factory  # the user's own module\n"
    )
    _write_tapes(tmp_path / "tasks.jsonl", make_tapes(2))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "150"}
    # -P: python itself does not put the working directory on sys.path; the command must
    args = ["batch", "my_agent:factory", "--tapes", "tasks.jsonl", "--db", "t.db", "--retry-failed"]
    command = [sys.executable, "-P", "-m", "tapekit.cli", *args]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "2 of 2 finished" in run.stderr, run.stderr
    helped = CliRunner().invoke(app, ["batch", "--help"], env={"COLUMNS": "150"})
    (line,) = [x for x in helped.output.splitlines() if "--retry-failed" in x]
    assert "<bool>" not in line and "BOOL" not in line.upper().replace("RETRY", "")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_the_command_and_says_how_to_resume(tmp_path: Path) -> None:
    tapes_file = _write_tapes(tmp_path / "tasks.jsonl", make_tapes(40))
    db = tmp_path / "cli.db"
    args = ["batch", "tests.batch.test_batch:slow_factory", "--tapes", str(tapes_file), "--db", str(db)]
    SQLiteStore(db).close()
    process = subprocess.Popen(
        [sys.executable, "-m", "tapekit.cli", *args, "--concurrency", "4", "--name", "ctrlc"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a terminal's Ctrl-C: the command must start with SIGINT's default disposition. A test
        # run started in the background by a non-interactive shell inherits SIGINT ignored, and
        # then Python never turns the signal into KeyboardInterrupt (the batch ran to the end)
        preexec_fn=_default_sigint,
    )
    try:
        with SQLiteStore(db) as watcher:
            _wait_for(
                lambda: watcher.count_tapes(TapeFilter(tag="batch:ctrlc:done")) >= 4,
                30,
                "some tapes to finish",
            )
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    err = " ".join(err.split())
    assert "interrupted:" in err and "of 40 tapes finished" in err and "Run the same command again" in err
    with SQLiteStore(db) as store:
        done = len(store.list_tapes(TapeFilter(tag="batch:ctrlc:done")))
    assert 4 <= done < 40
    rerun = CliRunner().invoke(app, [*args[:2], *args[2:], "--name", "ctrlc"])
    assert rerun.exit_code == 0 and f"{done} already done" in " ".join(rerun.output.split())


def test_a_tape_that_waits_is_resumed_by_the_next_run_of_the_batch(tmp_path: Path) -> None:
    """A tape stopped on a payment in doubt is stored without the done tag, so running the batch
    again resumes it instead of skipping it; one that waits for the user's reply is done (as
    before: a batch's natural end)."""
    from tapekit.human import reply
    from tapekit.store import SQLiteStore
    from tapekit.testing import payer

    agent, env = payer.assistant()
    starts = [reply(Tape(), "pay 6"), reply(Tape(), "pay 5")]  # the bank does not answer for 5
    with SQLiteStore(tmp_path / "b.db") as store:
        first = batch(agent, env, starts, store=store, name="pay")
        assert [r.external for r in first] == [True, True]  # 6 paid, then the assistant waits; 5 in doubt
        [doubt] = store.tool_effects(in_doubt=True)
        store.resolve_tool_effect(doubt.key, result="paid 5 (checked)")
        second = batch(agent, env, starts, store=store, name="pay")
        assert [r.skipped for r in second] == [True, False] and second[1].resumed
        assert any(getattr(s, "content", None) == "Done: paid 5 (checked)" for s in second[1].tape.steps)
