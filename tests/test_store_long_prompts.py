"""A stored ReAct session whose prompts hold the whole conversation (shared FrozenMessage
dicts from view_to_messages) reads back byte-identical from every store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit import (
    Agent,
    FunctionLLM,
    LLMOutput,
    LLMStream,
    Node,
    Prompt,
    SetNextNode,
    StopStep,
    Tape,
    ToolCallRequest,
    amain_loop,
)
from tapekit.dialog import AssistantStep, SystemStep, UserStep, tool_calls_from_output, view_to_messages
from tapekit.environment import ToolEnvironment
from tapekit.store import MemoryStore, SQLiteStore, TapeStore

TURNS = 60


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class ReactNode(Node):
    name: str = "react"
    tools: list[dict[str, Any]] = []

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=view_to_messages(tape.steps, agent.name), tools=self.tools)

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Any]:
        output = llm_stream.get_output()
        calls = tool_calls_from_output(output)
        if calls:
            yield SetNextNode(next_node="react")
            yield from calls
        else:
            yield AssistantStep(content=output.content or "")
            yield StopStep(reason="done")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_long_session_prompts_read_back_byte_identical(kind: str, tmp_path: Path) -> None:
    seen: list[Prompt] = []

    def model(prompt: Prompt) -> LLMOutput:
        seen.append(prompt)
        n = len(seen)
        if n <= TURNS:
            call = ToolCallRequest(id=f"c{n}", name="add", arguments='{"a": 1, "b": 2}')
            return LLMOutput(tool_calls=[call])
        return LLMOutput(content="done ü 😀")

    env = ToolEnvironment([add])
    agent = Agent.create(
        name="react",
        llms=FunctionLLM(fn=model, stream_chunks=False),
        nodes=[ReactNode(tools=env.tool_schemas())],
        max_iterations=10**6,
    )
    start = Tape(steps=[SystemStep(content="sys"), UserStep(content="add, many times")])
    store: TapeStore = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "long.db")
    tape = asyncio.run(amain_loop(agent, start, env, store=store).get_final_tape())
    store.flush()
    assert isinstance(tape.steps[-1], StopStep) and len(seen) == TURNS + 1
    assert len(seen[-1].messages) == 2 + 2 * TURNS
    for prompt in seen:
        call = store.get_llm_call(prompt.id)
        assert call is not None
        assert call.prompt.model_dump_json() == prompt.model_dump_json()
        assert call.prompt.messages == prompt.messages
