"""WrapperLLM: an LLM in front of another behaves as it unless a subclass says otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator

from tapekit.core import LLMOutput, Prompt
from tapekit.llm import CachedLLM, FunctionLLM, LLMEvent, WrapperLLM


def _inner() -> FunctionLLM:
    return FunctionLLM(
        fn=lambda p: LLMOutput(content="hi " + p.messages[-1]["content"]),
        model_name="inner",
        cost_per_prompt_token=0.5,
        cost_per_output_token=2.0,
    )


class Shouting(WrapperLLM):
    """Upper-cases the wrapped LLM's answer: the one thing it adds."""

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        async for event in self.llm.astream(prompt):
            if event.output is not None:
                event = event.model_copy(
                    update={"output": LLMOutput(content=(event.output.content or "").upper())}
                )
            yield event


def test_a_plain_wrapper_is_the_wrapped_llm() -> None:
    inner = _inner()
    wrapped = WrapperLLM(llm=inner)
    prompt = Prompt(messages=[{"role": "user", "content": "there"}])
    assert wrapped.generate(prompt) == inner.generate(prompt)
    assert (wrapped.model_name, wrapped.cost(10, 1)) == ("inner", 7.0)
    assert wrapped.make_training_text(prompt, LLMOutput(content="x")) == inner.make_training_text(
        prompt, LLMOutput(content="x")
    )
    assert WrapperLLM(llm=inner, model_name="renamed").model_name == "renamed"


def test_a_subclass_changes_only_what_it_overrides() -> None:
    shouting = Shouting(llm=_inner())
    prompt = Prompt(messages=[{"role": "user", "content": "there"}])
    assert shouting.generate(prompt).content == "HI THERE"
    assert shouting.cost(2, 2) == 5.0 and shouting.model_name == "inner"


def test_the_cache_is_a_wrapper(tmp_path: object) -> None:
    cached = CachedLLM(llm=_inner(), path=f"{tmp_path}/c.db")
    assert isinstance(cached, WrapperLLM) and cached.model_name == "inner" and cached.cost(2, 0) == 1.0
