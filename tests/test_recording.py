"""Persistence through the main loop (``main_loop(..., store=...)``), the event shortcuts, and
the sync and async streams behaving the same."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tapekit import (
    Agent,
    AgentError,
    AgentEvent,
    AgentStream,
    AsyncAgentStream,
    MainLoopEvent,
    Tape,
    amain_loop,
    main_loop,
)
from tapekit.recording import SessionRecorder
from tapekit.store import SQLiteStore
from tests.test_fork import flat_team
from tests.test_fork import start as fork_start
from tests.test_orchestrator import CountEnv, CountNode, start

ROOT = Path(__file__).resolve().parents[1]


def counter(limit: int) -> Agent:
    return Agent.create(name="counter", nodes=[CountNode(limit=limit)])


def content(tape: Tape[Any, Any]) -> list[Any]:
    return [(s.kind, s.llm_dict(), s.metadata.agent, s.metadata.node) for s in tape.steps]


def test_main_loop_with_a_store_writes_each_step_as_it_is_made(tmp_path: Path) -> None:
    first = start().with_metadata(id="s1", parent_id="origin")
    with SQLiteStore(tmp_path / "t.db") as store, SQLiteStore(tmp_path / "t.db") as watcher:
        made = len(first)
        for event in main_loop(counter(5), first, CountEnv(), store=store, tags=["demo"]):
            if event.step is not None or event.observation is not None:
                made += 1 if event.step is not None else 0
            if event.tape is not None:
                made = len(event.tape)
            store.flush()
            assert watcher.get_tape_info("s1").n_steps == made  # never behind once flushed
        final = main_loop(counter(5), first, CountEnv()).get_final_tape()
        stored = store.get_tape("s1")
        info = store.get_tape_info("s1")
    assert content(stored) == content(final)
    assert info.parent_id == "origin" and info.tags == ["demo"] and info.n_added_steps == len(final) - 1


def test_a_session_stored_under_another_id_continues_its_start(tmp_path: Path) -> None:
    first = start().with_metadata(id="s1")
    with SQLiteStore(tmp_path / "t.db") as store:
        final = asyncio.run(
            amain_loop(counter(2), first, CountEnv(), store=store, tape_id="run").get_final_tape()
        )
        info = store.get_tape_info("run")
        assert content(store.get_tape("run")) == content(final)
    assert info.parent_id == "s1"
    with pytest.raises(ValueError, match="pass store= too"):
        main_loop(counter(2), first, CountEnv(), tape_id="x")


_CHILD = """
import sys, time
from tapekit import main_loop
from tapekit.store import SQLiteStore
from tests.test_orchestrator import CountEnv, start
from tests.test_recording import counter

class SlowEnv(CountEnv):
    def react(self, tape):
        time.sleep(0.002)
        return super().react(tape)

with SQLiteStore(sys.argv[1], flush_interval_s=0.01) as store:
    first = start().with_metadata(id="killed")
    for event in main_loop(counter(100_000), first, SlowEnv(), store=store):
        pass
"""


def test_sigkill_mid_session_keeps_a_resumable_prefix(tmp_path: Path) -> None:
    """A session killed with SIGKILL while it runs: what the store holds is a prefix of the run,
    and the main loop resumes it from there to the same tape as an uninterrupted run."""
    db = tmp_path / "k.db"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(db)], cwd=ROOT, env={**os.environ})
    try:
        deadline = time.monotonic() + 120  # only a bound on a hung child, never reached normally
        n = 0
        while n < 60:
            assert child.poll() is None, "the child stopped before it was killed"
            assert time.monotonic() < deadline, "the child made no progress"
            time.sleep(0.05)
            if db.exists():
                with SQLiteStore(db) as reader:
                    n = reader.get_tape_info("killed").n_steps if reader.list_tapes() else 0
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    limit = 100_000
    with SQLiteStore(db) as store:
        cut = store.get_tape("killed")
        assert len(cut) >= 60
        reference = main_loop(counter(limit), start(), CountEnv(), max_loops=len(cut)).get_final_tape()
        assert content(cut) == content(reference)[: len(cut)]  # a prefix, nothing lost in between
        # resume with a lower limit so the test ends: the count continues from the stored steps
        resumed = main_loop(counter(len(cut) // 3 + 5), cut, CountEnv(), store=store).get_final_tape()
        stored = store.get_tape("killed")
    assert content(stored) == content(resumed)
    full = main_loop(counter(len(cut) // 3 + 5), start(), CountEnv()).get_final_tape()
    assert content(resumed) == content(full)


class CountingStore(SQLiteStore):
    """Records how many writes were queued each time one more is handed over."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, flush_interval_s=5.0)  # the writer would let thousands pile up
        self.seen: list[int] = []

    def save_tape(self, *args: Any, **kwargs: Any) -> str:
        self.seen.append(self.pending_writes())
        return super().save_tape(*args, **kwargs)


