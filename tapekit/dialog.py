"""Ready-made steps for chat-style agents and tool use, and their conversion to chat messages.

Declaring your own typed thoughts and actions is usually better; these cover quick prototypes
and the common tool-calling loop: the LLM's tool calls become :class:`ToolCall` actions, the
:class:`~tapekit.environment.ToolEnvironment` answers each with a :class:`ToolResult`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from tapekit.core import (
    Action,
    Call,
    ControlStep,
    LLMOutput,
    Observation,
    Respond,
    Step,
    Thought,
    ToolCallRequest,
)

__all__ = [
    "AssistantStep",
    "AssistantThought",
    "SystemStep",
    "ToolCall",
    "ToolResult",
    "UserStep",
    "tool_calls_from_output",
    "view_to_messages",
]


class SystemStep(Observation):
    """A system message given to the agent (instructions that arrive on the tape)."""

    kind: Literal["system"] = "system"
    content: str


class UserStep(Observation):
    """A message from the user."""

    kind: Literal["user"] = "user"
    content: str


class AssistantThought(Thought):
    """Free-form reasoning by the assistant (a plan, a note)."""

    kind: Literal["assistant_thought"] = "assistant_thought"
    content: str


class AssistantStep(Action):
    """A message to the user; the session waits for the user's answer."""

    kind: Literal["assistant"] = "assistant"
    content: str


class ToolCall(Action):
    """A request to run tool ``name`` with ``arguments``; ``call_id`` pairs it with its result."""

    kind: Literal["tool_call"] = "tool_call"
    name: str
    arguments: dict[str, Any] = {}
    call_id: str = ""

    def to_request(self) -> ToolCallRequest:
        """This call in the LLM's wire format."""
        return ToolCallRequest(id=self.call_id, name=self.name, arguments=json.dumps(self.arguments))


class ToolResult(Observation):
    """What a tool returned (``content``), or why it failed (``error``)."""

    kind: Literal["tool_result"] = "tool_result"
    call_id: str = ""
    name: str = ""
    content: Any = None
    error: str | None = None


def tool_calls_from_output(output: LLMOutput) -> list[ToolCall]:
    """The tool calls of an LLM output as :class:`ToolCall` steps.

    Arguments that are not a JSON object raise ``ValueError`` naming the tool, so the node can
    turn it into an error step instead of acting on garbage.
    """
    calls = []
    for request in output.tool_calls or []:
        try:
            arguments = json.loads(request.arguments or "{}")
        except json.JSONDecodeError as e:
            raise ValueError(f"tool call {request.name!r} has invalid JSON arguments: {e}") from e
        if not isinstance(arguments, dict):
            raise ValueError(f"tool call {request.name!r} arguments must be a JSON object")
        calls.append(ToolCall(name=request.name, arguments=arguments, call_id=request.id))
    return calls


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def view_to_messages(steps: Iterable[Step], agent_name: str = "") -> list[dict[str, Any]]:
    """Chat messages for the steps an agent sees (its tape view).

    Consecutive tool calls become one assistant message with several ``tool_calls``; a
    :class:`Call` to this agent reads as the user's request, a :class:`Respond` from a subagent
    as a user message naming the subagent; other control steps are left out.
    """
    messages: list[dict[str, Any]] = []
    for step in steps:
        if isinstance(step, SystemStep):
            messages.append({"role": "system", "content": step.content})
        elif isinstance(step, UserStep):
            messages.append({"role": "user", "content": step.content})
        elif isinstance(step, AssistantThought | AssistantStep):
            messages.append({"role": "assistant", "content": step.content})
        elif isinstance(step, ToolCall):
            call = {
                "id": step.call_id,
                "type": "function",
                "function": {"name": step.name, "arguments": json.dumps(step.arguments)},
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(step, ToolResult):
            content = f"Error: {step.error}" if step.error else _text(step.content)
            messages.append({"role": "tool", "tool_call_id": step.call_id, "content": content})
        elif isinstance(step, Call):
            if agent_name and step.metadata.agent != agent_name:
                messages.append({"role": "user", "content": step.content})
            else:
                messages.append({"role": "assistant", "content": f"(asks {step.agent_name}) {step.content}"})
        elif isinstance(step, Respond):
            who = step.metadata.agent.rsplit("/", 1)[-1] or "subagent"
            messages.append({"role": "user", "content": f"({who} answers) {step.content}"})
        elif isinstance(step, ControlStep):
            continue
        else:
            messages.append({"role": "user", "content": _text(step.llm_dict())})
    return messages
