"""The LLM interface that agents call: an async stream of events ending in one output.

Nodes never call the LLM themselves. The agent sends the node's :class:`~tapekit.core.Prompt` to
the LLM, forwards text chunks as they arrive, and hands the node a completed
:class:`LLMStream`. Because a node sees the finished stream, ``generate_steps`` is a pure
function of (tape, LLM output): that is what makes replay and training text exact.

LLM output is valid Unicode: :meth:`LLM.astream` escapes every lone surrogate in it (see
:func:`escape_lone_surrogates`, which owns the rule), so a model's half emoji never stops a
session that stores its tape.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from tapekit._sync import iterate_sync, run_sync
from tapekit.core import LLMOutput, Prompt, Step, ToolCallRequest
from tapekit.errors import TapekitError

_M = TypeVar("_M", bound=BaseModel)
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _joined_pair(match: re.Match[str]) -> str:
    return match.group().encode("utf-16-le", "surrogatepass").decode("utf-16-le")


def escape_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its text written as its escape, ``"\\ud83d"``.

    This is tapekit's one rule for text an LLM makes that is not valid Unicode. A lone
    surrogate (``"\\ud83d"``: half of an emoji's UTF-16 pair, which ``json.loads`` accepts and a
    backend can pass on) cannot be encoded as UTF-8, so no store, HTTP client or tokenizer can
    take it. Wherever LLM output enters tapekit, each one becomes the six ASCII characters
    ``\\ud83d`` (Python's ``backslashreplace``); a high and a low surrogate side by side are
    joined into their character first. That happens in two places, both calling this function:

    - :meth:`LLM.astream`, so every LLM's chunks, text and tool calls (the LLM-call record, the
      text a plain node reads, the raw text a structured node parses) hold the escape;
    - the JSON tapekit decodes from an output (a :class:`~tapekit.structured.StructuredNode`'s
      steps, tool-call arguments), where an escape ``\\ud83d`` in the JSON text decodes to a
      lone surrogate again: the decoded strings hold the six characters the model wrote.

    The session goes on with the escape in place of the broken character (nothing is dropped,
    and the escape shows where it was) instead of failing on a model's output. A node of your
    own that decodes JSON from an output can pass what it decodes through this function too.
    Text from your own code is not changed: the store refuses it (see docs/store.md).

    ``value`` is a str (returned as the same object when there is nothing to escape), or a
    dict or list (decoded JSON: rebuilt, keys included); anything else is returned as is.
    """
    if isinstance(value, str):
        if value.isascii():  # O(1) in CPython: the common case
            return value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            joined = _SURROGATE_PAIR.sub(_joined_pair, value)
            return joined.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {escape_lone_surrogates(k): escape_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_lone_surrogates(item) for item in value]
    return value


def _escaped_copy(model: _M, fields: tuple[str, ...]) -> _M:
    """``model`` with its text ``fields`` escaped: the same object when nothing changed."""
    update = {}
    for name in fields:
        value = getattr(model, name)
        if isinstance(value, str) and (escaped := escape_lone_surrogates(value)) is not value:
            update[name] = escaped
    return model.model_copy(update=update) if update else model


def _valid_event(event: LLMEvent) -> LLMEvent:
    """``event`` with its chunk and output escaped: the same object when nothing changed."""
    event = _escaped_copy(event, ("chunk",))
    output = event.output
    if output is None:
        return event
    escaped = _escaped_copy(output, ("role", "content"))
    if output.tool_calls:
        calls = [_escaped_copy(call, ("id", "name", "arguments")) for call in output.tool_calls]
        if any(c is not c0 for c, c0 in zip(calls, output.tool_calls, strict=True)):
            escaped = escaped.model_copy(update={"tool_calls": calls})
    return event if escaped is output else event.model_copy(update={"output": escaped})


class LLMError(TapekitError, RuntimeError):
    """An LLM call failed; the message names the endpoint and the model, and says why."""


