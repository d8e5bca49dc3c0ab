"""Ready-made nodes: the tool-calling node most agents start from.

:class:`ToolCallingNode` is the loop of a chat agent with tools: its prompt is an optional system
message plus the conversation the agent sees (its view, as chat messages), with the tools'
schemas; when the model asks for tools, the node makes the :class:`~tapekit.dialog.ToolCall`
steps and comes back to itself after the environment answered; when it answers in text, the
node ends the turn the way ``final`` says. It also rebuilds its LLM output from the tape
(``make_llm_output``), so its tapes replay and turn into training data exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, Literal

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import FrozenMessage, LLMOutput, Prompt, Respond, SetNextNode, Step, StopStep, Tape
from tapekit.dialog import AssistantStep, ToolCall, tool_calls_from_output, view_to_messages
from tapekit.environment import ToolEnvironment
from tapekit.llm.base import LLMStream


@functools.lru_cache(maxsize=256)
def _system_message(text: str) -> FrozenMessage:
    return FrozenMessage({"role": "system", "content": text})


class ToolCallingNode(Node):
    """A chat node with tools: system message + the agent's view as messages + tool schemas.

    - ``system``: the system message ("" for none);
    - ``tools``: the tool schemas to offer (``environment.tool_schemas()``), or
      :meth:`for_environment` to take them from a :class:`~tapekit.environment.ToolEnvironment`;
    - ``final``: what a text answer does: ``"message"`` (an
      :class:`~tapekit.dialog.AssistantStep`: the session waits for the user's reply, then this
      node runs again), ``"stop"`` (the answer, then a :class:`~tapekit.core.StopStep`: the
      session ends), or ``"respond"`` (a :class:`~tapekit.core.Respond`: a subagent hands the
      answer back to its caller).

    Tool calls loop back to this node (``SetNextNode`` to itself), so one node is a whole
    ReAct agent.
    """

    name: str = "chat"
    system: str = ""
    tools: list[dict[str, Any]] = []
    final: Literal["message", "stop", "respond"] = "message"

    @classmethod
    def for_environment(cls, environment: ToolEnvironment, **fields: Any) -> ToolCallingNode:
        """The node offering ``environment``'s tools (other fields as keywords)."""
        return cls(tools=environment.tool_schemas(), **fields)

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        """The system message, then the agent's view of the tape as chat messages."""
        messages = view_to_messages(agent.compute_view(tape).top.steps, agent.full_name)
        if self.system:  # one shared message per text: prompts of a session share their start
            messages.insert(0, _system_message(self.system))
        return Prompt(messages=messages, tools=self.tools or None)

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The model's tool calls (and a loop back here), or its answer as ``final`` says."""
        output = llm_stream.get_output()
        calls = tool_calls_from_output(output)
        if calls:
            yield SetNextNode(next_node=self.name)
            yield from calls
            return
        text = output.content or ""
        if self.final == "respond":
            yield Respond(content=text)
            return
        if self.final == "message":
            yield SetNextNode(next_node=self.name)  # the user's reply comes back here
        yield AssistantStep(content=text)
        if self.final == "stop":
            yield StopStep(reason="done")

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """What the model answered in the node run that made step ``index``."""
        steps = node_run_steps(tape, index)
        calls = [s.to_request() for s in steps if isinstance(s, ToolCall)]
        if calls:
            return LLMOutput(tool_calls=calls)
        text = next((s.content for s in steps if isinstance(s, AssistantStep | Respond)), "")
        return LLMOutput(content=text)
