"""Ready-made steps for chat-style agents and tool use, and their conversion to chat messages.

Declaring your own typed thoughts and actions is usually better; these cover quick prototypes
and the common tool-calling loop: the LLM's tool calls become :class:`ToolCall` actions, the
:class:`~tapekit.environment.ToolEnvironment` answers each with a :class:`ToolResult`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import partial
from typing import Any, Literal

from tapekit.core import (
    Action,
    Call,
    ControlStep,
    FrozenMessage,
    FrozenMessageList,
    LLMOutput,
    Observation,
    Respond,
    Step,
    StepSequence,
    Thought,
    ToolCallRequest,
)
from tapekit.llm.base import escape_lone_surrogates


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
    turn it into an error step instead of acting on garbage. A lone surrogate the arguments
    decode to is written as its escape (see :func:`~tapekit.llm.base.escape_lone_surrogates`).
    """
    calls = []
    for request in output.tool_calls or []:
        try:
            arguments = escape_lone_surrogates(json.loads(request.arguments or "{}"))
        except json.JSONDecodeError as e:
            raise ValueError(f"tool call {request.name!r} has invalid JSON arguments: {e}") from e
        if not isinstance(arguments, dict):
            raise ValueError(f"tool call {request.name!r} arguments must be a JSON object")
        calls.append(ToolCall(name=request.name, arguments=arguments, call_id=request.id))
    return calls


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _message(step: Step, agent_name: str) -> dict[str, Any] | None:
    """The chat message for one step as ``agent_name`` sees it (None: the step is left out)."""
    if isinstance(step, SystemStep):
        return {"role": "system", "content": step.content}
    if isinstance(step, UserStep):
        return {"role": "user", "content": step.content}
    if isinstance(step, AssistantThought | AssistantStep):
        return {"role": "assistant", "content": step.content}
    if isinstance(step, ToolCall):
        call = {
            "id": step.call_id,
            "type": "function",
            "function": {"name": step.name, "arguments": json.dumps(step.arguments)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if isinstance(step, ToolResult):
        content = f"Error: {step.error}" if step.error else _text(step.content)
        return {"role": "tool", "tool_call_id": step.call_id, "content": content}
    if isinstance(step, Call):
        if agent_name and step.metadata.agent != agent_name:
            return {"role": "user", "content": step.content}
        return {"role": "assistant", "content": f"(asks {step.agent_name}) {step.content}"}
    if isinstance(step, Respond):
        who = step.metadata.agent.rsplit("/", 1)[-1] or "subagent"
        return {"role": "user", "content": f"({who} answers) {step.content}"}
    if isinstance(step, ControlStep):
        return None
    return {"role": "user", "content": _text(step.llm_dict())}


def _frozen_message(step: Step, agent_name: str) -> FrozenMessage | None:
    message = _message(step, agent_name)
    return None if message is None else FrozenMessage(message)


def _merges(last: dict[str, Any] | None, message: dict[str, Any]) -> bool:
    """Whether ``message`` (one tool call) joins ``last``, an assistant message of tool calls."""
    return (
        last is not None
        and "tool_calls" in message
        and last["role"] == "assistant"
        and bool(last.get("tool_calls"))
        and not last["content"]
    )


_Messages = tuple[StepSequence[FrozenMessage], FrozenMessage | None]


def _no_messages() -> _Messages:
    return StepSequence(), None


def _fold_message(agent_name: str, state: _Messages, step: Step, index: int) -> _Messages:
    """One step into the (done messages, last message) fold; never mutates ``state``."""
    message = _frozen_message(step, agent_name)
    if message is None:
        return state
    done, last = state
    if last is not None and _merges(last, message):
        return done, FrozenMessage({**last, "tool_calls": [*last["tool_calls"], *message["tool_calls"]]})
    return (done if last is None else done.appended([last])), message


def view_to_messages(steps: Iterable[Step], agent_name: str = "") -> list[dict[str, Any]]:
    """Chat messages for the steps an agent sees (its tape view).

    Consecutive tool calls become one assistant message with several ``tool_calls``; a
    :class:`Call` to this agent reads as the user's request, a :class:`Respond` from a subagent
    as a user message naming the subagent; other control steps are left out.

    For a :class:`~tapekit.core.StepSequence` (a tape's steps, or ``agent.compute_view(tape)
    .top.steps``) the conversion is memoised per prefix, so a growing session converts only its
    new steps. Each call returns a new list (safe to change: add, drop or replace messages) of
    read-only :class:`~tapekit.core.FrozenMessage` dicts shared with the cache and with earlier
    calls, so a prompt over the whole conversation costs no copy of its past; to change one
    message, replace it with a changed copy (``{**m, "content": ...}``). The list is a
    :class:`~tapekit.core.FrozenMessageList`, which keeps track of whether each item is still a
    FrozenMessage, so :class:`~tapekit.core.Prompt` takes it without looking at each message.
    """
    if isinstance(steps, StepSequence):
        done, last = steps.fold(
            ("tapekit.dialog.view_to_messages", agent_name), _no_messages, partial(_fold_message, agent_name)
        )
        messages = FrozenMessageList._of_frozen([])
        done.extend_list(messages)
        if last is not None:
            list.append(messages, last)
        return messages
    out = FrozenMessageList()
    for step in steps:
        message = _frozen_message(step, agent_name)
        if message is None:
            continue
        if out and _merges(out[-1], message):
            calls = [*out[-1]["tool_calls"], *message["tool_calls"]]
            out[-1] = FrozenMessage({**out[-1], "tool_calls": calls})
        else:
            out.append(message)
    return out
