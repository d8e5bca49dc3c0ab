"""LLM functions: prompt templates shaped like function signatures, and a node that runs one.

An :class:`LLMFunction` has an instruction, named input fields, named output fields (plain
text, a rationale, or a tool call) and demos. It renders a chat prompt (the instruction and the
format as the system message, each demo as a user/assistant pair, then the inputs) and parses
the LLM's answer, ``Prefix: value`` lines in the outputs' order, back into values.
:meth:`LLMFunction.parse` reads back exactly what :meth:`LLMFunction.format_outputs` wrote,
which is what training text, demos and ``reuse`` need: a line inside a value that would read as
an output's prefix (``Answer: 3`` in the reasoning) is written with a backslash before the
prefix (``\\Answer: 3``), and parse takes that backslash off again.

An :class:`LLMFunctionNode` is an LLM function placed in an agent: it fills the inputs from the
steps the agent sees (:class:`StepSource`, or a function), and turns the outputs into steps.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import LLMOutput, Prompt, Respond, SetNextNode, Step, Tape
from tapekit.dialog import AssistantStep, AssistantThought, ToolCall
from tapekit.errors import AgentError, TapekitError
from tapekit.frameworks.demo import Demo
from tapekit.llm.base import LLMStream
from tapekit.structured import LLMOutputParsingFailure


class LLMFunctionError(TapekitError, ValueError):
    """An LLM function's output lacks a field, or its inputs or outputs are missing or unknown."""


def _title(name: str) -> str:
    return name.replace("_", " ").strip().capitalize()


class InputField(BaseModel):
    """A named input of an :class:`LLMFunction`. A list value (nested lists flattened) is shown
    one item per line (joined by ``separator``); other non-text values as JSON."""

    name: str
    desc: str = ""
    prefix: str = ""
    separator: str = "\n"

    def model_post_init(self, context: Any, /) -> None:
        """Default the prefix to the title-cased name."""
        if not self.prefix:
            self.prefix = _title(self.name)

    def render(self, value: Any) -> str:
        """``value`` as the text the prompt shows."""
        if isinstance(value, list | tuple):
            return self.separator.join(_as_text(v) for v in _flat(value))
        return _as_text(value)


class OutputField(BaseModel):
    """A named output of an :class:`LLMFunction` and the step it becomes in an agent.

    ``role``: ``"text"`` becomes a step chosen by ``step`` (an :class:`AssistantStep`, an
    :class:`AssistantThought`, a :class:`Respond` to the caller, or no step); ``"rationale"``
    becomes an :class:`AssistantThought`; ``"tool_call"`` becomes a :class:`ToolCall` of
    ``tool_name`` with the value as argument ``arg_name``.
    """

    name: str
    desc: str = ""
    prefix: str = ""
    role: Literal["text", "rationale", "tool_call"] = "text"
    step: Literal["assistant", "thought", "respond", "none"] = "assistant"
    tool_name: str = ""
    arg_name: str = ""

    def model_post_init(self, context: Any, /) -> None:
        """Default the prefix, and check that a tool-call output names its tool and argument."""
        if not self.prefix:
            self.prefix = "Reasoning" if self.role == "rationale" else _title(self.name)
        if self.role == "tool_call" and not (self.tool_name and self.arg_name):
            raise LLMFunctionError(f"tool-call output {self.name!r} needs tool_name and arg_name")

    @classmethod
    def rationale(cls, for_output: str, name: str = "rationale") -> OutputField:
        """A step-by-step reasoning output that comes before ``for_output``."""
        return cls(
            name=name, role="rationale", desc=f"think step by step in order to produce the {for_output}"
        )

    @classmethod
    def tool_call(cls, name: str, tool_name: str, arg_name: str, desc: str = "") -> OutputField:
        """An output that becomes a call of tool ``tool_name`` with the value as ``arg_name``."""
        return cls(name=name, role="tool_call", tool_name=tool_name, arg_name=arg_name, desc=desc)

    def makes_step(self) -> bool:
        """Whether this output becomes a step."""
        return not (self.role == "text" and self.step == "none")