class TokenTrace(BaseModel):
    """The tokens of one LLM call exactly as the model saw and sampled them.

    ``prompt_ids`` are the ids the model was conditioned on (chat template applied, special
    tokens included), ``output_ids`` the ids it sampled, and ``output_logprobs`` the sampling
    log-probability of each output id (under the sampler's own settings) when the backend
    reports them. ``tokenizer`` fingerprints the tokenizer and chat template that made the ids,
    so training can refuse ids from another tokenizer. ``policy_version`` names the weights
    that sampled (RL uses it to bound staleness); ``finish_reason`` is the backend's.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float] | None = None
    tokenizer: str = ""
    policy_version: str | None = None
    finish_reason: str | None = None


class LLMEvent(BaseModel):
    """One event of an LLM stream: a text chunk, or (last) the complete output with its
    token counts when the backend reports them, and its token ids when it can give them."""

    chunk: str | None = None
    output: LLMOutput | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    tokens: TokenTrace | None = None


class LLMCall(BaseModel):
    """A completed LLM call: the exact prompt and output, with its cost figures, and the token
    ids and sampling log-probabilities (``tokens``) when the backend gives them."""

    prompt: Prompt
    output: LLMOutput
    model: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    latency_s: float = 0.0
    timestamp: float = Field(default_factory=time.time)
    tokens: TokenTrace | None = None


def llm_calls_of(
    steps: Iterable[Step], lookup: Mapping[str, LLMCall] | Callable[[str], LLMCall | None]
) -> list[LLMCall]:
    """The LLM calls behind ``steps`` (a tape's steps, or a turn's), once each, in order.

    Each step made by a node run names its call by ``metadata.prompt_id``; ``lookup`` finds the
    call for an id: a mapping ``{prompt id: call}`` or a function such as a store's
    ``get_llm_call``. Ids it does not know are left out.
    """
    find = lookup.get if isinstance(lookup, Mapping) else lookup
    calls: list[LLMCall] = []
    seen: set[str] = set()
    for step in steps:
        pid = step.metadata.prompt_id
        if pid and pid not in seen:
            seen.add(pid)
            call = find(pid)
            if call is not None:
                calls.append(call)
    return calls


class TrainingText(BaseModel):
    """Text for fine-tuning: the whole ``text``, of which the last ``n_predicted`` characters
    are what the model must learn to produce (the rest is the prompt)."""

    text: str
    n_predicted: int
    prompt_id: str = ""
    agent: str = ""
    node: str = ""

    @property
    def prompt_text(self) -> str:
        """The part of ``text`` the model is conditioned on."""
        return self.text[: len(self.text) - self.n_predicted]

    @property
    def output_text(self) -> str:
        """The part of ``text`` the model is trained to predict."""
        return self.text[len(self.text) - self.n_predicted :]


class LLMStream:
    """A finished LLM stream as a node sees it: the chunks, then the final output.

    A node that made no prompt gets an empty stream (``bool(stream)`` is false); asking it for
    an output is an error that names the problem.
    """

    __slots__ = ("_output", "events", "prompt")

    def __init__(self, events: list[LLMEvent] | None = None, prompt: Prompt | None = None) -> None:
        self.events = events or []
        self.prompt = prompt
        self._output = next((e.output for e in reversed(self.events) if e.output), None)

    @classmethod
    def from_output(cls, output: LLMOutput, prompt: Prompt | None = None) -> LLMStream:
        """A stream that yields ``output`` at once (used for replay and training text)."""
        return cls([LLMEvent(output=output)], prompt)

    def __bool__(self) -> bool:
        return self._output is not None

    def __iter__(self) -> Iterator[LLMEvent]:
        return iter(self.events)

    def get_output(self) -> LLMOutput:
        """The LLM's complete output."""
        if self._output is None:
            raise ValueError("this node made no prompt, so there is no LLM output to read")
        return self._output

    def get_message(self) -> LLMOutput:
        """Alias of :meth:`get_output` (the output is an assistant message)."""
        return self.get_output()

    def get_text(self) -> str:
        """The output's text content ('' when the LLM only made tool calls)."""
        return self.get_output().content or ""


