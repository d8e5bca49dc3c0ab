"""RL rollouts through llama.cpp: each version (a LoRA adapter, or the whole fully fine-tuned
model) converted to GGUF and sampled from."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import needs_local_model

pytestmark = [
    pytest.mark.train,
    pytest.mark.slow,
    needs_local_model,
    pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs the train extra"),
]


def _calls(store: Any, step: int) -> list[Any]:
    from tapekit.store import TapeFilter

    calls = []
    for tape_id in store.list_tapes(where=TapeFilter(tag=f"rl:rl:step:{step}")):
        tape = store.get_tape(tape_id)
        for prompt_id in dict.fromkeys(s.metadata.prompt_id for s in tape.steps if s.metadata.prompt_id):
            call = store.get_llm_call(prompt_id)
            if call is not None:
                calls.append(call)
    return calls


def _two_steps(tmp_path: Path, *, threads: int, learning_rate: float, lora: Any) -> Any:
    """Two GRPO steps of 2 toy tasks x 2 attempts, rolled out through llama.cpp."""
    from tapekit.training.rl import RLRunConfig

    return RLRunConfig(
        output_dir=str(tmp_path / "out"),
        steps=2,
        rollouts={
            "tasks_per_step": 2,
            "group_size": 2,
            "max_tokens": 12,
            "max_loops": 2,
            "engine": "llamacpp",
            "threads": threads,
        },
        learning_rate=learning_rate,
        curriculum={"kind": "uniform"},
        lora=lora,
        checkpoint=False,
        seed=3,
    )


def _each_call_records_the_version_that_sampled_it(store: Any) -> None:
    """Steps 0 and 1 each made at least 4 calls, by ``rl-policy`` at that step's version, with
    sampled ids and their log-probs."""
    for step in (0, 1):
        calls = _calls(store, step)
        assert len(calls) >= 4
        for call in calls:
            assert call.model == "rl-policy" and call.tokens.policy_version == str(step)
            assert call.tokens.output_logprobs is not None and call.tokens.output_ids


def _mean_gap(model: Any, weights: dict[str, Any], calls: list[Any]) -> float:
    """Mean |sampling log-prob - ``weights``' log-prob| per sampled token (T = 1)."""
    import torch

    from tapekit.training.rl import token_logprobs

    params = dict(model.named_parameters())
    gaps: list[float] = []
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
        for call in calls:
            prompt, output = call.tokens.prompt_ids, call.tokens.output_ids
            x = torch.tensor([prompt + output])
            mine = token_logprobs(model(input_ids=x).logits, x, 1.0)[0, len(prompt) :]
            gaps += (mine - torch.tensor(call.tokens.output_logprobs)).abs().tolist()
    return sum(gaps) / len(gaps)


def test_rl_samples_each_version_through_llamacpp_with_its_adapter(tmp_path: Path) -> None:
    from tapekit import open_store
    from tapekit.llm import TransformersLLM
    from tapekit.training.callbacks import StepCallback, StepRecord
    from tapekit.training.config import LoraSettings
    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_setup

    model, tokenizer = TransformersLLM(device="cpu", dtype="float32").load()  # de-quantised, plain
    # a large learning rate, so that version 1 samples visibly differently from version 0
    config = _two_steps(tmp_path, threads=2, learning_rate=5e-3, lora=LoraSettings(r=8, alpha=16))
    store = open_store(str(tmp_path / "rollouts.db"))
    versions: dict[int, dict[str, Any]] = {}

    class Snapshot(StepCallback):
        def on_step(self, record: StepRecord) -> bool | None:
            lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
            versions[record.step] = lora
            return None

    result = train_rl(make_setup(), model, tokenizer, config, store=store, callbacks=[Snapshot()])
    assert [r.rollout_version for r in result.history] == [0, 1]
    assert [r.policy_lag for r in result.history] == [0, 0]
    assert any(r.tokens for r in result.history)
    # only the newest adapter file is kept
    assert sorted(p.name for p in (tmp_path / "out" / "adapters").iterdir()) == ["v2.gguf"]

    _each_call_records_the_version_that_sampled_it(store)

    # step 1 was sampled with version 1's adapter: its log-probs are those of the trainer's
    # version-1 weights, up to llama.cpp's Q4_1 arithmetic, and further from version 0's (B = 0)
    # (get_peft_model put the LoRA layers into ``model`` itself)
    calls = _calls(store, 1)
    v1 = _mean_gap(model, versions[1], calls)
    v0 = _mean_gap(model, {n: t.zero_() if "lora_B" in n else t for n, t in versions[1].items()}, calls)
    assert v1 < 0.15, v1
    assert v0 > 2 * v1, (v0, v1)
    store.close()


def test_a_full_fine_tune_samples_each_version_through_llamacpp_as_its_own_model_file(
    tmp_path: Path,
) -> None:
    """No LoRA: each version is written as a whole q8_0 model file; step 1 samples version 1."""
    from tapekit import open_store
    from tapekit.llm import TransformersLLM
    from tapekit.training.callbacks import StepCallback, StepRecord
    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_setup

    model, tokenizer = TransformersLLM(device="cpu", dtype="float32").load()  # de-quantised, plain
    # AdamW moves every weight by about the learning rate: version 1 samples differently
    config = _two_steps(tmp_path, threads=1, learning_rate=1e-4, lora=None)
    assert config.rollouts.gguf_quantization == "q8_0"
    store = open_store(str(tmp_path / "rollouts.db"))
    versions = {0: {n: p.detach().clone() for n, p in model.named_parameters()}}

    class Snapshot(StepCallback):
        def on_step(self, record: StepRecord) -> bool | None:
            versions[record.step] = {n: p.detach().clone() for n, p in model.named_parameters()}  # steps done
            return None

    result = train_rl(make_setup(), model, tokenizer, config, store=store, callbacks=[Snapshot()])
    assert [r.rollout_version for r in result.history] == [0, 1]
    assert any(r.tokens for r in result.history)
    files = sorted((tmp_path / "out" / "adapters").iterdir())
    assert [p.name for p in files] == ["v2.gguf"]  # only the newest model file is kept
    assert files[0].stat().st_size > 100e6  # a whole model (135M weights at ~8.5 bits), not an adapter

    _each_call_records_the_version_that_sampled_it(store)

    # step 1 was sampled from version 1's weights: its log-probs are the trainer's up to q8_0's
    # rounding, and further from version 0's
    calls = _calls(store, 1)
    v1 = _mean_gap(model, versions[1], calls)
    v0 = _mean_gap(model, versions[0], calls)
    assert v1 < 0.1, v1
    assert v0 > 2 * v1, (v0, v1)
    store.close()