class LLMFunction(BaseModel):
    """A prompt template shaped like a function signature: instruction, inputs, outputs, demos."""

    instruction: str = ""
    inputs: list[InputField] = Field(default_factory=list)
    outputs: list[OutputField] = Field(default_factory=list)
    demos: list[Demo] = Field(default_factory=list)

    def model_post_init(self, context: Any, /) -> None:
        """Check that there is an output and that field prefixes are unique."""
        if not self.outputs:
            raise LLMFunctionError("an LLM function needs at least one output field")
        prefixes = [f.prefix for f in self.fields()]
        for p in prefixes:
            if prefixes.count(p) > 1:
                raise LLMFunctionError(f"two fields of the LLM function use the prefix {p!r}")

    def fields(self) -> list[InputField | OutputField]:
        """The input fields, then the output fields."""
        return [*self.inputs, *self.outputs]

    # ------------------------------------------------------------------ rendering

    def system_text(self) -> str:
        """The system message: the instruction and the format of inputs and outputs."""
        lines = [self.instruction.strip(), ""] if self.instruction.strip() else []
        lines += ["Follow this format.", ""]
        for f in self.fields():
            lines.append(f"{f.prefix}: {f.desc or '${' + f.name + '}'}")
        lines += ["", "Answer with the output fields only, each on a new line after its prefix."]
        return "\n".join(lines)

    def render_inputs(self, values: dict[str, Any]) -> str:
        """The user message for these input values (every input must have a value)."""
        missing = [f.name for f in self.inputs if f.name not in values]
        if missing:
            raise LLMFunctionError(f"the LLM function has no value for input(s) {missing}")
        return "\n".join(f"{f.prefix}: {f.render(values[f.name])}" for f in self.inputs)

    def format_outputs(self, values: dict[str, Any]) -> str:
        """The answer text that :meth:`parse` reads back as ``values``.

        Each value is written after its ``Prefix: `` (non-text values as JSON, surrounding
        whitespace stripped, as :meth:`parse` strips it). A line inside a value that starts
        (after spaces or tabs) with backslashes and an output's prefix and colon, in any case,
        gets one more backslash before the prefix, so that it cannot be read as the start of
        a field; :meth:`parse` removes it. ``parse(format_outputs(values)) == values`` for
        every text value without surrounding whitespace.
        """
        missing = [f.name for f in self.outputs if f.name not in values]
        if missing:
            raise LLMFunctionError(f"the LLM function has no value for output(s) {missing}")
        escape = self._escape_pattern()
        return "\n".join(
            f"{f.prefix}: {escape.sub(_ESCAPED, _as_text(values[f.name]).strip())}" for f in self.outputs
        )

    def _escape_pattern(self) -> re.Pattern[str]:
        """A line break, then a line that reads as an output field's start once its leading
        backslashes are taken off (groups: the break and indent; the backslashes, prefix and
        colon)."""
        prefixes = "|".join(re.escape(f.prefix) for f in sorted(self.outputs, key=lambda f: -len(f.prefix)))
        return re.compile(rf"(\n[ \t]*)(\\*(?:{prefixes})[ \t]*:)", re.I)

    def render(self, values: dict[str, Any]) -> Prompt:
        """The prompt for these inputs: system message, each demo as a user/assistant pair,
        then the inputs."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_text()}]
        for demo in self.demos:
            messages.append({"role": "user", "content": self.render_inputs(demo.inputs)})
            messages.append({"role": "assistant", "content": self.format_outputs(demo.outputs)})
        messages.append({"role": "user", "content": self.render_inputs(values)})
        return Prompt(messages=messages)

    # ------------------------------------------------------------------ parsing

    def parse(self, text: str) -> dict[str, str]:
        """The output values in ``text``: each output's value runs from its ``Prefix:`` at the
        start of a line (case and spaces around it do not matter) to the next output's prefix,
        stripped. A line of a value written as ``\\Prefix:`` (an output's prefix after a
        backslash, see :meth:`format_outputs`) is not a field's start; one backslash is taken
        off it. With a single output, text without the prefix is taken whole.
        :class:`LLMFunctionError` names a missing field."""
        starts: list[tuple[int, int, OutputField]] = []
        pos = 0
        for f in self.outputs:
            m = re.compile(rf"^[ \t]*{re.escape(f.prefix)}[ \t]*:[ \t]*", re.M | re.I).search(text, pos)
            if m is None:
                if len(self.outputs) == 1 and text.strip():
                    return {f.name: text.strip()}
                raise LLMFunctionError(f"the output has no {f.prefix!r} field (for output {f.name!r})")
            starts.append((m.start(), m.end(), f))
            pos = m.end()
        unescape = self._escape_pattern()
        values: dict[str, str] = {}
        for i, (_, end, f) in enumerate(starts):
            stop = starts[i + 1][0] if i + 1 < len(starts) else len(text)
            values[f.name] = unescape.sub(_unescaped, text[end:stop].strip())
        return values


class StepSource(BaseModel):
    """Where an input's value comes from: field ``field`` of the last step (or, with
    ``all=True``, of every step) of kind ``kind`` (any kind when None) that the agent sees."""

    kind: str | None = None
    field: str = "content"
    all: bool = False

    def find(self, steps: list[Step]) -> Any:
        """The value in ``steps``, or raise :class:`LookupError` when no step matches."""
        found = [
            getattr(s, self.field)
            for s in steps
            if (self.kind is None or s.kind == self.kind) and self.field in type(s).model_fields
        ]
        if not found and not self.all:
            raise LookupError(f"no step of kind {self.kind or 'any'!r} with field {self.field!r}")
        return found if self.all else found[-1]


class LLMFunctionNode(LLMFunction, Node):
    """A node that runs an LLM function: inputs from the tape, outputs as steps.

    Each input comes from ``sources[name]`` (a :class:`StepSource`; by default the last step
    with a field of the input's name), unless ``input_fn(agent, tape)`` (not saved with the
    config) gives it. The outputs become steps in their order (see :class:`OutputField`).
    ``next_node`` adds a :class:`SetNextNode` before them (a loop, or a jump). An output that
    cannot be parsed becomes an :class:`LLMOutputParsingFailure` step with the raw text.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    sources: dict[str, StepSource] = Field(default_factory=dict)
    input_fn: Callable[[Agent, Tape[Any, Any]], dict[str, Any]] | None = Field(default=None, exclude=True)
    next_node: str | None = None

    def model_post_init(self, context: Any, /) -> None:
        """Check the template and default the node's name to the class name."""
        LLMFunction.model_post_init(self, context)
        Node.model_post_init(self, context)

    @classmethod
    def of(cls, function: LLMFunction, name: str = "", **kwargs: Any) -> LLMFunctionNode:
        """A node running ``function`` (copied), with node options in ``kwargs``."""
        return cls(name=name, **function.model_dump(), **kwargs)

    def function(self) -> LLMFunction:
        """This node's template as a plain :class:`LLMFunction` (a copy)."""
        return LLMFunction.model_validate(
            self.model_dump(include={"instruction", "inputs", "outputs", "demos"})
        )

    def fill_inputs(self, agent: Agent, tape: Tape[Any, Any]) -> dict[str, Any]:
        """The input values for a run on ``tape``, read from the agent's view of it."""
        values = dict(self.input_fn(agent, tape)) if self.input_fn is not None else {}
        steps = list(agent.compute_view(tape).top.steps)
        for f in self.inputs:
            if f.name in values:
                continue
            source = self.sources.get(f.name) or StepSource(field=f.name)
            try:
                values[f.name] = source.find(steps)
            except LookupError as e:
                raise AgentError(
                    f"LLM function node {self.name!r} of {agent.full_name!r} cannot fill input "
                    f"{f.name!r}: {e} in the agent's view"
                ) from None
        return values

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        """The function's prompt for the inputs read from ``tape``."""
        return self.render(self.fill_inputs(agent, tape))

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The outputs as steps (or a parsing failure)."""
        text = llm_stream.get_text()
        try:
            values = self.parse(text)
        except LLMFunctionError as e:
            yield LLMOutputParsingFailure(error=str(e), raw=text)
            return
        if self.next_node is not None:
            yield SetNextNode(next_node=self.next_node)
        for f in self.outputs:
            if f.makes_step():
                yield self._step(f, values[f.name], sum(isinstance(s, ToolCall) for s in tape.steps))

    def _step(self, f: OutputField, value: str, n_calls: int) -> Step:
        if f.role == "rationale" or f.step == "thought":
            return AssistantThought(content=value)
        if f.role == "tool_call":
            digest = hashlib.sha1(f"{self.name}|{n_calls}|{f.name}|{value}".encode()).hexdigest()[:12]
            return ToolCall(name=f.tool_name, arguments={f.arg_name: value}, call_id=f"call_{digest}")
        if f.step == "respond":
            return Respond(content=value)
        return AssistantStep(content=value)

    def output_values(self, agent: Agent, tape: Tape[Any, Any], index: int) -> dict[str, str]:
        """The output values of the run at ``tape.steps[index]``, read from its steps."""
        run = [s for s in node_run_steps(tape, index) if not isinstance(s, SetNextNode)]
        fields = [f for f in self.outputs if f.makes_step()]
        if len(fields) != len(self.outputs):
            hidden = [f.name for f in self.outputs if not f.makes_step()]
            raise LLMFunctionError(
                f"node {self.name!r}: output(s) {hidden} make no step, so a run's output cannot be rebuilt"
            )
        if len(run) != len(fields):
            raise LLMFunctionError(
                f"node {self.name!r}: the run has {len(run)} steps for {len(fields)} outputs"
            )
        values: dict[str, str] = {}
        for f, step in zip(fields, run, strict=True):
            if isinstance(step, ToolCall):
                values[f.name] = _as_text(step.arguments.get(f.arg_name, ""))
            else:
                values[f.name] = _as_text(getattr(step, "content", ""))
        return values

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The answer text that makes exactly the run's steps."""
        failure = next(
            (s for s in node_run_steps(tape, index) if isinstance(s, LLMOutputParsingFailure)), None
        )
        if failure is not None:
            return LLMOutput(content=failure.raw)
        return LLMOutput(content=self.format_outputs(self.output_values(agent, tape, index)))

    def extract_demo(self, agent: Agent, tape: Tape[Any, Any], index: int) -> Demo:
        """A demo made of the run at ``tape.steps[index]``: the inputs it saw, the outputs it
        gave. ``agent`` may be the run's agent or any agent of its team."""
        author = tape.steps[index].metadata.agent
        member = agent.root.find_agent(author) if author else agent
        context, at = member.node_run_context(tape, index)
        inputs = self.fill_inputs(member, context[:at])
        return Demo(inputs=inputs, outputs=self.output_values(member, context, at))


def _flat(items: list[Any] | tuple[Any, ...]) -> Iterator[Any]:
    """The items of nested lists, in order (several tool results of passages read as one list)."""
    for item in items:
        if isinstance(item, list | tuple):
            yield from _flat(item)
        else:
            yield item


_ESCAPED = r"\1\\\2"  # the line's break and indent, one more backslash, the rest


def _unescaped(m: re.Match[str]) -> str:
    """The inverse of :data:`_ESCAPED`: one backslash less (a line without one stays as it is)."""
    rest = m.group(2)
    return m.group(1) + (rest[1:] if rest.startswith("\\") else rest)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