class LLM(BaseModel, ABC):
    """Base class of LLM clients. Implement :meth:`_astream`; everything else builds on it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_name: str = ""
    cost_per_prompt_token: float = 0.0
    cost_per_output_token: float = 0.0

    def cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """The price of a call with these token counts (0 unless per-token prices are set)."""
        return prompt_tokens * self.cost_per_prompt_token + output_tokens * self.cost_per_output_token

    @abstractmethod
    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        """Yield text chunks (optional), then exactly one event with the final output."""

    async def astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        """Stream the answer to ``prompt``; the last event carries the complete output.

        Every chunk and the output are valid Unicode: a lone surrogate the backend gives is
        written as its escape (see :func:`escape_lone_surrogates`)."""
        got_output = False
        async for event in self._astream(prompt):
            if event.output is not None:
                got_output = True
            yield _valid_event(event)
        if not got_output:
            raise RuntimeError(f"{type(self).__name__} ended its stream without an output")

    async def agenerate(self, prompt: Prompt) -> LLMOutput:
        """The complete output for ``prompt``."""
        output = None
        async for event in self.astream(prompt):
            if event.output is not None:
                output = event.output
        assert output is not None
        return output

    def count_tokens(self, text: str) -> int:
        """How many tokens the model makes of ``text`` (backends with a tokenizer implement it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot count tokens: it has no tokenizer")

    def stream(self, prompt: Prompt) -> Iterator[LLMEvent]:
        """Sync version of :meth:`astream`."""
        return iterate_sync(self.astream(prompt))

    def generate(self, prompt: Prompt) -> LLMOutput:
        """Sync version of :meth:`agenerate`."""
        return run_sync(self.agenerate(prompt))

    def make_training_text(self, prompt: Prompt, output: LLMOutput) -> TrainingText:
        """The text the model saw and produced for this call.

        This default renders a plain role-tagged transcript; backends with a real chat template
        override it so the text matches what the model was actually given.
        """
        prompt_text = "".join(_render_message(m) for m in prompt.messages) + "<|assistant|>\n"
        out = answer_text(output) + "<|end|>\n"
        return TrainingText(text=prompt_text + out, n_predicted=len(out), prompt_id=prompt.id)


def answer_text(output: LLMOutput) -> str:
    """An output as the text a model writes for it: the content, then the tool calls as a JSON
    list of ``{"name", "arguments"}`` (what training text puts in the predicted span)."""
    text = output.content or ""
    if output.tool_calls:
        calls = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in output.tool_calls]
        text += json.dumps(calls)
    return text


class StreamedOutput:
    """Collects a streamed answer (text pieces and tool-call deltas) into one :class:`LLMOutput`.

    Tool-call deltas are merged by their index: ids and names arrive once or repeated whole
    (servers differ; a few send names in pieces), arguments arrive in pieces.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}

    @property
    def text(self) -> str:
        """The text received so far."""
        return "".join(self._text)

    def add_text(self, piece: str) -> None:
        """Append a piece of the answer's text."""
        self._text.append(piece)

    def add_tool_call(self, index: int, id: str | None, name: str | None, arguments: str | None) -> None:
        """Merge one tool-call delta into the call at ``index``."""
        call = self._calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        call["id"] = id or call["id"]
        if name:
            current = call["name"]
            call["name"] = name if not current or name.startswith(current) else current + name
        call["arguments"] += arguments or ""

    def output(self) -> LLMOutput:
        """The complete output."""
        calls = [
            ToolCallRequest(id=c["id"], name=c["name"], arguments=c["arguments"] or "{}")
            for _, c in sorted(self._calls.items())
        ]
        return LLMOutput(content=self.text or None, tool_calls=calls or None)


def _render_message(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if message.get("tool_calls"):
        content += json.dumps(message["tool_calls"])
    return f"<|{message.get('role', 'user')}|>\n{content}<|end|>\n"
