"""Demonstrations: worked examples that an optimisable node puts in its prompt.

A node is *optimisable* when it has an ``instruction: str`` and/or a ``demos: list[Demo]``
field that its ``make_prompt`` uses (:class:`~tapekit.frameworks.MonoNode` and
:class:`~tapekit.frameworks.LLMFunctionNode` have both). An optimiser copies the agent and sets
those fields; the nodes expose ``extract_demo(agent, tape, index)`` to make a demo from a node
run on a good tape.

A node may hold more demos than one prompt should carry: with a :class:`DemoPick` it shows only
``k`` of them per prompt, chosen by :func:`pick_demos` (``"nearest"``: the demos whose match text
shares the most informative words with the current input, e.g. the same task's demos for a web
page's goal; ``"first"``: the first ``k``). The pool is then a retrieval store, the prompt stays
short, and the demos follow the input.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Demo(BaseModel):
    """One worked example: input fields and the output fields the LLM should give for them.

    An :class:`~tapekit.frameworks.LLMFunctionNode` demo maps its template's input names to
    values and its output names to values. A :class:`~tapekit.frameworks.MonoNode` demo is a
    rendered exchange: ``inputs={"user": text}``, ``outputs={"assistant": text}`` (see
    :meth:`chat`).
    """

    inputs: dict[str, Any] = Field(default_factory=dict)
    outputs: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def chat(cls, user: str, assistant: str) -> Demo:
        """A demo made of one user message and the assistant's answer to it."""
        return cls(inputs={"user": user}, outputs={"assistant": assistant})

    def match_text(self) -> str:
        """The text :func:`pick_demos` compares with an input: ``inputs["match"]`` when the demo
        has one (e.g. a web page's goal), else all its input values."""
        match = self.inputs.get("match")
        if match is not None:
            return str(match)
        return " ".join(str(v) for v in self.inputs.values())


class DemoPick(BaseModel):
    """Which of a node's demos one prompt shows: ``k`` of them by ``rule`` (see
    :func:`pick_demos`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(default=2, ge=1)
    rule: Literal["nearest", "first"] = "nearest"


_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def pick_demos(demos: Sequence[Demo], query: str, pick: DemoPick | None) -> list[Demo]:
    """The demos one prompt shows for the input ``query``.

    ``pick=None`` shows every demo. ``rule="first"`` shows the first ``k``. ``rule="nearest"``
    ranks the demos by the weight of the words their :meth:`Demo.match_text` shares with
    ``query``, each word weighted by its inverse document frequency over the pool,
    ``idf(w) = log(1 + N / df(w))`` (a word every demo has counts little, a task's own words
    much), and shows the ``k`` best, in pool order (on equal scores the earlier demo wins).
    Deterministic: the same pool and query give the same demos.
    """
    if pick is None:
        return list(demos)
    if pick.rule == "first" or len(demos) <= pick.k:
        return list(demos[: pick.k])
    texts = [_words(d.match_text()) for d in demos]
    df = Counter(w for words in texts for w in words)
    n = len(demos)
    wanted = _words(query)

    def score(words: set[str]) -> float:
        return sum(math.log1p(n / df[w]) for w in words & wanted)

    ranked = sorted(range(n), key=lambda i: -score(texts[i]))
    return [demos[i] for i in sorted(ranked[: pick.k])]
