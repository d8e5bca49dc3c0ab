"""Demonstrations: worked examples that an optimisable node puts in its prompt.

A node is *optimisable* when it has an ``instruction: str`` and/or a ``demos: list[Demo]``
field that its ``make_prompt`` uses (:class:`~tapekit.frameworks.MonoNode` and
:class:`~tapekit.frameworks.LLMFunctionNode` have both). An optimiser copies the agent and sets
those fields; the nodes expose ``extract_demo(agent, tape, index)`` to make a demo from a node
run on a good tape.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


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
