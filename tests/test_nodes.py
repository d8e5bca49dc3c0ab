"""tapekit.nodes.ToolCallingNode: the three ways a text answer ends a turn, tools looped back to
the node, a system message shared between prompts, and tapes that replay exactly."""

from __future__ import annotations

from typing import Any

import pytest

from tapekit import (
    Agent,
    AssistantStep,
    Call,
    FunctionLLM,
    LLMOutput,
    Prompt,
    Respond,
    SetNextNode,
    StopStep,
    Tape,
    ToolCallingNode,
    ToolCallRequest,
    ToolEnvironment,
    ToolResult,
    UserStep,
    main_loop,
    replay_tape,
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def model(prompt: Prompt) -> LLMOutput:
    """One add, then the sum as the answer."""
    last = prompt.messages[-1]
    if last["role"] == "tool":
        return LLMOutput(content=f"the sum is {last['content']}")
    return LLMOutput(tool_calls=[ToolCallRequest(id="c1", name="add", arguments='{"a": 2, "b": 3}')])


ENV = ToolEnvironment([add])


@pytest.mark.parametrize("final", ["message", "stop"])
def test_tools_loop_back_and_the_answer_ends_the_turn_as_final_says(final: Any) -> None:
    prompts: list[Prompt] = []

    def recording(prompt: Prompt) -> LLMOutput:
        prompts.append(prompt)
        return model(prompt)

    node = ToolCallingNode.for_environment(ENV, system="You add.", final=final)
    agent = Agent.create(name="adder", llms=FunctionLLM(fn=recording), nodes=[node])
    tape = main_loop(agent, Tape(steps=[UserStep(content="2+3?")]), ENV).get_final_tape()
    kinds = [s.kind for s in tape.steps]
    assert kinds[:4] == ["user", "set_next_node", "tool_call", "tool_result"]
    assert isinstance(tape.steps[3], ToolResult) and tape.steps[3].content == 5
    answer = next(s for s in tape.steps if isinstance(s, AssistantStep))
    assert answer.content == "the sum is 5"
    assert isinstance(tape.steps[-1], StopStep) == (final == "stop")
    assert prompts[0].messages[0] == {"role": "system", "content": "You add."}
    assert prompts[1].messages[0] is prompts[0].messages[0]  # one shared system message
    assert prompts[0].tools == ENV.tool_schemas()
    assert replay_tape(agent, tape).ok  # make_llm_output rebuilds what the model said


def test_a_subagent_responds_to_its_caller() -> None:
    helper = Agent.create(
        name="helper",
        llms=FunctionLLM(fn=model),
        nodes=[ToolCallingNode.for_environment(ENV, final="respond")],
    )

    def lead_model(prompt: Prompt) -> LLMOutput:
        return LLMOutput(content="ok")

    class Ask(ToolCallingNode):
        def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: Any) -> Any:
            llm_stream.get_output()
            if not any(isinstance(s, Respond) for s in tape.steps):
                yield SetNextNode(next_node="ask")
                yield Call(agent_name="helper", content="2+3?")
            else:
                yield StopStep(reason="done")

    lead = Agent.create(
        name="lead", llms=FunctionLLM(fn=lead_model), nodes=[Ask(name="ask")], subagents=[helper]
    )
    tape = main_loop(lead, Tape(steps=[UserStep(content="go")]), ENV).get_final_tape()
    assert tape.metadata.error is None, tape.metadata.error
    respond = next(s for s in tape.steps if isinstance(s, Respond))
    assert respond.content == "the sum is 5" and respond.metadata.agent == "lead/helper"
