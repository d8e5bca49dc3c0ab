"""Which nodes an optimiser may change, how their parameters are read and set, and the saved
config of an optimised agent.

A node is *optimisable* when it has a pydantic field ``instruction: str`` and/or
``demos: list[...]`` that its prompt uses (MonoNode and LLMFunctionNode have both). A target
is named like a step's author, ``"<agent full name>.<node name>"`` (``"rag.answer"``,
``"analyst/search_agent.search"``). Optimisers never edit an agent in place: they build
:class:`NodeParams` per target and :func:`with_params` applies them to a clone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from tapekit.agent import Agent, Node
from tapekit.errors import TapekitError

CONFIG_FORMAT = "tapekit.optimize/1"


class OptimizeError(TapekitError, ValueError):
    """Bad input to :func:`~tapekit.optimize.optimize` or to a saved config (names what is wrong)."""


class NodeParams(BaseModel):
    """The optimisable parameters of one node; ``None`` leaves the node's own value.

    ``options`` sets other fields of the node by name (e.g. a web node's ``rationale`` or
    ``demo_pick``), each checked against the field's type; an option that names no field of the
    node, or ``instruction``/``demos``/``name``, is refused."""

    instruction: str | None = None
    demos: list[Any] | None = None
    options: dict[str, Any] | None = None


Params = dict[str, NodeParams]
"""Parameters by target name (``"agent.node"``)."""


def _members(agent: Agent) -> list[Agent]:
    out = [agent]
    for sub in agent.subagents:
        out.extend(_members(sub))
    return out


def _is_optimisable(node: Node) -> bool:
    fields = type(node).model_fields
    return "instruction" in fields or "demos" in fields


def optimisable_nodes(agent: Agent) -> dict[str, Node]:
    """Every optimisable node of ``agent``'s team, by target name ``"<agent>.<node>"``."""
    return {
        f"{member.full_name}.{node.name}": node
        for member in _members(agent)
        for node in member.nodes
        if _is_optimisable(node)
    }


def resolve_targets(agent: Agent, targets: list[str] | None) -> list[str]:
    """The target names to optimise: ``targets`` checked, or every optimisable node."""
    nodes = optimisable_nodes(agent)
    if not nodes:
        raise OptimizeError(
            f"agent {agent.name!r} has no optimisable node (a node with an 'instruction' or "
            "'demos' field, e.g. MonoNode or LLMFunctionNode)"
        )
    if targets is None:
        return list(nodes)
    if isinstance(targets, str):
        raise OptimizeError(f"targets must be a list of 'agent.node' names, not one string: [{targets!r}]")
    unknown = [t for t in targets if t not in nodes]
    if unknown:
        raise OptimizeError(
            f"targets {unknown} are not optimisable nodes of {agent.name!r}; they are {list(nodes)}"
        )
    if not targets:
        raise OptimizeError("targets is empty: name at least one 'agent.node'")
    return list(dict.fromkeys(targets))


def read_params(agent: Agent, targets: list[str]) -> Params:
    """The current instruction and demos of each target."""
    nodes = optimisable_nodes(agent)
    out: Params = {}
    for target in targets:
        node = nodes[target]
        out[target] = NodeParams(
            instruction=getattr(node, "instruction", None),
            demos=list(getattr(node, "demos", None) or []) if "demos" in type(node).model_fields else None,
        )
    return out


def _set(node: Node, field: str, value: Any, target: str) -> None:
    info = type(node).model_fields.get(field)
    if info is None or info.annotation is None:
        raise OptimizeError(f"node {target!r} ({type(node).__name__}) has no {field!r} field to set")
    try:
        checked: Any = TypeAdapter(info.annotation).validate_python(value)
    except Exception as e:
        raise OptimizeError(f"node {target!r}: the value for {field!r} does not fit its type: {e}") from e
    setattr(node, field, checked)


def with_params(agent: Agent, params: Params) -> Agent:
    """A clone of ``agent`` with each target's instruction and demos set (the original is
    untouched; LLM clients are shared)."""
    copy = agent.clone()
    nodes = optimisable_nodes(copy)
    for target, p in params.items():
        if target not in nodes:
            raise OptimizeError(f"{target!r} is not an optimisable node of {agent.name!r} ({list(nodes)})")
        if p.instruction is not None:
            _set(nodes[target], "instruction", p.instruction, target)
        if p.demos is not None:
            _set(nodes[target], "demos", p.demos, target)
        for field, value in (p.options or {}).items():
            if field in _NOT_OPTIONS:
                raise OptimizeError(
                    f"node {target!r}: {field!r} is not an option (set instruction and demos by their own "
                    "fields; a node's name is its identity)"
                )
            _set(nodes[target], field, value, target)
    return copy


_NOT_OPTIONS = frozenset({"instruction", "demos", "name"})


def _dumped(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _options(node: Node, fields: Sequence[str]) -> dict[str, Any]:
    return {f: _dumped(getattr(node, f)) for f in fields}


def save_optimized(
    agent: Agent,
    path: str | Path,
    targets: list[str] | None = None,
    options: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    """Write the optimisable parameters of ``agent`` (every optimisable node, or ``targets``) to
    a JSON config; :func:`load_optimized` applies it to a freshly built agent of the same shape.
    ``options`` names, by target, the other node fields optimisation set (see
    :class:`NodeParams`); their current values are saved too."""
    names = resolve_targets(agent, targets)
    params = read_params(agent, names)
    nodes_by_name = optimisable_nodes(agent)
    nodes = {
        t: {
            "instruction": p.instruction,
            "demos": None if p.demos is None else [_dumped(d) for d in p.demos],
            **({"options": _options(nodes_by_name[t], options[t])} if options and options.get(t) else {}),
        }
        for t, p in params.items()
    }
    out = Path(path)
    out.write_text(json.dumps({"format": CONFIG_FORMAT, "agent": agent.name, "nodes": nodes}, indent=2))
    return out


def load_optimized(agent: Agent, path: str | Path) -> Agent:
    """A clone of ``agent`` with the instructions and demos saved at ``path`` by
    :func:`save_optimized` (or :meth:`OptimizeResult.save`). The agent is built by your code
    as usual (its LLMs, tools, node classes); the config holds what optimisation changed."""
    where = Path(path)
    try:
        data = json.loads(where.read_text())
    except (OSError, ValueError) as e:
        raise OptimizeError(f"cannot read the optimised config {str(where)!r}: {e}") from e
    if not isinstance(data, dict) or data.get("format") != CONFIG_FORMAT:
        raise OptimizeError(f"{str(where)!r} is not a tapekit optimised config (format {CONFIG_FORMAT!r})")
    if data.get("agent") != agent.name:
        raise OptimizeError(f"{str(where)!r} was saved for agent {data.get('agent')!r}, not {agent.name!r}")
    params = {t: NodeParams.model_validate(p) for t, p in dict(data.get("nodes") or {}).items()}
    return with_params(agent, params)
