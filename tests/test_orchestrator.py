"""The main loop: event order, stop rules, errors on the tape, external observations, resume."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Literal

from tapekit import (
    Action,
    Agent,
    Environment,
    FunctionLLM,
    LLMStream,
    Node,
    Observation,
    Prompt,
    ScriptedLLM,
    SetNextNode,
    Step,
    StopStep,
    Tape,
    ToolCall,
    ToolEnvironment,
    UserStep,
    async_main_loop,
    main_loop,
)
from tapekit._engine.moves import next_move
from tapekit.core import LLMOutput, StepMetadata, ToolCallRequest
from tapekit.dialog import AssistantStep, tool_calls_from_output
from tests.test_fork import InFlightLLM


class Count(Action):
    kind: Literal["looptest_count"] = "looptest_count"
    n: int


class Counted(Observation):
    kind: Literal["looptest_counted"] = "looptest_counted"
    n: int


class CountNode(Node):
    """Counts up to ``limit`` with one action per loop, then stops."""

    limit: int = 3

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        last = tape.steps[-1]
        n = last.n + 1 if isinstance(last, Counted) else 0
        if n >= self.limit:
            yield StopStep(reason="done")
        else:
            yield SetNextNode(next_node=0)
            yield Count(n=n)


class CountEnv(Environment):
    def react(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        last = tape.steps[-1]
        assert isinstance(last, Count)
        return tape.with_new_steps([Counted(n=last.n)], author="counter")


def start() -> Tape[Any, Any]:
    return Tape(steps=[UserStep(content="count")])


def test_events_alternate_agent_and_environment() -> None:
    agent = Agent.create(name="counter", nodes=[CountNode()])
    events = list(main_loop(agent, start(), CountEnv()))
    order = []
    for e in events:
        kind = next(
            k
            for k in ("agent_event", "agent_tape", "observation", "env_tape", "external")
            if getattr(e, k) is not None
        )
        if not order or order[-1] != kind:
            order.append(kind)
    assert order == ["agent_event", "agent_tape", "observation", "env_tape"] * 3 + [
        "agent_event",
        "agent_tape",
    ]
    final = events[-1].tape
    assert final is not None and isinstance(final.steps[-1], StopStep)
    assert [s.n for s in final.steps if isinstance(s, Counted)] == [0, 1, 2]
    env_tapes = [e.env_tape for e in events if e.env_tape is not None]
    assert env_tapes[0].metadata.author == "counter" and env_tapes[0].metadata.n_added_steps == 1


def test_max_loops_bounds_the_rounds() -> None:
    agent = Agent.create(name="counter", nodes=[CountNode(limit=100)])
    final = main_loop(agent, start(), CountEnv(), max_loops=2).get_final_tape()
    assert [s.n for s in final.steps if isinstance(s, Counted)] == [0, 1]


def test_environment_errors_are_recorded_on_the_tape() -> None:
    class Broken(Environment):
        def react(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
            raise ConnectionError("backend down")

    agent = Agent.create(name="counter", nodes=[CountNode()])
    final = main_loop(agent, start(), Broken()).get_final_tape()
    assert final.metadata.error is not None
    assert "ConnectionError: backend down" in final.metadata.error and "environment" in final.metadata.error
    assert isinstance(final.steps[-1], Count)


def test_agent_errors_stop_the_loop() -> None:
    agent = Agent.create(name="counter", nodes=[CountNode()], max_iterations=0)
    events = list(main_loop(agent, start(), CountEnv()))
    assert events[-1].agent_tape is not None and "max_iterations" in (
        events[-1].agent_tape.metadata.error or ""
    )


def test_a_tape_ending_in_an_unanswered_action_goes_to_the_environment_first() -> None:
    llm = ScriptedLLM(outputs=[])
    agent = Agent.create(name="counter", llms=llm, nodes=[CountNode()])
    pending = start().append(Count(n=0))  # made elsewhere; its run is closed (no run markers)
    events = list(main_loop(agent, pending, CountEnv(), max_loops=1))
    assert events[0].observation is not None and events[0].observation.n == 0  # type: ignore[attr-defined]


def test_who_moves_next_is_read_from_the_tape_alone() -> None:
    agent = Agent.create(name="counter", nodes=[CountNode()])
    fresh = next_move(start(), "counter")
    assert (fresh.actor, fresh.agent_name, fresh.finishing) == ("agent", "counter", False)
    assert fresh.runner(agent) == (agent, agent.nodes[0]) and fresh.describe() == "counter"
    pending = next_move(start().append(Count(n=0)), "counter")
    assert pending.actor == "environment" and [a.kind for a in pending.waiting] == ["looptest_count"]
    assert pending.describe() == "the environment (answering looptest_count)"
    # a run cut after its action but before its last step: the agent finishes it first
    meta = StepMetadata(agent="counter", node="CountNode", prompt_id="p", run_end=False)
    cut = next_move(start().append(Count(n=0, metadata=meta)), "counter")
    assert cut.actor == "agent" and cut.finishing and cut.waiting
    assert cut.describe() == "counter (finishing its interrupted CountNode run)"


class ChatNode(Node):
    """Answers the user with tools available (a chat assistant)."""

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": tape.steps[-1].llm_dict().__repr__()}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        out = llm_stream.get_output()
        yield SetNextNode(next_node=0)
        if out.tool_calls:
            yield from tool_calls_from_output(out)
        else:
            yield AssistantStep(content=out.content or "")


def chat_brain(prompt: Prompt) -> LLMOutput:
    last = prompt.messages[-1]["content"]
    if "'user'" in last and "double" in last:
        return LLMOutput(tool_calls=[ToolCallRequest(id="c1", name="double", arguments='{"x": 21}')])
    if "tool_result" in last:
        return LLMOutput(content="the answer is 42")
    return LLMOutput(content="hello!")


def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def test_external_observation_stops_and_the_tape_resumes_after_the_user_answers() -> None:
    agent = Agent.create(name="chat", llms=FunctionLLM(fn=chat_brain), nodes=[ChatNode()])
    env = ToolEnvironment([double])
    events = list(main_loop(agent, Tape(steps=[UserStep(content="double 21 please")]), env))
    assert events[-1].external is not None and isinstance(events[-1].external.action, AssistantStep)
    tape = next(e.tape for e in reversed(events) if e.tape is not None)
    assert [s.kind for s in tape.steps] == [
        "user",
        "set_next_node",
        "tool_call",
        "tool_result",
        "set_next_node",
        "assistant",
    ]
    assert tape.steps[3].content == 42  # type: ignore[attr-defined]
    # the human answers; the same tape resumes with no other state
    tape = tape.append(UserStep(content="thanks"))
    more = main_loop(agent, tape, env).get_final_tape()
    assert more.steps[-1].content == "hello!"  # type: ignore[attr-defined]


def test_async_main_loop_runs_many_tapes_concurrently() -> None:
    llm = InFlightLLM(fn=chat_brain, latency_s=0.02)
    agent = Agent.create(name="chat", llms=llm, nodes=[ChatNode()])
    env = ToolEnvironment([double])

    async def all_of_them() -> list[Tape[Any, Any]]:
        starts = [Tape(steps=[UserStep(content=f"double 21 please #{i}")]) for i in range(20)]
        return await asyncio.gather(*(async_main_loop(agent, t, env).get_final_tape() for t in starts))

    tapes = asyncio.run(all_of_them())
    assert all(t.steps[-1].content == "the answer is 42" for t in tapes)  # type: ignore[attr-defined]
    assert llm.peak == 20  # the first LLM calls of all 20 tapes are in flight together
    assert isinstance(tapes[0].steps[2], ToolCall)


def test_a_stopped_session_resumed_does_nothing() -> None:
    """A tape that ends with a StopStep (a session stored with its last step but killed before
    its final write, say) is finished: the loop makes no step and calls no model."""
    from tapekit import Agent, FunctionLLM, LLMOutput, StopStep, Tape, UserStep, main_loop
    from tapekit.nodes import ToolCallingNode

    calls: list[object] = []

    def model(prompt: object) -> LLMOutput:
        calls.append(prompt)
        return LLMOutput(content="hi")

    agent = Agent.create(name="a", llms=FunctionLLM(fn=model), nodes=[ToolCallingNode(final="stop")])
    done = main_loop(agent, Tape(steps=[UserStep(content="hello")])).get_final_tape()
    assert isinstance(done.steps[-1], StopStep) and len(calls) == 1
    again = main_loop(agent, done).get_final_tape()
    assert again.metadata.error is None and len(again) == len(done) and len(calls) == 1
