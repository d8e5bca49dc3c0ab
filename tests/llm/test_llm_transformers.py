"""TransformersLLM loads the embedded SmolLM2 GGUF too: the same model is runnable and trainable."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
def gguf_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A GGUF cache of this module's own, empty at first: the first load converts the file."""
    folder = tmp_path_factory.mktemp("gguf-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TAPEKIT_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def llm(gguf_cache: Path) -> object:
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
    # dequantized tensors, not a quantized model: full fine-tuning and save_pretrained work
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    assert "quantization_config" not in model.config.to_dict()
    events = list(llm.stream(QUESTION))
    chunks = [e.chunk for e in events if e.chunk]
    final = events[-1]
    assert final.output is not None and final.output.content == "".join(chunks)
    assert "Paris" in (final.output.content or "")
    reference = LlamaCppLLM(parameters={"temperature": 0.0, "max_tokens": 20}).generate(QUESTION)
    assert "Paris" in (reference.content or "")
    assert final.output_tokens and final.prompt_tokens and final.prompt_tokens > 10


def test_the_gguf_is_converted_once_then_read_from_the_cache(
    llm: object, gguf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import transformers

    from tapekit.llm._gguf_cache import DONE, entry_for
    from tapekit.llm.llamacpp import smollm2_path
    from tapekit.llm.transformers import TransformersLLM

    assert isinstance(llm, TransformersLLM)
    entry = entry_for(smollm2_path())
    assert entry.parent == gguf_cache / "gguf" and (entry / DONE).is_file()  # the first load wrote it
    assert (entry / "model.safetensors").is_file() and (entry / "tokenizer.json").is_file()
    calls: list[dict[str, Any]] = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    again = TransformersLLM(device="cpu", parameters={"max_new_tokens": 20, "do_sample": False})
    model, tokenizer = again.load()
    assert len(calls) == 1 and "gguf_file" not in calls[0]  # read from the entry, not the GGUF file
    first, first_tokenizer = llm.load()
    mine, theirs = model.state_dict(), first.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    text = "Prix: 12,50 € — ünïcode <|im_end|>"
    assert tokenizer(text)["input_ids"] == first_tokenizer(text)["input_ids"]
    assert again.make_training_text(QUESTION, LLMOutput(content="Paris.")) == llm.make_training_text(
        QUESTION, LLMOutput(content="Paris.")
    )
    assert again.generate(QUESTION).content == llm.generate(QUESTION).content


class _Saves:
    """A stand-in model or tokenizer: save_pretrained writes one file."""

    def __init__(self, name: str) -> None:
        self.name = name

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / self.name).write_text("x")


def test_the_cache_keys_on_the_file_and_never_stands_in_the_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    from tapekit.llm._gguf_cache import DONE, cached_checkpoint, entry_for

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF v1")
    monkeypatch.setenv("TAPEKIT_CACHE_DIR", str(tmp_path / "cache"))
    converted: list[int] = []

    def convert() -> tuple[Any, Any]:
        converted.append(1)
        return _Saves("model.safetensors"), _Saves("tokenizer.json")

    entry = cached_checkpoint(gguf, convert)
    assert entry == entry_for(gguf) and entry is not None and (entry / DONE).is_file()
    assert sorted(p.name for p in entry.iterdir()) == sorted([DONE, "model.safetensors", "tokenizer.json"])
    assert cached_checkpoint(gguf, convert) == entry and converted == [1]  # converted once
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no scratch folder left
    os.utime(gguf, ns=(0, 10**9))  # the file changed: a new entry
    assert entry_for(gguf) != entry
    half = entry_for(gguf)
    half.mkdir()  # a half-written folder (no DONE) is replaced, not used
    assert cached_checkpoint(gguf, convert) == half and (half / DONE).is_file() and converted == [1, 1]
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("TAPEKIT_CACHE_DIR", str(blocked))
    with caplog.at_level(logging.WARNING):
        assert cached_checkpoint(gguf, convert) is None  # the caller loads the GGUF file itself
    assert converted == [1, 1]  # and it was not converted for nothing first
    assert "not writable" in caplog.text


def test_training_text_matches_the_runtime_models_chat_template(llm: object) -> None:
    from tapekit.llm.transformers import TransformersLLM

    assert isinstance(llm, TransformersLLM)
    output = LLMOutput(content="Paris is the capital.")
    mine = llm.make_training_text(QUESTION, output)
    runtime = LlamaCppLLM().make_training_text(QUESTION, output)
    assert mine.text == runtime.text and mine.n_predicted == runtime.n_predicted
    assert mine.output_text == "Paris is the capital.<|im_end|>"
    assert llm.count_tokens(mine.prompt_text) == LlamaCppLLM().count_tokens(runtime.prompt_text)


def test_greedy_calls_record_the_exact_prompt_and_output_ids(llm: object) -> None:
    from tapekit.llm.transformers import TransformersLLM

    assert isinstance(llm, TransformersLLM)
    final = list(llm.stream(QUESTION))[-1]
    trace = final.tokens
    assert trace is not None and final.output is not None
    assert trace.prompt_ids == llm.prompt_ids(QUESTION)
    assert llm.tokenizer.decode(trace.prompt_ids) == llm.render_prompt(QUESTION)
    assert llm.tokenizer.decode(trace.output_ids, skip_special_tokens=True) == final.output.content
    assert trace.output_logprobs is not None and len(trace.output_logprobs) == len(trace.output_ids)
    assert trace.finish_reason in ("stop", "length") and trace.tokenizer.startswith("tk1-49152-")
    # the same tokenizer seen through llama.cpp has the same fingerprint
    assert trace.tokenizer == LlamaCppLLM().tokenizer_fingerprint()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, llm: object) -> object:
    """A tiny random Llama saved with the SmolLM2 tokenizer: a model directory like training makes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = llm.load()[1]  # type: ignore[attr-defined]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _reference_logprobs(model: object, trace: object, temperature: float = 1.0) -> list[float]:
    import torch

    ids = torch.tensor([trace.prompt_ids + trace.output_ids])  # type: ignore[attr-defined]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature  # type: ignore[operator]
    n = len(trace.prompt_ids)  # type: ignore[attr-defined]
    table = torch.log_softmax(logits[n - 1 : -1], dim=-1)
    return [float(table[i, t]) for i, t in enumerate(trace.output_ids)]  # type: ignore[attr-defined]


def test_model_directory_greedy_logprobs_are_the_models(tiny_dir: object) -> None:
    from tapekit.llm.transformers import TransformersLLM

    llm = TransformersLLM(model_path=str(tiny_dir), device="cpu", max_tokens=6, policy_version="v7")
    trace = list(llm.stream(QUESTION))[-1].tokens
    assert trace is not None and len(trace.output_ids) == 6 and trace.finish_reason == "length"
    assert trace.policy_version == "v7" and trace.output_logprobs is not None
    expected = _reference_logprobs(llm.load()[0], trace)
    assert trace.output_logprobs == pytest.approx(expected, abs=1e-4)


def test_sampling_logprobs_follow_the_sampler_and_the_seed_repeats(tiny_dir: object) -> None:
    from tapekit.llm.transformers import TransformersLLM

    base = TransformersLLM(model_path=str(tiny_dir), device="cpu")
    model, tokenizer = base.load()
    llm = TransformersLLM.from_model(model, tokenizer, temperature=1.7, seed=11, max_tokens=8)
    first, again = (list(llm.stream(QUESTION))[-1].tokens for _ in range(2))
    assert first is not None and first == again  # the seed makes the sample reproducible
    assert first.output_logprobs == pytest.approx(_reference_logprobs(model, first, 1.7), abs=1e-4)
    other = TransformersLLM.from_model(model, tokenizer, temperature=1.7, seed=12, max_tokens=8)
    assert list(other.stream(QUESTION))[-1].tokens != first  # (a random tiny model: 49k choices each)


def test_peft_adapter_directory_loads_on_top_of_the_base(tiny_dir: object, tmp_path: object) -> None:
    from peft import LoraConfig, get_peft_model

    from tapekit.llm.transformers import TransformersLLM

    base = TransformersLLM(model_path=str(tiny_dir), device="cpu", max_tokens=6)
    model, tokenizer = base.load()
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    tuned = get_peft_model(model, lora)
    tuned.save_pretrained(tmp_path)
    in_memory = list(TransformersLLM.from_model(tuned, tokenizer, max_tokens=6).stream(QUESTION))[-1].tokens
    loaded = TransformersLLM(model_path=str(tiny_dir), adapter_path=str(tmp_path), device="cpu", max_tokens=6)
    from_disk = list(loaded.stream(QUESTION))[-1].tokens
    assert type(loaded.load()[0]).__name__.startswith("PeftModel")
    assert from_disk is not None and in_memory is not None
    assert from_disk.output_ids == in_memory.output_ids
    assert from_disk.output_logprobs == pytest.approx(in_memory.output_logprobs, abs=1e-4)


def test_missing_model_or_adapter_directory_is_named(tmp_path: object) -> None:
    from tapekit.llm.base import LLMError
    from tapekit.llm.transformers import TransformersLLM

    with pytest.raises(LLMError, match="model_path '/nonexistent/model' is not a directory"):
        TransformersLLM(model_path="/nonexistent/model").load()


# ------------------------------------------------------------------ answers held to a JSON schema

SCHEMA_PROMPT_TEXT = 'Goal: Click on the "Ok" button.\nPage:\n[12] text "x"\n[14] button "Ok"'


def _check_answer(text: str, bids: list[str]) -> None:
    import json
    import re

    from tapekit.web.agent import answer_schema

    schema = answer_schema(bids)
    data = json.loads(text)  # the whole answer is one JSON object, nothing after it
    assert set(data) == {"thought", "action"}
    assert re.fullmatch(schema["properties"]["action"]["pattern"], data["action"]), data["action"]
    assert re.fullmatch(schema["properties"]["thought"]["pattern"], data["thought"]), data["thought"]
    layouts = [json.dumps(d, ensure_ascii=False) for d in (data, dict(reversed(list(data.items()))))]
    assert text in layouts  # json.dumps's separators, no other whitespace


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_random_model_held_to_a_schema_writes_only_valid_answers(
    tiny_dir: object, temperature: float
) -> None:
    """A random tiny model would write noise; under the page schema every answer is one JSON
    object in json.dumps's layout whose action names a bid of the page, and the recorded
    log-probabilities are the model's own (temperature-scaled, before the mask)."""
    from tapekit.llm.transformers import TransformersLLM
    from tapekit.web.agent import answer_schema

    bids = ["12", "14"]
    prompt = Prompt(
        messages=[{"role": "user", "content": SCHEMA_PROMPT_TEXT}], response_schema=answer_schema(bids)
    )
    for seed in range(3):
        llm = TransformersLLM(
            model_path=str(tiny_dir), device="cpu", temperature=temperature, seed=seed, max_tokens=120
        )
        final = list(llm.stream(prompt))[-1]
        assert final.output is not None and final.tokens is not None
        _check_answer(final.output.content or "", bids)
        assert final.tokens.finish_reason == "stop"
        reference = _reference_logprobs(llm.load()[0], final.tokens, temperature or 1.0)
        assert final.tokens.output_logprobs == pytest.approx(reference, abs=1e-4)


