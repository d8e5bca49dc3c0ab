"""Resuming a long stored session: what it costs does not grow with the session, and it makes
the tape an uninterrupted run makes.

A tape read from a store parses a step only when the step is read, knows its steps' kinds
unread, and carries the digest of its stored steps; the tape view stack passes over the steps
that cannot change it (see ``tapekit/views.py``), and the first save of the resumed session
hashes nothing stored. The costs are counted here (steps parsed, steps serialised, view-stack
pushes), not timed: ``bench/resume.py`` times them.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import pytest

import tapekit.store._reading as reading
import tapekit.store._writes as writes
from tapekit import Agent, Call, Fork, Respond, SetNextNode, Step, StopStep, Tape, main_loop
from tapekit._diff import signatures
from tapekit.core import Action, Branch, Observation, Thought
from tapekit.environment import ToolEnvironment
from tapekit.store import MemoryStore, PostgresStore, SQLiteStore, TapeStore
from tapekit.testing.postgres import TempPostgres
from tapekit.testing.react import ScriptedTurns, react_agent, react_start
from tapekit.views import TapeViewStack

SYSTEM = "You are a calculator agent. Use the add tool, then answer."


def window_agent(turns: int) -> tuple[Agent, ToolEnvironment, ScriptedTurns]:
    """The ReAct agent with a bounded prompt (its view's last 6 steps): what the framework costs
    per step, without a prompt that grows with the session."""
    return react_agent(turns, window=6)


def stored_session(store: TapeStore, k: int) -> str:
    """A ReAct session of ``k`` tool turns, stored unfinished (the model would go on)."""
    agent, env, _ = react_agent(k + 10)
    tape = main_loop(agent, react_start(SYSTEM), env, max_loops=k).get_final_tape()
    assert tape.metadata.error is None and len(tape) == 2 + 3 * k
    return store.save_tape(tape, f"k{k}")


@dataclass
class Counts:
    parsed: int = 0  # stored steps validated into their classes
    serialised: int = 0  # values serialised by a save (steps, to store or hash them; LLM outputs)
    pushed: int = 0  # steps folded one by one into the tape view stack


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    seen = Counts()
    make_parser, to_json, push = reading._step_parser, writes.model_json, TapeViewStack.push

    def counting_parser(tape_class: Any) -> Any:
        parse = make_parser(tape_class)

        def counting(texts: list[str]) -> list[Step]:
            seen.parsed += len(texts)
            return parse(texts)

        return counting

    def counting_json(*args: Any, **kwargs: Any) -> str:
        seen.serialised += 1
        return to_json(*args, **kwargs)

    def counting_push(self: TapeViewStack, step: Step, index: int = -1) -> TapeViewStack:
        seen.pushed += 1
        return push(self, step, index)

    monkeypatch.setattr(reading, "_step_parser", counting_parser)
    monkeypatch.setattr(writes, "model_json", counting_json)
    monkeypatch.setattr(TapeViewStack, "push", counting_push)
    return seen


def resume(
    stored: Path | Callable[[], TapeStore], tape_id: str, k: int, agent_of: Any, counts: Counts
) -> tuple[Counts, int]:
    """The bench's resume (``bench/resume.py``): open the store (an SQLite copy of the stored
    sessions, or what ``stored`` opens), load the tape, rebuild the view, run until the first
    new step; the counts it took, and the tape's length."""
    if isinstance(stored, Path):
        path = stored.with_name(f"copy-{stored.name}")
        shutil.copyfile(stored, path)  # the sessions as stored, for every resume
        stored = partial(SQLiteStore, path)
    agent, env, model = agent_of(k + 10)
    model.calls = k  # the scripted model carries on from turn k
    counts.__init__()  # type: ignore[misc]
    with stored() as store:
        tape = store.get_tape(tape_id)
        agent.compute_view(tape)
        for event in main_loop(agent, tape, env, max_loops=1, store=store):
            if event.agent_event is not None and event.agent_event.step is not None:
                break
        taken = Counts(counts.parsed, counts.serialised, counts.pushed)
    return taken, len(tape)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, str]]:
    path = tmp_path_factory.mktemp("resume") / "sessions.db"
    with SQLiteStore(path) as store:
        ids = {k: stored_session(store, k) for k in (100, 2000)}
    return path, ids


def test_resume_cost_is_flat_in_the_session_length(
    sessions: tuple[Path, dict[int, str]], counts: Counts
) -> None:
    """With a bounded prompt, resuming a 2,000-turn session parses, serialises and folds no more
    than resuming a 100-turn one: a few blocks of steps parsed (the first step of each kind,
    the last turns), nothing stored hashed again, only the new steps pushed on the view stack."""
    path, ids = sessions
    short, n_short = resume(path, ids[100], 100, window_agent, counts)
    long, n_long = resume(path, ids[2000], 2000, window_agent, counts)
    assert (n_short, n_long) == (302, 6002)
    assert short.parsed <= 3 * 64 and long.parsed <= 3 * 64, (short, long)
    assert long.serialised == short.serialised <= 4, (short, long)
    assert long.pushed == short.pushed <= 4, (short, long)


