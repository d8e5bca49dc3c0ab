"""Steps straight from LLM output: a JSON schema for a set of step classes, and a parser.

The schema goes into ``Prompt.response_schema``; backends that can constrain decoding to it
(llama.cpp's grammar, OpenAI's ``json_schema``) make output that always parses. Every output is
still parsed and validated, so backends without constraints work too, and an output that does
not fit becomes an :class:`LLMOutputParsingFailure` step carrying the raw text: the tape shows
what went wrong and the agent can react, instead of crashing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import LLMOutput, Prompt, SetNextNode, Step, Tape, Thought
from tapekit.dialog import view_to_messages
from tapekit.errors import TapekitError
from tapekit.llm.base import LLMStream, escape_lone_surrogates


class LLMOutputParsingFailure(Thought):
    """The LLM's output could not be turned into steps: ``error`` says why, ``raw`` is the text."""

    kind: Literal["llm_output_parsing_failure"] = "llm_output_parsing_failure"
    error: str
    raw: str


class StepParsingError(TapekitError, ValueError):
    """Text that is not a valid ``{"steps": [...]}`` object for the allowed step classes."""


def _step_schema(cls: type[Step], defs: dict[str, Any]) -> dict[str, Any]:
    schema = cls.model_json_schema(ref_template="#/$defs/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        if name != "StepMetadata":
            defs[name] = definition
    schema["properties"].pop("metadata", None)
    kind = cls.model_fields["kind"].default
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = ["kind", *[r for r in schema.get("required", []) if r not in ("metadata", "kind")]]
    schema["additionalProperties"] = False
    schema.pop("title", None)
    return schema


def steps_schema(step_classes: Sequence[type[Step]], max_steps: int | None = None) -> dict[str, Any]:
    """The JSON schema of ``{"steps": [step, ...]}`` where each step is one of ``step_classes``
    (their fields, with ``kind`` fixed; metadata is the framework's business, not the LLM's)."""
    if not step_classes:
        raise ValueError("steps_schema needs at least one step class")
    defs: dict[str, Any] = {}
    variants = [_step_schema(cls, defs) for cls in step_classes]
    items: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if max_steps is not None:
        array["maxItems"] = max_steps
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"steps": array},
        "required": ["steps"],
        "additionalProperties": False,
    }
    if defs:
        schema["$defs"] = defs
    return schema


def parse_steps(text: str, step_classes: Sequence[type[Step]]) -> list[Step]:
    """The steps in ``text`` (a ``{"steps": [...]}`` JSON object), validated against
    ``step_classes``; :class:`StepParsingError` says what is wrong."""
    by_kind = {cls.model_fields["kind"].default: cls for cls in step_classes}
    data = _load_json(text)
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list) or not data["steps"]:
        raise StepParsingError('expected a JSON object {"steps": [...]} with at least one step')
    steps: list[Step] = []
    for i, item in enumerate(data["steps"]):
        if not isinstance(item, dict):
            raise StepParsingError(f"step {i} is not an object")
        cls = by_kind.get(item.get("kind"))  # type: ignore[arg-type]
        if cls is None:
            raise StepParsingError(
                f"step {i} has kind {item.get('kind')!r}; allowed kinds: {', '.join(by_kind)}"
            )
        try:
            steps.append(cls.model_validate({k: v for k, v in item.items() if k != "metadata"}))
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise StepParsingError(f"step {i} ({cls.__name__}) is invalid: {problems}") from e
        except RecursionError:
            raise StepParsingError(f"step {i} ({cls.__name__}) is nested too deeply to validate") from None
        except Exception as e:  # a validator of the step class that fails in another way
            raise StepParsingError(f"step {i} ({cls.__name__}) is invalid: {type(e).__name__}: {e}") from e
    return steps


