"""An LLM in front of another: the base of caches, limiters and other decorators.

A :class:`WrapperLLM` holds the wrapped ``llm`` and, unless a subclass says otherwise, behaves
as it: the same model name and prices (so recorded calls look as they would without the
wrapper), the same token counting and training text, and a stream that is the wrapped LLM's.
A subclass overrides :meth:`_astream` for what it adds (answer from a cache, wait for a slot)
and calls ``self.llm.astream(prompt)`` for the rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import SerializeAsAny

from tapekit.core import LLMOutput, Prompt
from tapekit.llm.base import LLM, LLMEvent, TrainingText


class WrapperLLM(LLM):
    """An LLM that passes everything to ``llm`` unless a subclass overrides it.

    ``model_name`` defaults to the wrapped LLM's; the prices are always the wrapped LLM's.
    """

    llm: SerializeAsAny[LLM]

    def model_post_init(self, context: Any, /) -> None:
        """Take the wrapped model's name (unless one was given) and prices."""
        self.model_name = self.model_name or self.llm.model_name
        self.cost_per_prompt_token = self.llm.cost_per_prompt_token
        self.cost_per_output_token = self.llm.cost_per_output_token

    def cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """The wrapped LLM's price."""
        return self.llm.cost(prompt_tokens, output_tokens)

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return self.llm.astream(prompt)

    def count_tokens(self, text: str) -> int:
        """The wrapped LLM's token count."""
        return self.llm.count_tokens(text)

    def make_training_text(self, prompt: Prompt, output: LLMOutput) -> TrainingText:
        """The wrapped LLM's training text."""
        return self.llm.make_training_text(prompt, output)
