"""LlamaCppLLM's prompt-prefix reuse: only the new suffix of a prompt is evaluated, and the
token ids, log-probabilities and texts are exactly those of a cold evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tapekit import Prompt
from tapekit.llm._llamacpp_decode import exact_after, reusable_prefix
from tapekit.llm.base import LLMEvent
from tapekit.llm.llamacpp import LlamaCppLLM
from tests.conftest import needs_local_model


def test_reusable_prefix_keeps_the_common_prefix_and_feeds_at_least_two_tokens() -> None:
    assert reusable_prefix([1, 2, 3, 4], [1, 2, 3, 9, 9, 9], n_batch=512) == 3
    assert reusable_prefix([1, 2, 3, 4], [5, 2, 3, 4, 9], n_batch=512) == 0
    assert reusable_prefix([1, 2, 3, 4], [1, 2, 3, 4, 9], n_batch=512) == 3  # not a suffix of one
    assert reusable_prefix([1, 2, 3, 4], [1, 2, 3, 4], n_batch=512) == 2  # the same prompt again
    assert reusable_prefix([1, 2], [1, 2], n_batch=512) == 0
    assert reusable_prefix([], [1, 2, 3], n_batch=512) == 0
    # a suffix of 9 tokens fed 4 at a time ends in a batch of one: keep one token less
    assert reusable_prefix(list(range(10)), [*range(10), *range(100, 109)], n_batch=4) == 9
    assert reusable_prefix(list(range(10)), [*range(10), *range(100, 108)], n_batch=4) == 10


def test_exact_after_leaves_out_a_last_batch_of_one_token() -> None:
    assert exact_after(40, 22, n_batch=512) == 40
    assert exact_after(9, 0, n_batch=4) == 8
    assert exact_after(8, 0, n_batch=4) == 8


CALC = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "12+3?"}]
PROMPTS: list[Any] = [
    CALC,
    "turn2:0",  # the second turn right after the first: its answer's tokens were fed one by one
    [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "40+2?"}],
    [{"role": "user", "content": "Name a colour."}],
    "turn2:2",  # after another conversation: only the template's first tokens are shared
    "turn2:2",  # the same prompt again
]


def _final(events: list[LLMEvent]) -> LLMEvent:
    assert events[-1].output is not None and events[-1].tokens is not None
    return events[-1]


def _run(llm: LlamaCppLLM) -> list[tuple[Any, ...]]:
    """Every prompt of PROMPTS (a second turn extends an earlier first turn with its answer)."""
    answers: list[str] = []
    out = []
    for spec in PROMPTS:
        if isinstance(spec, str):
            i = int(spec.split(":")[1])
            first = PROMPTS[i]
            assert isinstance(first, list)
            messages = [
                *first,
                {"role": "assistant", "content": answers[i]},
                {"role": "user", "content": "=?"},
            ]
        else:
            messages = spec
        final = _final(list(llm.stream(Prompt(messages=messages))))
        answers.append(final.output.content or "")  # type: ignore[union-attr]
        t = final.tokens
        assert t is not None
        out.append((t.prompt_ids, t.output_ids, t.output_logprobs, t.finish_reason, final.output.content))  # type: ignore[union-attr]
    return out


@pytest.fixture(scope="module")
def fed() -> Iterator[dict[str, Any]]:
    """Greedy and seeded-sampling runs with and without reuse, and the prompt tokens each fed."""
    results: dict[str, Any] = {}
    for params in ({"temperature": 0.0, "max_tokens": 6}, {"temperature": 0.8, "max_tokens": 6, "seed": 7}):
        for reuse in (False, True):
            llm = LlamaCppLLM(parameters=params, n_ctx=256, n_threads=1, reuse_prefix=reuse)
            llama = llm.load()
            counted: list[int] = []
            real_eval = llama.eval

            def counting_eval(tokens: Any, real: Any = real_eval, counted: list[int] = counted) -> None:
                counted.append(len(tokens))
                real(tokens)

            llama.eval = counting_eval
            key = f"{'sampled' if params['temperature'] else 'greedy'}/{'reuse' if reuse else 'cold'}"
            results[key] = (_run(llm), sum(n for n in counted if n > 1))
    yield results


@needs_local_model
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_reuse_gives_the_ids_logprobs_and_texts_of_a_cold_evaluation(fed: dict[str, Any], mode: str) -> None:
    cold, cold_fed = fed[f"{mode}/cold"]
    warm, warm_fed = fed[f"{mode}/reuse"]
    assert warm == cold  # prompt ids, output ids, log-probabilities (exact floats), texts
    assert all(len(c[1]) > 0 for c in cold)
    # the reuse really happened: far fewer prompt tokens were evaluated
    assert cold_fed == sum(len(c[0]) for c in cold)
    assert warm_fed < 0.7 * cold_fed, (warm_fed, cold_fed)