def test_resume_cost_is_flat_on_postgres(pg_cluster: TempPostgres, counts: Counts) -> None:
    """The same on PostgreSQL (its own ``steps_stack`` index and lazy reads): resuming a
    2,000-turn session costs what resuming a 100-turn one does."""
    url = pg_cluster.create_database()
    try:
        with PostgresStore(url) as store:
            ids = {k: stored_session(store, k) for k in (100, 2000)}
        short, n_short = resume(partial(PostgresStore, url), ids[100], 100, window_agent, counts)
        long, n_long = resume(partial(PostgresStore, url), ids[2000], 2000, window_agent, counts)
    finally:
        pg_cluster.drop_database(url.split("/")[3].split("?")[0])
    assert (n_short, n_long) == (302, 6002)
    assert short.parsed <= 3 * 64 and long.parsed <= 3 * 64, (short, long)
    assert long.serialised == short.serialised <= 4, (short, long)
    assert long.pushed == short.pushed <= 4, (short, long)


def test_a_whole_conversation_prompt_parses_each_step_once(
    sessions: tuple[Path, dict[int, str]], counts: Counts
) -> None:
    """The ReAct prompt holds every message, so its first prompt reads every step (once): that
    is the workload's cost. The framework's share stays flat: nothing stored is serialised or
    hashed again, and the view stack pushes only the new steps."""
    path, ids = sessions
    short, n_short = resume(path, ids[100], 100, react_agent, counts)
    long, n_long = resume(path, ids[2000], 2000, react_agent, counts)
    assert (n_short, n_long) == (302, 6002) and (short.parsed, long.parsed) == (n_short, n_long)
    assert long.serialised == short.serialised <= 4, (short, long)
    assert long.pushed == short.pushed <= 4, (short, long)


@pytest.mark.parametrize("cut", [0, 1, 2], ids=["after-the-observation", "inside-a-run", "after-the-action"])
def test_a_resumed_session_makes_the_tape_an_uninterrupted_run_makes(tmp_path: Path, cut: int) -> None:
    """A session stored after 20 turns (and ``cut`` steps of the next one: inside the model's
    node run, or after its tool call), read back and resumed to its end by a new store and a new
    agent, is the session that ran without a stop, step for step, as returned and as stored."""
    turns = 25
    agent, env, _ = react_agent(turns)
    whole = main_loop(agent, react_start(SYSTEM), env).get_final_tape()
    assert isinstance(whole.steps[-1], StopStep) and whole.metadata.error is None
    stop = 2 + 3 * 20 + cut
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        store.save_tape(whole[:stop], "s")
    with SQLiteStore(path) as store:
        agent, env, model = react_agent(turns)
        model.calls = 20 + (cut == 2)  # an open run's call is made again (the same output)
        resumed = main_loop(agent, store.get_tape("s"), env, store=store, tape_id="s").get_final_tape()
        stored = store.get_tape("s")
    assert resumed.metadata.error is None
    assert signatures(resumed.steps) == signatures(whole.steps)
    assert list(stored.steps) == list(resumed.steps)


def test_a_read_tape_parses_its_steps_when_read(tmp_path: Path, counts: Counts) -> None:
    """``get_tape`` parses no step until one is read; reading by index, from the end, or all
    of them gives the steps saved, each parsed once, and a copy shares what was parsed."""
    agent, env, _ = react_agent(400)
    tape = main_loop(agent, react_start(SYSTEM), env, max_loops=300).get_final_tape()
    with SQLiteStore(tmp_path / "s.db") as store:
        store.save_tape(tape, "t")
        counts.__init__()  # type: ignore[misc]
        loaded = store.get_tape("t")
        assert counts.parsed == 0
        assert loaded.steps[-1] == tape.steps[-1]
        assert list(islice(reversed(loaded.steps), 3)) == list(islice(reversed(tape.steps), 3))
        assert counts.parsed <= 64
        assert list(loaded.steps) == list(tape.steps) and loaded.steps == tape.steps
        assert counts.parsed == len(tape)  # each step once
        assert loaded.steps[5] is loaded.steps[5] and loaded[:10].steps[5] is loaded.steps[5]


# ---------------------------------------------------------------------------- the view stack of a read tape


class Note(Observation):
    kind: Literal["resumetest_note"] = "resumetest_note"
    text: str = ""


class Idea(Thought):
    kind: Literal["resumetest_idea"] = "resumetest_idea"
    text: str = ""


class Act(Action):
    kind: Literal["resumetest_act"] = "resumetest_act"
    text: str = ""