def test_the_writer_queue_is_bounded(tmp_path: Path) -> None:
    first = start()
    with CountingStore(tmp_path / "b.db") as store:
        recorder = SessionRecorder(store, first, max_pending=8)
        final = main_loop(counter(200), first, CountEnv(), recorder=recorder).get_final_tape()
        assert content(store.get_tape(first.metadata.id)) == content(final)
    assert len(store.seen) > 400
    assert max(store.seen) <= 8 + 2  # the bound, plus the writes of the event that crossed it


# --------------------------------------------------------------------------- events and streams


def test_main_loop_events_reach_into_agent_events() -> None:
    events = list(main_loop(flat_team(), fork_start(), CountEnv()))
    steps = [e.step for e in events if e.step is not None]
    assert steps and steps == [e.agent_event.step for e in events if e.agent_event and e.agent_event.step]
    calls = [e.llm_call for e in events if e.llm_call is not None]
    assert calls and all(e.agent_event is not None for e in events if e.llm_call is not None)
    other = MainLoopEvent(observation=None, agent_tape=fork_start())
    assert (other.step, other.llm_call, other.chunk, other.partial_step) == (None, None, None, None)


def test_agent_streams_carry_only_agent_events_even_through_forks() -> None:
    events = list(flat_team().run(fork_start()))
    assert events and all(type(e) is AgentEvent for e in events)
    assert all(
        sum(v is not None for v in (e.chunk, e.llm_call, e.partial_step, e.step, e.final_tape)) == 1
        for e in events
    )


def test_sync_and_async_streams_give_the_same_results() -> None:
    agent = flat_team()
    sync_tape = agent.run(fork_start()).get_final_tape()
    async_tape = asyncio.run(agent.arun(fork_start()).get_final_tape())
    assert content(sync_tape) == content(async_tape)
    sync_steps = agent.run(fork_start()).get_steps()
    async_steps = asyncio.run(agent.arun(fork_start()).get_steps())
    assert [s.llm_dict() for s in sync_steps] == [s.llm_dict() for s in async_steps]
    assert [s.llm_dict() for s in sync_steps] == [s.llm_dict() for s in sync_tape.steps[1:]]

    loop_sync = main_loop(counter(3), start(), CountEnv())
    loop_async = amain_loop(counter(3), start(), CountEnv())
    assert content(loop_sync.get_final_tape()) == content(asyncio.run(loop_async.get_final_tape()))
    assert len(main_loop(counter(3), start(), CountEnv()).get_steps()) == len(
        asyncio.run(amain_loop(counter(3), start(), CountEnv()).get_steps())
    )
    # no round at all: both return the start tape
    assert (
        main_loop(counter(3), start(), CountEnv(), max_loops=0).get_final_tape().steps[0].content == "count"
    )
    assert len(asyncio.run(amain_loop(counter(3), start(), CountEnv(), max_loops=0).get_final_tape())) == 1


def test_a_stream_partly_iterated_finishes_the_rest() -> None:
    stream = main_loop(counter(4), start(), CountEnv())
    first_events = [event for _, event in zip(range(3), stream, strict=False)]
    assert len(first_events) == 3
    assert content(stream.get_final_tape()) == content(
        main_loop(counter(4), start(), CountEnv()).get_final_tape()
    )


def test_an_agent_stream_without_a_final_tape_is_an_error_in_both_twins() -> None:
    async def nothing() -> AsyncIterator[AgentEvent]:
        for _ in ():
            yield AgentEvent()

    with pytest.raises(AgentError, match="without a final tape"):
        AgentStream(nothing(), start()).get_final_tape()
    with pytest.raises(AgentError, match="without a final tape"):
        asyncio.run(AsyncAgentStream(nothing(), start()).get_final_tape())


def test_a_studio_run_is_stored_as_it_grows_and_an_idle_one_stores_nothing(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")  # tapekit.studio imports the web stack
    from tapekit.studio.runs import NothingToDoError, advance, load_agents
    from tapekit.testing.analyst import start_tape

    registered = load_agents(["tapekit.testing.analyst:team"])["analyst"]
    with SQLiteStore(tmp_path / "s.db") as store:
        first = start_tape()
        step = asyncio.run(advance(registered, first, "step", store=store))
        child = step.tape
        stored = store.get_tape(child.metadata.id)
        assert (
            len(stored) == len(child) == len(first) + step.added
            and stored.metadata.parent_id == first.metadata.id
        )
        assert all(
            store.llm_call_for_step(s) is not None for s in child.steps[len(first) :] if s.metadata.prompt_id
        )
        done = asyncio.run(advance(registered, child, "run", store=store)).tape
        assert content(store.get_tape(done.metadata.id)) == content(done)
        before = store.count_tapes()
        with pytest.raises(NothingToDoError):  # the agent has answered: nothing to add
            asyncio.run(advance(registered, done, "run", store=store))
        assert store.count_tapes() == before
