"""The LLM interface that agents call: an async stream of events ending in one output.

Nodes never call the LLM themselves. The agent sends the node's :class:`~tapekit.core.Prompt` to
the LLM, forwards text chunks as they arrive, and hands the node a completed
:class:`LLMStream`. Because a node sees the finished stream, ``generate_steps`` is a pure
function of (tape, LLM output): that is what makes replay and training text exact.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tapekit._sync import iterate_sync, run_sync
from tapekit.core import LLMOutput, Prompt, ToolCallRequest
from tapekit.errors import TapekitError

__all__ = [
    "LLM",
    "LLMCall",
    "LLMError",
    "LLMEvent",
    "LLMStream",
    "StreamedOutput",
    "TokenTrace",
    "TrainingText",
    "answer_text",
]


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
        """Stream the answer to ``prompt``; the last event carries the complete output."""
        got_output = False
        async for event in self._astream(prompt):
            if event.output is not None:
                got_output = True
            yield event
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
