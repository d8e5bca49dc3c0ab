"""Monolithic agents: one prompt made of the whole tape and the schemas of every step kind.

A :class:`MonoNode` shows the LLM the system prompt, the step kinds it may write (their JSON
schemas), its demos, the agent's view of the tape as chat messages (its own earlier steps as
the JSON it wrote, everything else as user messages) and a final instruction. The LLM answers
``{"steps": [...]}``: schema-constrained where the backend can, always parsed and validated
(see :mod:`tapekit.structured`). The nodes of a :class:`MonoAgent` share everything but the
instruction. When the prompt would pass ``max_prompt_tokens``, the oldest observations (not the
user's messages, never the newest observation) are replaced by a short note, oldest first,
until it fits: deterministic, so a resumed or replayed run makes the same prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self

from pydantic import Field, field_serializer, field_validator

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import Call, ControlStep, LLMOutput, Observation, Prompt, Respond, SetNextNode, Step, Tape
from tapekit.core import step_kinds as registered_step_kinds
from tapekit.dialog import SystemStep, UserStep
from tapekit.frameworks.demo import Demo, DemoPick, pick_demos
from tapekit.llm.base import LLM, LLMStream
from tapekit.structured import LLMOutputParsingFailure, StructuredNode, steps_schema

TRIMMED_NOTE = "trimmed to fit the prompt budget: {n} tokens left out"


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: one token per 4 characters, rounded up."""
    return (len(text) + 3) // 4


def token_counter(llm: LLM | None) -> Callable[[str], int]:
    """``llm.count_tokens`` when the backend has a tokenizer, else :func:`estimate_tokens`."""
    if llm is None:
        return estimate_tokens
    try:
        llm.count_tokens("probe")
    except NotImplementedError:
        return estimate_tokens
    return llm.count_tokens


