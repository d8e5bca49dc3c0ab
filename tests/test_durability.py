"""docs/durability.md, rule by rule: when a stored session's steps are committed, what is
committed before and after a ``once`` tool runs, what a resume does with calls of the other
effects, and a fork branch that waits on a call in doubt."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tapekit import (
    Agent,
    FunctionLLM,
    InDoubtToolCall,
    LLMOutput,
    Prompt,
    Tape,
    ToolCall,
    ToolCallRequest,
    ToolEnvironment,
    ToolResult,
    UserStep,
    main_loop,
    tool,
    tool_call_key,
)
from tapekit.effects import EffectInDoubt
from tapekit.store import SQLiteStore
from tapekit.testing.react import ReactNode


def _agent(env: ToolEnvironment, name: str = "pay") -> Agent:
    def model(prompt: Prompt) -> LLMOutput:
        if prompt.messages[-1]["role"] == "tool":
            return LLMOutput(content="done")
        return LLMOutput(tool_calls=[ToolCallRequest(id="c1", name=name, arguments='{"amount": 5}')])

    return Agent.create(name="payer", llms=FunctionLLM(fn=model), nodes=[ReactNode(tools=env.tool_schemas())])


def test_steps_reach_the_database_without_a_flush(tmp_path: Path) -> None:
    """A step is committed by the writer thread on its own, within about flush_interval_s: a
    second store on the same file sees the ToolCall while the (read) tool is still running."""
    path = tmp_path / "s.db"
    start = Tape(steps=[UserStep(content="pay 5")])
    seen: list[float] = []

    @tool
    def pay(amount: int) -> str:
        """Look, do not pay."""
        began = time.monotonic()
        with SQLiteStore(path) as other:
            while time.monotonic() - began < 5:
                steps = other.get_tape(start.metadata.id).steps if other.count_tapes() else []
                if steps and isinstance(steps[-1], ToolCall):
                    seen.append(time.monotonic() - began)
                    break
                time.sleep(0.01)
        return "looked"

    env = ToolEnvironment([pay])
    with SQLiteStore(path, flush_interval_s=0.05) as store:
        main_loop(_agent(env), start, env, store=store).get_final_tape()
    assert seen and seen[0] < 2.0, seen


def test_a_once_call_and_its_intent_are_committed_before_the_tool_runs(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    start = Tape(steps=[UserStep(content="pay 5")])
    inside: dict[str, Any] = {}

    @tool(effect="once")
    def pay(amount: int) -> str:
        """Pay."""
        with SQLiteStore(path) as other:  # another process would see the same
            inside["last"] = other.get_tape(start.metadata.id).steps[-1]
            inside["effect"] = other.tool_effect(tool_call_key())
        return "paid"

    env = ToolEnvironment([pay])
    with SQLiteStore(path, flush_interval_s=10) as store:  # the writer would wait 10 s on its own
        main_loop(_agent(env), start, env, store=store).get_final_tape()
    assert isinstance(inside["last"], ToolCall) and inside["last"].metadata.id == inside["effect"].key
    assert inside["effect"].state == "started"


def test_the_outcome_is_committed_before_the_result_step(tmp_path: Path) -> None:
    path = tmp_path / "s.db"

    @tool(effect="once")
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    env = ToolEnvironment([pay])
    states = []
    with SQLiteStore(path, flush_interval_s=10) as store:
        for event in main_loop(_agent(env), Tape(steps=[UserStep(content="pay 5")]), env, store=store):
            if isinstance(event.observation, ToolResult):
                with SQLiteStore(path) as other:
                    states = [(e.state, e.result) for e in other.tool_effects()]
    assert states == [("done", "paid")]


@pytest.mark.parametrize("effect", ["read", "idempotent"])
def test_read_and_idempotent_calls_run_again_with_the_same_key(tmp_path: Path, effect: Any) -> None:
    keys: list[str] = []

    @tool(effect=effect)
    def pay(amount: int) -> str:
        """Pay (or look)."""
        keys.append(tool_call_key())
        return "ok"

    env = ToolEnvironment([pay])
    with SQLiteStore(tmp_path / "s.db") as store:
        start = Tape(steps=[UserStep(content="pay 5")])
        main_loop(_agent(env), start, None, store=store).get_final_tape()  # stops at the call
        cut = store.get_tape(start.metadata.id)
        for _ in range(2):  # a crash after the tool ran, before its result was stored: twice
            main_loop(_agent(env), cut, env).get_final_tape()
        assert keys == [cut.steps[-1].metadata.id] * 2 and store.tool_effects() == []


def test_a_branch_in_doubt_makes_the_session_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A payment in the second of two concurrent fork branches cannot tell whether it went
    through: the fork ends (no error) once the first branch is done, the stored tape ends with
    that call, the session waits; resolved, the resume finishes without paying it again."""
    from tapekit.testing import chaos

    world = tmp_path / "bank.db"
    real_pay = chaos._World.pay
    doubted: list[str] = []

    def pay(self: Any, what: str, key: str) -> None:
        real_pay(self, what, key)
        if what == "B1" and not doubted:
            doubted.append(key)
            raise EffectInDoubt("the bank did not answer")

    monkeypatch.setattr(chaos._World, "pay", pay)
    workload = chaos.PaymentsWorkload(fork=True)
    agent, env = workload.build(world)
    [start] = workload.starts()
    with SQLiteStore(tmp_path / "s.db") as store:
        events = list(main_loop(agent, start, env, store=store))
        waits = [e.external for e in events if e.external is not None]
        assert len(waits) == 1 and isinstance(waits[0], InDoubtToolCall), waits
        stored = store.get_tape(start.metadata.id)
        assert stored.metadata.error is None
        last = stored.steps[-1]
        assert isinstance(last, ToolCall) and last.arguments == {"invoice": "B1"}
        assert [e.key for e in store.tool_effects(in_doubt=True)] == doubted
        store.resolve_tool_effect(doubted[0], result="paid B1")
        final = main_loop(agent, stored, env, store=store).get_final_tape()
    assert final.metadata.error is None and final.steps[-1].kind == "stop"
    assert sorted(what for what, _ in workload.effects(world)) == ["A1", "A2", "B1", "B2"]
