"""Tape steps to span records: the pure part of the OpenTelemetry export (no OTel imports).

:class:`SpanBuilder` is fed a tape's steps in order (with the time each was made) and the LLM
calls behind them, and hands out a :class:`SpanRecord` whenever a span closes: a node run at its
last step, a tool call at its result, a subagent run at its ``Respond``, the tape at
:meth:`SpanBuilder.finish`. The same builder serves the live tracer (steps as the loop makes
them) and the export of stored tapes (all steps at once), so both give the same spans.

Span ids are derived from the conversation id and a key (the prompt id of a node run, the step
id of a tool call or of a subagent's ``Call``), so a child can be sent before its parent closes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tapekit.core import Call, Respond, Step, TapeMetadata
from tapekit.dialog import ToolCall, ToolResult
from tapekit.llm.base import LLMCall

STEP_EVENT = "tapekit.step"
_NS = 1_000_000_000


def trace_id(conversation_id: str) -> int:
    """The 128-bit trace id of a conversation: the id itself when it is 32 hex digits (tapekit's
    tape ids are), else a hash of it."""
    if len(conversation_id) == 32:
        try:
            value = int(conversation_id, 16)
            if value:
                return value
        except ValueError:
            pass
    return int.from_bytes(hashlib.blake2b(conversation_id.encode(), digest_size=16).digest(), "big") or 1


def span_id(conversation_id: str, key: str) -> int:
    """The 64-bit span id of the span ``key`` in a conversation (never 0)."""
    digest = hashlib.blake2b(f"{conversation_id}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


@dataclass
class SpanRecord:
    """One span, independent of the OTel SDK: ``kind`` is ``"internal"`` or ``"client"``;
    ``events`` are ``(name, time_ns, attributes)``; ``error`` sets an error status."""

    key: str
    name: str
    parent_key: str | None
    start_ns: int
    end_ns: int
    kind: str = "internal"
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    error: str | None = None

    def add_step(self, step: Step, index: int, time_ns: int) -> None:
        """Record ``step`` (its full JSON, metadata included) as an event of this span."""
        self.events.append(
            (
                STEP_EVENT,
                time_ns,
                {
                    "tapekit.step.index": index,
                    "tapekit.step.id": step.metadata.id,
                    "tapekit.step.kind": step.kind,
                    "tapekit.step.json": step.model_dump_json(),
                },
            )
        )
        self.start_ns = min(self.start_ns, time_ns)
        self.end_ns = max(self.end_ns, time_ns)
        ids = self.attributes.setdefault("tapekit.step_ids", [])
        ids.append(step.metadata.id)


def finish_reason(call: LLMCall) -> str:
    """The call's finish reason: the backend's when it reported one, else ``tool_call`` for an
    output with tool calls and ``stop`` otherwise."""
    if call.tokens is not None and call.tokens.finish_reason:
        return call.tokens.finish_reason
    return "tool_call" if call.output.tool_calls else "stop"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class SpanBuilder:
    """Turns one tape's steps into span records; ``emit`` receives each span as it closes."""

    def __init__(
        self,
        conversation_id: str,
        emit: Callable[[SpanRecord], None],
        start_ns: int,
        root_agent: str = "",
    ) -> None:
        self.conversation_id = conversation_id
        self._sink = emit
        self.llm_calls: dict[str, LLMCall] = {}
        self.n_steps = 0
        self.root = SpanRecord(
            "tape", f"invoke_agent {root_agent}".strip(), None, start_ns, start_ns, attributes={}
        )
        self.root_agent = root_agent
        self._runs: dict[str, SpanRecord] = {}  # open node runs by prompt id
        self._run_count: dict[str, int] = {}
        self._agent_runs: dict[str, list[SpanRecord]] = {}  # open subagent runs by full agent name
        self._tools: dict[str, SpanRecord] = {}  # open tool calls by call id
        self._chats_sent: set[str] = set()
        self._open: dict[str, SpanRecord] = {"tape": self.root}  # spans that may still grow

    def emit(self, record: SpanRecord) -> None:
        """Send a closed span, first stretching the open spans above it over its time."""
        self._open.pop(record.key, None)
        parent = self._open.get(record.parent_key) if record.parent_key else None
        while parent is not None:
            parent.start_ns = min(parent.start_ns, record.start_ns)
            parent.end_ns = max(parent.end_ns, record.end_ns)
            parent = self._open.get(parent.parent_key) if parent.parent_key else None
        self._sink(record)

    # ------------------------------------------------------------------ feeding

    def add_llm_call(self, call: LLMCall) -> None:
        """Make ``call`` known (before or after the steps of its node run)."""
        self.llm_calls[call.prompt.id] = call
        run = self._runs.get(call.prompt.id)
        if run is not None:
            run.start_ns = min(run.start_ns, _call_start(call))

    def feed(self, step: Step, time_ns: int) -> None:
        """Add the tape's next step, made at ``time_ns``."""
        index = self.n_steps
        self.n_steps += 1
        meta = step.metadata
        if not self.root_agent and meta.agent:
            self.root_agent = meta.agent.split("/")[0]
            self.root.name = f"invoke_agent {self.root_agent}"
        self.root.start_ns = min(self.root.start_ns, time_ns)
        self.root.end_ns = max(self.root.end_ns, time_ns)
        if meta.agent:
            self._feed_agent_step(step, index, time_ns)
        elif isinstance(step, ToolResult) and step.call_id in self._tools:
            tool = self._tools.pop(step.call_id)
            tool.add_step(step, index, time_ns)
            if step.error is not None:
                tool.error = step.error
                tool.attributes["error.type"] = "tool_error"
            else:
                tool.attributes["gen_ai.tool.call.result"] = _json(step.content)
            self.emit(tool)
        else:
            self.root.add_step(step, index, time_ns)

    def _feed_agent_step(self, step: Step, index: int, time_ns: int) -> None:
        meta = step.metadata
        parent = self._agent_span(meta.agent)
        run = None
        if meta.prompt_id:
            run = self._runs.get(meta.prompt_id) or self._open_run(step, time_ns)
            run.add_step(step, index, time_ns)
        else:  # made by an agent outside a node run (the Calls that open a fork's branches)
            parent.add_step(step, index, time_ns)
        if isinstance(step, ToolCall):
            key = f"tool:{step.metadata.id}"
            self._tools[step.call_id or step.metadata.id] = SpanRecord(
                key,
                f"execute_tool {step.name}",
                parent.key,
                time_ns,
                time_ns,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": step.name,
                    "gen_ai.tool.call.id": step.call_id,
                    "gen_ai.tool.type": "function",
                    "gen_ai.tool.call.arguments": _json(step.arguments),
                    "gen_ai.conversation.id": self.conversation_id,
                    "tapekit.span.type": "tool",
                    "tapekit.agent": meta.agent,
                },
            )
        elif isinstance(step, Call):
            callee = f"{meta.agent}/{step.agent_name}"
            record = SpanRecord(
                f"agent:{step.metadata.id}",
                f"invoke_agent {callee}",
                parent.key,
                time_ns,
                time_ns,
                attributes=self._agent_attributes(callee, "agent_run"),
            )
            self._agent_runs.setdefault(callee, []).append(record)
            self._open[record.key] = record
        elif isinstance(step, Respond):
            open_runs = self._agent_runs.get(meta.agent)
            if open_runs:
                record = open_runs.pop()
                record.end_ns = max(record.end_ns, time_ns)
                self.emit(record)
        if run is not None and meta.run_end:
            self._close_run(meta.prompt_id, run)

    def _agent_attributes(self, agent: str, span_type: str) -> dict[str, Any]:
        return {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": self.conversation_id,
            "tapekit.span.type": span_type,
        }

    def _agent_span(self, agent: str) -> SpanRecord:
        """The innermost open run of ``agent`` (a subagent's Call...Respond), else the tape's."""
        runs = self._agent_runs.get(agent)
        return runs[-1] if runs else self.root

    def _open_run(self, step: Step, time_ns: int) -> SpanRecord:
        meta = step.metadata
        count = self._run_count.get(meta.prompt_id, 0)
        self._run_count[meta.prompt_id] = count + 1
        key = f"run:{meta.prompt_id}" + (f"#{count}" if count else "")
        attributes = self._agent_attributes(meta.agent, "node_run")
        attributes.update({"tapekit.node": meta.node, "tapekit.prompt_id": meta.prompt_id})
        parent = self._agent_span(meta.agent)
        run = SpanRecord(
            key, f"invoke_agent {meta.agent}.{meta.node}", parent.key, time_ns, time_ns, "internal"
        )
        run.attributes.update(attributes)
        call = self.llm_calls.get(meta.prompt_id)
        if call is not None:
            run.start_ns = min(run.start_ns, _call_start(call))
        self._runs[meta.prompt_id] = run
        return run

    def _close_run(self, prompt_id: str, run: SpanRecord) -> None:
        del self._runs[prompt_id]
        call = self.llm_calls.get(prompt_id)
        if call is not None and prompt_id not in self._chats_sent:
            self._chats_sent.add(prompt_id)
            self.emit(self._chat(call, run))
        self.emit(run)

    def _chat(self, call: LLMCall, run: SpanRecord) -> SpanRecord:
        start = _call_start(call)
        end = max(start, int(call.timestamp * _NS))
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": call.model,
            "gen_ai.response.model": call.model,
            "gen_ai.usage.input_tokens": call.prompt_tokens,
            "gen_ai.usage.output_tokens": call.output_tokens,
            "gen_ai.response.finish_reasons": [finish_reason(call)],
            "gen_ai.conversation.id": self.conversation_id,
            "tapekit.span.type": "llm_call",
            "tapekit.prompt_id": call.prompt.id,
            "tapekit.llm_call": call.model_dump_json(),
        }
        if call.cost:
            attributes["tapekit.cost"] = call.cost
        return SpanRecord(
            f"chat:{call.prompt.id}",
            f"chat {call.model}".strip(),
            run.key,
            start,
            end,
            "client",
            attributes,
        )

    # ------------------------------------------------------------------ the end

    def finish(self, metadata: TapeMetadata, context: Any, end_ns: int | None = None) -> None:
        """Close every span still open (a session cut short leaves some) and the tape's own span,
        which carries the tape's metadata and context."""
        end = max(self.root.end_ns, end_ns or 0)
        for prompt_id, run in list(self._runs.items()):
            self._close_run(prompt_id, run)
        for tool in self._tools.values():
            tool.end_ns = max(tool.end_ns, end)
            tool.attributes["tapekit.unanswered"] = True
            self.emit(tool)
        self._tools = {}
        for runs in self._agent_runs.values():
            for record in reversed(runs):
                record.end_ns = max(record.end_ns, end)
                self.emit(record)
        self._agent_runs = {}
        root = self.root
        root.end_ns = end
        root.attributes.update(self._agent_attributes(self.root_agent, "tape"))
        if not self.root_agent:
            del root.attributes["gen_ai.agent.name"]
        root.attributes.update(
            {
                "tapekit.tape.id": metadata.id,
                "tapekit.tape.metadata": metadata.model_dump_json(),
                "tapekit.tape.context": _json(
                    context.model_dump(mode="json") if hasattr(context, "model_dump") else context
                ),
                "tapekit.tape.n_steps": self.n_steps,
            }
        )
        if metadata.error:
            root.error = metadata.error
            root.attributes["error.type"] = "agent_error"
        self.emit(root)


def _call_start(call: LLMCall) -> int:
    return int((call.timestamp - call.latency_s) * _NS)
