"""TransformersLLM loads the embedded SmolLM2 GGUF too: the same model is runnable and trainable."""

from __future__ import annotations

import importlib.util

import pytest

from tapekit import LLMOutput, Prompt
from tapekit.llm.llamacpp import LlamaCppLLM
from tests.conftest import HAVE_LOCAL_MODEL

HAVE_TRANSFORMERS = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "accelerate", "gguf"))
pytestmark = pytest.mark.skipif(
    not (HAVE_LOCAL_MODEL and HAVE_TRANSFORMERS),
    reason="needs torch, transformers, accelerate, gguf and the embedded model (scripts/install-local.sh)",
)

QUESTION = Prompt(
    messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
)


@pytest.fixture(scope="module")
def llm() -> object:
    from tapekit.llm.transformers import TransformersLLM

    model = TransformersLLM(device="cpu", parameters={"max_new_tokens": 20, "do_sample": False})
    model.load()
    return model


def test_loads_the_embedded_gguf_and_answers_like_llama_cpp(llm: object) -> None:
    from tapekit.llm.transformers import TransformersLLM

    assert isinstance(llm, TransformersLLM)
    model, _ = llm.load()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    events = list(llm.stream(QUESTION))
    chunks = [e.chunk for e in events if e.chunk]
    final = events[-1]
    assert final.output is not None and final.output.content == "".join(chunks)
    assert "Paris" in (final.output.content or "")
    reference = LlamaCppLLM(parameters={"temperature": 0.0, "max_tokens": 20}).generate(QUESTION)
    assert "Paris" in (reference.content or "")
    assert final.output_tokens and final.prompt_tokens and final.prompt_tokens > 10


def test_training_text_matches_the_runtime_models_chat_template(llm: object) -> None:
    from tapekit.llm.transformers import TransformersLLM

    assert isinstance(llm, TransformersLLM)
    output = LLMOutput(content="Paris is the capital.")
    mine = llm.make_training_text(QUESTION, output)
    runtime = LlamaCppLLM().make_training_text(QUESTION, output)
    assert mine.text == runtime.text and mine.n_predicted == runtime.n_predicted
    assert mine.output_text == "Paris is the capital.<|im_end|>"
    assert llm.count_tokens(mine.prompt_text) == LlamaCppLLM().count_tokens(runtime.prompt_text)
