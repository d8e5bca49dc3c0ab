"""Deterministic LLMs for tests, demos and benchmarks: real code path, no model.

:class:`FunctionLLM` answers with a Python function of the prompt, so the same prompt always
gets the same answer (resuming and replaying work). :class:`ScriptedLLM` answers from a list,
in order. Both stream their text in word-sized chunks like a real backend.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import PrivateAttr

from tapekit.core import LLMOutput, Prompt
from tapekit.llm.base import LLM, LLMEvent

_WORDS = re.compile(r"\S+\s*|\s+")


def _as_output(answer: str | LLMOutput) -> LLMOutput:
    if isinstance(answer, LLMOutput):
        return answer
    if isinstance(answer, str):
        return LLMOutput(content=answer)
    raise TypeError(f"a scripted answer must be a str or LLMOutput, got {type(answer).__name__}")


async def _events(output: LLMOutput, latency_s: float, stream: bool) -> AsyncIterator[LLMEvent]:
    if latency_s:
        await asyncio.sleep(latency_s)
    if stream and output.content:
        for chunk in _WORDS.findall(output.content):
            yield LLMEvent(chunk=chunk)
    yield LLMEvent(output=output)


class FunctionLLM(LLM):
    """An LLM whose answer is ``fn(prompt)``: a str (text) or an :class:`LLMOutput`.

    ``latency_s`` adds a fixed delay per call (for benchmarks); ``stream=False`` skips the
    chunk events.
    """

    model_name: str = "function"
    fn: Callable[[Prompt], str | LLMOutput]
    latency_s: float = 0.0
    stream_chunks: bool = True

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return _events(_as_output(self.fn(prompt)), self.latency_s, self.stream_chunks)


class ScriptedLLM(LLM):
    """An LLM that gives its ``outputs`` one after another, and fails clearly when out."""

    model_name: str = "scripted"
    outputs: list[str | LLMOutput]
    latency_s: float = 0.0
    stream_chunks: bool = True
    _next: int = PrivateAttr(0)

    @property
    def n_calls(self) -> int:
        """How many answers were given so far."""
        return self._next

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        if self._next >= len(self.outputs):
            raise RuntimeError(
                f"ScriptedLLM ran out of outputs after {len(self.outputs)} calls; "
                f"the unanswered prompt's last message was {_last(prompt)!r}"
            )
        answer = self.outputs[self._next]
        self._next += 1
        return _events(_as_output(answer), self.latency_s, self.stream_chunks)


def _last(prompt: Prompt) -> Any:
    return prompt.messages[-1].get("content") if prompt.messages else None