class MonoNode(StructuredNode):
    """One node of a monolithic agent: the shared prompt plus this node's ``instruction``.

    ``step_classes`` are the kinds the LLM may write (saved in a config by their ``kind``);
    ``demos`` are rendered user/assistant exchanges (:meth:`Demo.chat`) shown before the tape
    (with ``demo_pick``, only ``k`` of them per prompt, those nearest the tape's last message:
    :func:`~tapekit.frameworks.pick_demos`);
    ``next_node`` adds a :class:`SetNextNode` before the steps (e.g. an acting node that loops
    on itself); ``constrained=False`` leaves the response schema out of the prompt, for backends
    that reject it (the output is still parsed against it).
    """

    step_classes: list[type[Step]] = Field(default_factory=list)
    demos: list[Demo] = Field(default_factory=list)
    demo_pick: DemoPick | None = None
    max_prompt_tokens: int | None = None
    next_node: str | None = None
    constrained: bool = True

    @field_validator("step_classes", mode="before")
    @classmethod
    def _classes_from_kinds(cls, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            return value
        known = registered_step_kinds()
        out = []
        for item in value:
            if isinstance(item, str):
                if item not in known:
                    raise ValueError(f"no step class of kind {item!r} is loaded (import its module first)")
                item = known[item]
            out.append(item)
        return out

    @field_serializer("step_classes")
    def _kinds(self, value: list[type[Step]]) -> list[str]:
        return [str(c.model_fields["kind"].default) for c in value]

    # ------------------------------------------------------------------ the prompt

    def system_text(self) -> str:
        """The system message: ``system``, then the step kinds and the answer's JSON schema."""
        if not self.step_classes:
            raise ValueError(
                f"MonoNode {self.name!r} has no step_classes (give them, or use MonoAgent.create)"
            )
        lines = [self.system.strip(), ""] if self.system.strip() else []
        lines.append('Answer with a JSON object {"steps": [...]}; each step is one of these kinds:')
        for cls in self.step_classes:
            doc = (cls.__doc__ or "").strip().splitlines()
            lines.append(f"- {cls.model_fields['kind'].default}: {doc[0] if doc else cls.__name__}")
        lines += [
            "",
            "The JSON schema of the answer:",
            json.dumps(steps_schema(self.step_classes, self.max_steps)),
        ]
        return "\n".join(lines)

    def tape_messages(self, agent: Agent, tape: Tape[Any, Any]) -> list[dict[str, Any]]:
        """The agent's view as chat messages, trimmed to ``max_prompt_tokens`` if set."""
        steps = list(agent.compute_view(tape).top.steps)
        entries = _entries(steps, agent.full_name)
        if self.max_prompt_tokens is None:
            return [m for m, _ in entries]
        count = token_counter(agent.llm_for(self) if agent.llms else None)
        fixed = sum(count(m["content"]) for m in self._fixed_messages(_last_text([m for m, _ in entries])))
        return _trimmed(entries, count, self.max_prompt_tokens - fixed)

    def _fixed_messages(self, query: str) -> list[dict[str, Any]]:
        msgs = [{"role": "system", "content": self.system_text()}]
        for demo in pick_demos(self.demos, query, self.demo_pick):
            msgs.append({"role": "user", "content": str(demo.inputs.get("user", ""))})
            msgs.append({"role": "assistant", "content": str(demo.outputs.get("assistant", ""))})
        msgs.append({"role": "user", "content": self.instruction})
        return msgs

    def _prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        tape_messages = self.tape_messages(agent, tape)
        fixed = self._fixed_messages(_last_text(tape_messages))
        messages = [*fixed[:-1], *tape_messages, fixed[-1]]
        schema = steps_schema(self.step_classes, self.max_steps) if self.constrained else None
        return Prompt(messages=messages, response_schema=schema)

    # ------------------------------------------------------------------ output

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The parsed steps (after ``SetNextNode(next_node)`` when set), or a parsing failure."""
        steps = list(super().generate_steps(agent, tape, llm_stream))
        if self.next_node is not None and not any(isinstance(s, LLMOutputParsingFailure) for s in steps):
            yield SetNextNode(next_node=self.next_node)
        yield from steps

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The JSON that makes exactly this run's steps (without the node's own routing)."""
        run = node_run_steps(tape, index)
        failure = next((s for s in run if isinstance(s, LLMOutputParsingFailure)), None)
        if failure is not None:
            return LLMOutput(content=failure.raw)
        if self.next_node is not None and run and isinstance(run[0], SetNextNode):
            run = run[1:]
        return LLMOutput(content=json.dumps({"steps": [s.llm_dict() for s in run]}))

    def extract_demo(self, agent: Agent, tape: Tape[Any, Any], index: int) -> Demo:
        """A demo made of the run at ``tape.steps[index]``: the last message of the view it saw
        (as the user turn) and the JSON it wrote."""
        author = tape.steps[index].metadata.agent
        member = agent.root.find_agent(author) if author else agent
        context, at = member.node_run_context(tape, index)
        seen = [m for m, _ in _entries(list(member.compute_view(context[:at]).top.steps), member.full_name)]
        user = next((m["content"] for m in reversed(seen) if m["role"] == "user"), "")
        return Demo.chat(user, self.make_llm_output(member, context, at).content or "")


class MonoAgent(Agent):
    """An agent made of :class:`MonoNode` nodes that share one prompt but for the instruction."""

    @classmethod
    def create(  # type: ignore[override]
        cls,
        name: str,
        llms: LLM | dict[str, LLM] | None = None,
        nodes: Sequence[Node] | None = None,
        subagents: list[Agent] | None = None,
        templates: dict[str, Any] | None = None,
        *,
        system: str = "",
        step_classes: Sequence[type[Step]] = (),
        max_prompt_tokens: int | None = None,
        **kwargs: Any,
    ) -> Self:
        """Build a mono agent: ``system``, ``step_classes`` and ``max_prompt_tokens`` are given
        to every :class:`MonoNode` that does not set its own."""
        filled: list[Node] = []
        for node in nodes or []:
            if isinstance(node, MonoNode):
                update: dict[str, Any] = {}
                if not node.system and system:
                    update["system"] = system
                if not node.step_classes:
                    update["step_classes"] = list(step_classes)
                if node.max_prompt_tokens is None and max_prompt_tokens is not None:
                    update["max_prompt_tokens"] = max_prompt_tokens
                node = node.model_copy(update=update)
                if not node.step_classes:
                    raise ValueError(f"MonoNode {node.name!r} of {name!r} has no step_classes")
            filled.append(node)
        return super().create(
            name, llms=llms, nodes=filled, subagents=subagents, templates=templates, **kwargs
        )


def _entries(steps: list[Step], me: str) -> list[tuple[dict[str, Any], Step | None]]:
    """One chat message per step or per run of the agent's own steps, each with the step it
    may trim (an old observation) or None."""
    out: list[tuple[dict[str, Any], Step | None]] = []
    own: list[dict[str, Any]] = []
    own_pid: str | None = None

    def flush() -> None:
        nonlocal own, own_pid
        if own:
            out.append(({"role": "assistant", "content": json.dumps({"steps": own})}, None))
        own, own_pid = [], None

    for step in steps:
        meta = step.metadata
        if meta.agent == me:
            if isinstance(step, SetNextNode):
                continue
            if own_pid is not None and meta.prompt_id != own_pid:
                flush()
            own.append(step.llm_dict())
            own_pid = meta.prompt_id
            continue
        flush()
        if isinstance(step, SystemStep):
            out.append(({"role": "system", "content": step.content}, None))
        elif isinstance(step, UserStep | Call):
            out.append(({"role": "user", "content": step.content}, None))
        elif isinstance(step, Respond):
            who = meta.agent.rsplit("/", 1)[-1] or "subagent"
            out.append(({"role": "user", "content": f"({who} answers) {step.content}"}, None))
        elif isinstance(step, ControlStep):
            continue
        else:
            text = json.dumps(step.llm_dict(), ensure_ascii=False)
            out.append(({"role": "user", "content": text}, step if isinstance(step, Observation) else None))
    flush()
    return out


def _trimmed(
    entries: list[tuple[dict[str, Any], Step | None]], count: Callable[[str], int], budget: int
) -> list[dict[str, Any]]:
    """The messages with the oldest observations replaced by a note until they fit ``budget``
    tokens; the newest observation is always kept whole."""
    messages = [dict(m) for m, _ in entries]
    sizes = [count(m["content"]) for m in messages]
    total = sum(sizes)
    trimmable = [i for i, (_, step) in enumerate(entries) if step is not None][:-1]
    for i in trimmable:
        if total <= budget:
            break
        step = entries[i][1]
        assert step is not None
        note = json.dumps({"kind": step.kind, "note": TRIMMED_NOTE.format(n=sizes[i])})
        messages[i]["content"] = note
        total += count(note) - sizes[i]
    return messages


def _last_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last message (what demos are picked for)."""
    return str(messages[-1].get("content") or "") if messages else ""
