"""Steps of the reference TapeAgents package as tapekit steps, and back.

Dialog kinds map to tapekit's own classes (``user`` → :class:`~tapekit.dialog.UserStep`, a
``ToolCalls`` ``assistant`` step → one :class:`~tapekit.dialog.ToolCall` per call, ``tool`` →
:class:`~tapekit.dialog.ToolResult`, ``call``/``respond``/``set_next_node`` → the control steps,
...). Any other kind (a user's own step class) becomes a generic step of :mod:`tapekit.core`
(:class:`~tapekit.core.GenericThought`, :class:`~tapekit.core.GenericAction` or
:class:`~tapekit.core.GenericObservation`) that keeps its kind and all its fields, so nothing is
dropped. What a tapekit class has no field for (the reference's ``llm`` key, ``copy_output``,
the raw tool-call arguments) is kept under ``metadata.other["tapeagents"]``, which is how
:func:`to_reference_steps` gives back the original step dicts exactly.

The generic step classes live in :mod:`tapekit.core` (re-exported here), so stored imported
tapes load in any process that imports tapekit, without importing this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from tapekit.core import (
    Call,
    GenericAction,
    GenericObservation,
    GenericThought,
    Respond,
    SetNextNode,
    Step,
    StepMetadata,
)
from tapekit.dialog import AssistantStep, AssistantThought, SystemStep, ToolCall, ToolResult, UserStep
from tapekit.errors import TapekitError

EXTRA = "tapeagents"  # the metadata.other key holding what tapekit's classes have no field for
_META_KEYS = ("id", "prompt_id", "node", "agent", "llm", "other")


class ReferenceFormatError(TapekitError, ValueError):
    """Reference data that cannot be read: the message names the file, the tape and the step."""


Generic = GenericThought | GenericAction | GenericObservation


def _metadata(meta: dict[str, Any], extra: dict[str, Any], where: str) -> StepMetadata:
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
        raise ReferenceFormatError(f"{where}: step metadata must be an object with a string 'id'")
    other = meta.get("other") or {}
    if not isinstance(other, dict):
        raise ReferenceFormatError(f"{where}: metadata.other must be an object, not {other!r:.60}")
    kept = dict(extra)
    if meta.get("llm"):
        kept["llm"] = meta["llm"]
    unknown = {k: v for k, v in meta.items() if k not in _META_KEYS}
    if unknown:
        kept["metadata"] = unknown
    if "other" not in meta:
        kept["no_other"] = True
    return StepMetadata(
        id=meta["id"],
        prompt_id=str(meta.get("prompt_id") or ""),
        node=str(meta.get("node") or ""),
        agent=str(meta.get("agent") or ""),
        other={**other, EXTRA: kept} if kept else dict(other),
    )


def _generic(kind: str, fields: dict[str, Any], meta: StepMetadata) -> Generic:
    if not (meta.agent or meta.node or meta.prompt_id):
        return GenericObservation(original_kind=kind, fields=fields, metadata=meta)
    if kind.endswith("action"):
        return GenericAction(original_kind=kind, fields=fields, metadata=meta)
    return GenericThought(original_kind=kind, fields=fields, metadata=meta)


def _tool_calls(
    fields: dict[str, Any], meta: dict[str, Any], where: str, names: dict[str, str]
) -> list[Step] | None:
    """A ToolCalls step as one ToolCall per call, or None if it does not have the usual shape."""
    calls = fields["tool_calls"]
    if not isinstance(calls, list) or not calls:
        return None
    parsed = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or set(call) - {"function", "id", "type"}:
            return None
        raw = function.get("arguments", "{}")
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else None
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict) or not isinstance(function.get("name"), str):
            return None
        parsed.append((call, function, raw, arguments))
    steps: list[Step] = []
    for i, (call, function, _raw, arguments) in enumerate(parsed):
        extra = {"tool_calls": {"index": i, "count": len(parsed), "step_id": meta["id"], "call": call}}
        step_meta = dict(meta, id=meta["id"] if i == 0 else f"{meta['id']}#{i}")
        call_id = str(call.get("id") or "")
        names[call_id] = function["name"]
        steps.append(
            ToolCall(
                name=function["name"],
                arguments=arguments,
                call_id=call_id,
                metadata=_metadata(step_meta, extra, where),
            )
        )
    return steps


def _one(data: Any, where: str, names: dict[str, str]) -> list[Step]:
    """The tapekit steps for one reference step dict (several for a multi-call ToolCalls)."""
    if not isinstance(data, dict):
        raise ReferenceFormatError(f"{where}: a step must be an object, not {type(data).__name__}")
    kind = data.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ReferenceFormatError(f"{where}: the step has no 'kind'")
    raw_meta = data.get("metadata")
    if not isinstance(raw_meta, dict) or not isinstance(raw_meta.get("id"), str):
        raise ReferenceFormatError(f"{where}: step metadata must be an object with a string 'id'")
    fields = {k: v for k, v in data.items() if k not in ("metadata", "kind")}
    keys = set(fields)
    text = isinstance(fields.get("content"), str)
    if kind == "assistant" and keys == {"tool_calls"}:
        split = _tool_calls(fields, raw_meta, where, names)
        if split is not None:
            return split
    meta = _metadata(raw_meta, {}, where)
    if kind == "user" and keys == {"content"} and text:
        return [UserStep(content=fields["content"], metadata=meta)]
    if kind == "system" and keys == {"content"} and text:
        return [SystemStep(content=fields["content"], metadata=meta)]
    if kind == "assistant" and keys == {"content"} and text:
        return [AssistantStep(content=fields["content"], metadata=meta)]
    if kind == "assistant_thought" and keys == {"content"} and text:
        return [AssistantThought(content=fields["content"], metadata=meta)]
    if kind == "set_next_node" and keys == {"next_node"} and isinstance(fields["next_node"], str | int):
        return [SetNextNode(next_node=fields["next_node"], metadata=meta)]
    if kind == "call" and keys == {"content", "agent_name"} and text:
        return [Call(agent_name=str(fields["agent_name"]), content=fields["content"], metadata=meta)]
    if kind == "respond" and keys <= {"content", "copy_output"} and text:
        if "copy_output" in fields:
            meta = _metadata(raw_meta, {"copy_output": fields["copy_output"]}, where)
        return [Respond(content=fields["content"], metadata=meta)]
    if kind == "tool" and keys == {"content", "tool_call_id"} and isinstance(fields["tool_call_id"], str):
        call_id = fields["tool_call_id"]
        return [
            ToolResult(call_id=call_id, name=names.get(call_id, ""), content=fields["content"], metadata=meta)
        ]
    return [_generic(kind, fields, meta)]


def _mark_run_ends(steps: list[Step]) -> None:
    """tapekit marks the last step of each node run (``run_end``); the reference does not."""
    for i, step in enumerate(steps):
        pid = step.metadata.prompt_id
        nxt = steps[i + 1].metadata if i + 1 < len(steps) else None
        ends = nxt is None or nxt.prompt_id != pid or nxt.agent != step.metadata.agent
        step.metadata.run_end = bool(pid or step.metadata.agent) and ends


def from_reference_steps(data: Sequence[Any], where: str = "steps") -> list[Step]:
    """tapekit steps for a reference tape's list of step dicts (``where`` names them in errors).

    Ids, prompt ids, agents and nodes are kept; each step's ``run_end`` is set from where its
    prompt id changes, so a tapekit agent can continue the tape.
    """
    if not isinstance(data, list):
        raise ReferenceFormatError(f"{where}: 'steps' must be a list, not {type(data).__name__}")
    names: dict[str, str] = {}
    out: list[Step] = []
    for index, item in enumerate(data):
        out.extend(_one(item, f"{where}, step {index}", names))
    _mark_run_ends(out)
    return out


# --------------------------------------------------------------------------- back to the reference


def _reference_meta(meta: StepMetadata) -> tuple[dict[str, Any], dict[str, Any]]:
    other = dict(meta.other)
    extra = other.pop(EXTRA, {})
    out: dict[str, Any] = {
        "id": meta.id,
        "prompt_id": meta.prompt_id,
        "node": meta.node,
        "agent": meta.agent,
        "llm": extra.get("llm", ""),
    }
    if not extra.get("no_other"):
        out["other"] = other
    out.update(extra.get("metadata", {}))
    return out, extra


def to_reference_steps(steps: Iterable[Step]) -> list[dict[str, Any]]:
    """The reference step dicts for steps made by :func:`from_reference_steps` (or any dialog
    steps): the inverse of the import, equal to the original JSON for imported steps."""
    out: list[dict[str, Any]] = []
    for step in steps:
        meta, extra = _reference_meta(step.metadata)
        if isinstance(step, GenericThought | GenericAction | GenericObservation):
            out.append({"metadata": meta, "kind": step.original_kind, **step.fields})
        elif isinstance(step, ToolCall):
            group = extra.get("tool_calls", {"index": 0, "step_id": step.metadata.id})
            call = group.get("call") or {
                "function": {"name": step.name, "arguments": json.dumps(step.arguments)},
                "id": step.call_id,
                "type": "function",
            }
            if group["index"] > 0 and out and out[-1].get("kind") == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
                continue
            meta["id"] = group.get("step_id", step.metadata.id)
            out.append({"metadata": meta, "kind": "assistant", "tool_calls": [call]})
        elif isinstance(step, ToolResult):
            out.append(
                {"metadata": meta, "kind": "tool", "content": step.content, "tool_call_id": step.call_id}
            )
        elif isinstance(step, Respond):
            body: dict[str, Any] = {"content": step.content}
            if "copy_output" in extra:
                body["copy_output"] = extra["copy_output"]
            out.append({"metadata": meta, "kind": "respond", **body})
        elif isinstance(step, Call):
            out.append(
                {"metadata": meta, "kind": "call", "content": step.content, "agent_name": step.agent_name}
            )
        else:
            out.append({"metadata": meta, **step.llm_dict()})
    return out