def _load_json(text: str) -> Any:
    """``json.loads(text)``, every failure a :class:`StepParsingError` that says why.

    A lone surrogate in the decoded strings (from an escape such as ``\\ud83d`` in the JSON
    text) is written as that escape, as in all LLM output (see
    :func:`~tapekit.llm.base.escape_lone_surrogates`): the steps can always be stored."""
    if not isinstance(text, str):
        raise StepParsingError(f"the output must be text, not {type(text).__name__}")
    if not text.strip():
        raise StepParsingError("the output is empty")
    try:
        return escape_lone_surrogates(json.loads(text))
    except json.JSONDecodeError as e:
        cut = e.pos >= len(text.rstrip()) - 1 or "Unterminated" in e.msg
        hint = " (it looks cut off: raise the LLM's max_tokens or lower max_steps)" if cut else ""
        raise StepParsingError(f"the output is not JSON{hint}: {e}") from e
    except RecursionError:
        raise StepParsingError("the output is JSON nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer with more digits than int() accepts
        raise StepParsingError(f"the output is not JSON that can be read: {e}") from e


def steps_or_failure(text: str, step_classes: Sequence[type[Step]]) -> list[Step]:
    """Like :func:`parse_steps`, but a bad output gives ``[LLMOutputParsingFailure]`` (its
    ``raw`` text with lone surrogates escaped, as in all LLM output)."""
    try:
        return parse_steps(text, step_classes)
    except StepParsingError as e:
        return [LLMOutputParsingFailure(error=str(e), raw=escape_lone_surrogates(text))]


class StructuredNode(Node):
    """A node whose LLM writes steps directly as schema-constrained JSON.

    The prompt is ``system`` + the agent's view as chat messages + ``instruction``, with the
    JSON schema of ``step_classes`` (at most ``max_steps`` steps) as the response schema.
    After a parsing failure the node
    runs again (up to ``max_retries`` times in a row), seeing its failure on the tape.
    """

    step_classes: list[type[Step]]
    max_steps: int | None = 4
    system: str = ""
    instruction: str = "Answer with the next steps as JSON."
    max_retries: int = 1

    def _prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
        messages += view_to_messages(agent.compute_view(tape).top.steps, agent.full_name)
        messages.append({"role": "user", "content": self.instruction})
        return Prompt(messages=messages, response_schema=steps_schema(self.step_classes, self.max_steps))

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        """System message, the view as messages, the instruction; the steps' schema.

        Raises :class:`StepParsingError` instead when the previous runs of this node all made
        parsing failures and no retries are left, and no other node would run next: the agent
        then fails with that error (the failures, with the raw outputs, stay on the tape)."""
        failures = self._recent_failures(agent, tape)
        if failures > self.max_retries:
            last = next(s for s in reversed(tape.steps) if isinstance(s, LLMOutputParsingFailure))
            raise StepParsingError(
                f"the LLM's output could not be parsed into steps in {failures} attempts "
                f"(max_retries={self.max_retries}); the last one: {last.error}"
            )
        return self._prompt(agent, tape)

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The parsed steps, or a parsing failure (and a retry while retries are left).

        When retries run out, the agent's next node runs, seeing the failure; if this is the
        agent's last node, the node runs once more only to stop the agent with an error that
        says the output could not be parsed."""
        steps = steps_or_failure(llm_stream.get_text(), self.step_classes)
        if isinstance(steps[0], LLMOutputParsingFailure) and (
            self._recent_failures(agent, tape) < self.max_retries or agent.nodes[-1].name == self.name
        ):
            yield SetNextNode(next_node=self.name)
        yield from steps

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The JSON that makes exactly this run's steps."""
        run = node_run_steps(tape, index)
        failure = next((s for s in run if isinstance(s, LLMOutputParsingFailure)), None)
        if failure is not None:
            return LLMOutput(content=failure.raw)
        return LLMOutput(content=json.dumps({"steps": [s.llm_dict() for s in run]}))

    def _recent_failures(self, agent: Agent, tape: Tape[Any, Any]) -> int:
        count = 0
        for step in reversed(agent.compute_view(tape).top.steps):
            if step.metadata.node != self.name:
                break
            count += isinstance(step, LLMOutputParsingFailure)
        return count
