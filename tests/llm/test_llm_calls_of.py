"""llm_calls_of: the LLM calls behind a tape's steps, once each, in order."""

from __future__ import annotations

from tapekit.core import LLMOutput, Prompt, StepMetadata
from tapekit.dialog import AssistantStep, UserStep
from tapekit.llm.base import LLMCall, llm_calls_of


def _call(pid: str) -> LLMCall:
    return LLMCall(prompt=Prompt(id=pid, messages=[]), output=LLMOutput(content=pid), model="m")


def test_calls_come_once_each_in_step_order_from_a_mapping_or_a_function() -> None:
    steps = [
        UserStep(content="q"),
        AssistantStep(content="a", metadata=StepMetadata(prompt_id="p2")),
        AssistantStep(content="b", metadata=StepMetadata(prompt_id="p2")),
        AssistantStep(content="c", metadata=StepMetadata(prompt_id="p1")),
        AssistantStep(content="d", metadata=StepMetadata(prompt_id="unknown")),
    ]
    known = {"p1": _call("p1"), "p2": _call("p2")}
    assert [c.prompt.id for c in llm_calls_of(steps, known)] == ["p2", "p1"]
    assert [c.prompt.id for c in llm_calls_of(steps, known.get)] == ["p2", "p1"]
    assert llm_calls_of([], known) == []
