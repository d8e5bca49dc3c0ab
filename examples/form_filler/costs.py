"""Tokens and cost of agent turns (the paper's Table 4).

A turn's LLM calls are found through its steps' ``metadata.prompt_id`` (the way
:mod:`tapekit.evaluate` counts an attempt's tokens): in a mapping ``{prompt id: LLMCall}``
(an :class:`~tapekit.evaluate.EvalReport`'s ``llm_calls``), a store (``get_llm_call``) or a
function. A node run that made no LLM call has no call to find. Prices are dollars per million
prompt and completion tokens per model (:class:`Price`); a turn's cost is the sum over its calls
of their tokens at their model's price, and the cost of a million turns is a million times the
mean cost of a turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from examples.form_filler.greadth_rules import AgentTurn
from tapekit.llm import LLMCall, llm_calls_of

__all__ = ["PAPER_PRICES", "CallLookup", "Price", "call_lookup", "check_prices", "turn_calls"]

CallLookup = Callable[[str], LLMCall | None]
"""Finds the LLM call of a prompt id (``None`` when that node run made none)."""


class Price(BaseModel):
    """Dollars per million ``prompt`` and ``completion`` tokens."""

    model_config = ConfigDict(frozen=True)

    prompt: float
    completion: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Dollars for these token counts."""
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1e6


PAPER_PRICES: dict[str, Price] = {
    "Llama-3.1-8B-Instruct": Price(prompt=0.055, completion=0.055),
    "Llama-3.1-405B-Instruct": Price(prompt=1.79, completion=1.79),
}
"""Table 4's prices (the cheapest OpenRouter provider on 3 October 2024)."""


def call_lookup(source: Any) -> CallLookup:
    """A lookup from a mapping of prompt id to call, a store (``get_llm_call``) or a function."""
    if isinstance(source, Mapping):
        return source.get
    getter = getattr(source, "get_llm_call", None)
    if callable(getter):
        return getter  # type: ignore[no-any-return]
    if callable(source):
        return source  # type: ignore[no-any-return]
    raise TypeError(
        "llm_calls must be a mapping {prompt id: LLMCall}, a store or a function, "
        f"not {type(source).__name__}"
    )


def turn_calls(turn: AgentTurn, lookup: CallLookup) -> list[LLMCall]:
    """The LLM calls the agent made in ``turn``, once each, in order."""
    return llm_calls_of(turn.steps, lookup)


def check_prices(prices: Mapping[str, Any]) -> dict[str, Price]:
    """``prices`` as :class:`Price` objects; a ``(prompt, completion)`` pair is accepted."""
    checked: dict[str, Price] = {}
    for model, price in prices.items():
        if isinstance(price, tuple | list) and len(price) == 2:
            price = Price(prompt=price[0], completion=price[1])
        if not isinstance(price, Price):
            raise TypeError(
                f"prices[{model!r}] must be a Price or a (prompt, completion) pair, got {price!r}"
            )
        if price.prompt < 0 or price.completion < 0:
            raise ValueError(f"prices[{model!r}] is negative: {price}")
        checked[model] = price
    return checked
