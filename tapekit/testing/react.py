"""The loop most users write, as a fixed workload: a ReAct agent whose prompt is the system message
plus the whole conversation so far (``view_to_messages``), one tool (``add``), and an instant
scripted model that never reads its input: ``turns`` tool calls, then a final answer.

Tests of long sessions (stored prompts that read back byte-identical, a store file that grows
linearly) and ``bench/peers.py`` (tapekit against LangGraph) run the same session from here.
With ``window``, the prompt holds only the last steps of the conversation (a bounded prompt:
``bench/resume.py`` measures what resuming costs the framework with it).
"""

from __future__ import annotations

from typing import Any, Literal

from tapekit.agent import Agent
from tapekit.core import LLMOutput, Prompt, Tape, ToolCallRequest
from tapekit.dialog import SystemStep, UserStep, view_to_messages
from tapekit.environment import ToolEnvironment
from tapekit.llm.scripted import FunctionLLM
from tapekit.nodes import ToolCallingNode

__all__ = ["ReactNode", "ScriptedTurns", "add", "react_agent", "react_start"]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class ReactNode(ToolCallingNode):
    """The user's ReAct node: the whole conversation as the prompt, with ``tools``; the model's
    tool calls loop back to this node, a text answer ends the session (a
    :class:`~tapekit.nodes.ToolCallingNode` with ``final="stop"``). With ``window`` > 0 the
    prompt holds the last ``window`` steps of the agent's view only."""

    name: str = "react"
    final: Literal["message", "stop", "respond"] = "stop"
    window: int = 0

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        """The whole conversation (or its last ``window`` steps) as the prompt, with ``tools``."""
        if not self.window:
            return super().make_prompt(agent, tape)
        steps = agent.compute_view(tape).top.steps
        messages = view_to_messages(steps[max(0, len(steps) - self.window) :], agent.full_name)
        return Prompt(messages=messages, tools=self.tools or None)


class ScriptedTurns:
    """The instant model: ``add(1, 2)`` for the first ``turns`` calls, then ``final``. With
    ``record``, the prompts it was given are kept in ``prompts`` (memory grows with the square of
    the session: leave it off for long benchmark sessions)."""

    def __init__(self, turns: int, final: str = "done", record: bool = False) -> None:
        self.turns = turns
        self.final = final
        self.record = record
        self.calls = 0
        self.prompts: list[Prompt] = []

    def __call__(self, prompt: Prompt) -> LLMOutput:
        """The next scripted output."""
        self.calls += 1
        if self.record:
            self.prompts.append(prompt)
        if self.calls <= self.turns:
            call = ToolCallRequest(id=f"call_{self.calls}", name="add", arguments='{"a": 1, "b": 2}')
            return LLMOutput(content=None, tool_calls=[call])
        return LLMOutput(content=self.final)


def react_agent(
    turns: int, final: str = "done", record: bool = False, window: int = 0
) -> tuple[Agent, ToolEnvironment, ScriptedTurns]:
    """The ReAct agent on a :class:`ScriptedTurns` model, its tool environment, and the model
    (``window``: see :class:`ReactNode`)."""
    env = ToolEnvironment([add])
    model = ScriptedTurns(turns, final, record)
    agent = Agent.create(
        name="react",
        llms=FunctionLLM(fn=model, stream_chunks=False),
        nodes=[ReactNode(tools=env.tool_schemas(), window=window)],
        max_iterations=10**9,
    )
    return agent, env, model


def react_start(system: str, user: str = "Add 1 and 2, many times.") -> Tape[Any, Any]:
    """The session's start tape: a system message and the user's request."""
    return Tape(steps=[SystemStep(content=system), UserStep(content=user)])