def test_batched_rows_with_and_without_a_schema_decode_together(tiny_dir: object) -> None:
    """One batched generate: constrained rows are held to their own schema (different bids),
    the free row is not constrained at all, and sampled log-probs are the model's."""
    import asyncio

    from tapekit.llm.batched import BatchedTransformersLLM
    from tapekit.web.agent import answer_schema

    llm = BatchedTransformersLLM(model_path=str(tiny_dir), device="cpu", temperature=0.8, max_tokens=120)
    pages = [["12", "14"], ["3", "40", "41"]]
    prompts = [
        Prompt(
            messages=[{"role": "user", "content": f"{SCHEMA_PROMPT_TEXT} {i}"}],
            response_schema=answer_schema(b),
        )
        for i, b in enumerate(pages)
    ]
    free = Prompt(messages=[{"role": "user", "content": SCHEMA_PROMPT_TEXT}])

    async def run() -> list[object]:
        async def one(p: Prompt) -> object:
            events = [e async for e in llm.astream(p)]
            return events[-1]

        return list(await asyncio.gather(*(one(p) for p in [*prompts, free])))

    finals = asyncio.run(run())
    assert llm.batcher.stats.largest_batch == 3  # one generate for the three rows
    for final, bids in zip(finals[:2], pages, strict=True):
        _check_answer(final.output.content or "", bids)  # type: ignore[attr-defined]
        reference = _reference_logprobs(llm.load()[0], final.tokens, 0.8)  # type: ignore[attr-defined]
        assert final.tokens.output_logprobs == pytest.approx(reference, abs=1e-4)  # type: ignore[attr-defined]
    free_text = finals[2].output.content or ""  # type: ignore[attr-defined]
    assert not free_text.startswith('{"')  # a random model left alone writes no JSON answer


def test_a_schema_that_cannot_be_compiled_is_named(tiny_dir: object) -> None:
    from tapekit.llm.base import LLMError
    from tapekit.llm.transformers import TransformersLLM

    llm = TransformersLLM(model_path=str(tiny_dir), device="cpu", max_tokens=5)
    bad = Prompt(messages=[{"role": "user", "content": "hi"}], response_schema={"type": "strnig"})
    with pytest.raises(LLMError, match="response_schema cannot be compiled"):
        list(llm.stream(bad))