def random_steps(rng: random.Random, n: int) -> Iterator[Step]:
    """``n`` steps of every kind the view stack treats apart (Call, Respond, Fork, SetNextNode,
    others), in runs of one to four steps by one random agent of a small team (or by none),
    each run's last step marked or, sometimes, not: not sessions an agent would make, but any
    sequence of steps has a view stack to agree on."""
    agents = ["root", "root/a", "root/b", "root/a/c", ""]
    made = 0
    while made < n:
        agent = rng.choice(agents)
        prompt_id = rng.choice(["p1", "p2", "p3", "p4", ""]) if agent else ""
        node = rng.choice(["n1", "n2"]) if agent else ""
        size = min(rng.randint(1, 4), n - made)
        for j in range(size):
            roll = rng.random()
            step: Step
            if roll < 0.08:
                step = Call(agent_name=rng.choice(["a", "b", "c"]), content=str(made))
            elif roll < 0.16:
                step = Respond(content=str(made))
            elif roll < 0.2:
                step = Fork(branches=[Branch(agent_name="a"), Branch(agent_name="b")][: rng.randint(1, 2)])
            elif roll < 0.4:
                step = SetNextNode(next_node=rng.choice(["n1", "n2", 0]))
            else:
                step = rng.choice([Note, Idea, Act])(text=str(made))
            run_end = j == size - 1 and rng.random() < 0.8
            meta = {"agent": agent, "node": node, "prompt_id": prompt_id, "run_end": run_end}
            step.metadata = step.metadata.model_copy(update=meta)
            made += 1
            yield step


@pytest.mark.parametrize("seed", range(16))
def test_the_view_stack_of_a_read_tape_is_the_folded_one(seed: int) -> None:
    """For every prefix of a random tape, the view stack of the tape read from a store
    (computed from its steps' kinds, reading few steps) equals the stack folded step by step
    over the same steps in memory: from the start, and onwards from a shorter prefix's."""
    rng = random.Random(seed)
    steps = list(random_steps(rng, 100))
    store = MemoryStore()
    store.save_tape(Tape(steps=steps), "t")
    folded = [TapeViewStack.compute(Tape(steps=steps[:n]), "root") for n in range(len(steps) + 1)]
    loaded = store.get_tape("t")
    for n in range(len(steps), -1, -1):  # longest first: each prefix from the start
        assert TapeViewStack.compute(loaded[:n] if n < len(steps) else loaded, "root") == folded[n], n
    loaded = store.get_tape("t")
    for n in sorted(rng.sample(range(len(steps) + 1), 12)):  # each onwards from the last one
        assert TapeViewStack.compute(loaded.steps[:n], "root") == folded[n], n


def test_a_stored_step_that_does_not_parse_fails_where_it_is_read(tmp_path: Path) -> None:
    """A stored step of a kind that no loaded class declares, or that its class refuses, raises
    pydantic's ``ValidationError`` where it is read (as ``get_tape`` raised when it parsed every
    step); the steps around it read as saved."""
    import sqlite3

    from pydantic import ValidationError

    from tapekit.dialog import UserStep

    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        store.save_tape(Tape(steps=[UserStep(content=str(i)) for i in range(200)]), "t")
    db = sqlite3.connect(path)
    change = "UPDATE steps SET kind = ?, data = replace(data, ?, ?) WHERE idx = ?"
    with db:
        db.execute(change, ("telepathy", '"user"', '"telepathy"', 150))
        db.execute(change, ("user", '"content":"20"', '"content":20', 20))
    db.close()
    with SQLiteStore(path) as store:
        loaded = store.get_tape("t")
        assert loaded.steps[199].content == "199" and loaded.steps[0].content == "0"  # type: ignore[attr-defined]
        with pytest.raises(ValidationError, match="unknown step kind 'telepathy'"):
            loaded.steps[150]
        with pytest.raises(ValidationError, match="Input should be a valid string"):
            loaded.steps[20]
        with pytest.raises(ValidationError):
            list(loaded)
        assert loaded.steps[130].content == "130"  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_a_read_tape_outlives_its_store(tmp_path: Path, backend: str) -> None:
    """Closing a store fetches the steps still unread of the tapes it returned (a
    ``MemoryStore`` drops its data on closing): the tape reads whole afterwards, and its view
    stack is the one folded over its steps."""
    agent, env, _ = react_agent(400)
    tape = main_loop(agent, react_start(SYSTEM), env, max_loops=300).get_final_tape()
    store: TapeStore = SQLiteStore(tmp_path / "s.db") if backend == "sqlite" else MemoryStore()
    with store:
        store.save_tape(tape, "t")
        loaded = store.get_tape("t")
        assert loaded.steps[-1] == tape.steps[-1]
    assert list(loaded.steps) == list(tape.steps)
    assert agent.compute_view(loaded) == TapeViewStack.compute(Tape(steps=list(tape.steps)), "react")
