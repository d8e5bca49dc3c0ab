"""export_lora_gguf: a PEFT LoRA adapter decoded by llama.cpp gives transformers' log-probs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tapekit import Prompt
from tapekit.llm.base import LLMError
from tests.conftest import needs_local_model

needs_gguf = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("numpy") is None,
    reason="needs the transformers extra (gguf, numpy)",
)


@needs_gguf
def test_rotary_rows_interleave_the_halves_of_each_head() -> None:
    import numpy as np

    from tapekit.llm.gguf_lora import _rotary_rows

    rows = np.arange(8, dtype=np.float32).reshape(8, 1)  # 2 heads of 4 rows: halves (0,1 | 2,3)
    assert _rotary_rows(rows, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    with pytest.raises(ValueError, match="rotary heads"):
        _rotary_rows(np.zeros((6, 1)), 2)


@needs_gguf
def test_tensors_are_named_for_gguf_and_bad_adapters_are_refused() -> None:
    import numpy as np

    from tapekit.llm.gguf_lora import GGUFBase, _alpha, lora_gguf_tensors

    base = GGUFBase("llama", n_blocks=2, n_head=2, n_head_kv=1)
    a, b = np.ones((4, 8), np.float32), np.arange(16, dtype=np.float32).reshape(4, 4)
    prefix = "base_model.model.model.layers.1"
    state = {
        f"{prefix}.self_attn.k_proj.lora_A.weight": a,
        f"{prefix}.self_attn.k_proj.lora_B.weight": b,  # 1 kv head of 4 rows
        f"{prefix}.mlp.down_proj.lora_A.weight": a,
        f"{prefix}.mlp.down_proj.lora_B.weight": b,
    }
    out = lora_gguf_tensors(state, base)
    assert sorted(out) == [
        "blk.1.attn_k.weight.lora_a",
        "blk.1.attn_k.weight.lora_b",
        "blk.1.ffn_down.weight.lora_a",
        "blk.1.ffn_down.weight.lora_b",
    ]
    assert out["blk.1.ffn_down.weight.lora_b"].tolist() == b.tolist()  # only q/k rows move
    assert out["blk.1.attn_k.weight.lora_b"][:, 0].tolist() == [0, 8, 4, 12]
    with pytest.raises(ValueError, match="only one of"):
        lora_gguf_tensors({f"{prefix}.mlp.up_proj.lora_A.weight": a}, base)
    with pytest.raises(ValueError, match="plain LoRA"):
        lora_gguf_tensors({"base_model.model.model.embed_tokens.lora_embedding_A": a}, base)
    with pytest.raises(ValueError, match="no block tensor"):
        lora_gguf_tensors({"base_model.model.lm_head.lora_A.weight": a}, base)
    with pytest.raises(ValueError, match="rank"):
        lora_gguf_tensors({**state, f"{prefix}.mlp.down_proj.lora_A.weight": np.ones((3, 8))}, base)
    with pytest.raises(ValueError, match="no LoRA weights"):
        lora_gguf_tensors({}, base)
    assert _alpha({"r": 16, "lora_alpha": 32}) == 32
    assert _alpha({"r": 16, "lora_alpha": 32, "use_rslora": True}) == 128  # 32/sqrt(16) == 128/16
    with pytest.raises(ValueError, match="DoRA"):
        _alpha({"r": 16, "lora_alpha": 32, "use_dora": True})
    with pytest.raises(ValueError, match="per-module"):
        _alpha({"r": 16, "lora_alpha": 32, "rank_pattern": {"q_proj": 4}})


@needs_gguf
def test_export_refuses_what_is_not_an_adapter(tmp_path: Path) -> None:
    from tapekit.llm.gguf_lora import export_lora_gguf

    with pytest.raises(ValueError, match="no GGUF file"):
        export_lora_gguf(tmp_path, tmp_path / "missing.gguf", tmp_path / "out.gguf")


def _logprobs(model: Any, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    import torch

    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(output_ids)), torch.tensor(output_ids)].tolist()


@needs_local_model
@needs_gguf
def test_llamacpp_with_the_exported_adapter_matches_transformers(tmp_path: Path) -> None:
    """A random (non-zero) adapter moves SmolLM2's log-probs by more than a nat per token; with
    the converted file llama.cpp's log-probs of its own greedy tokens stay within the same small
    gap that the base model alone shows (Q4_1 arithmetic), both from a saved adapter and from a
    live PEFT model."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tapekit.llm.gguf_lora import export_lora_gguf
    from tapekit.llm.llamacpp import LlamaCppLLM, smollm2_path
    from tapekit.llm.transformers import TransformersLLM

    torch.manual_seed(0)
    model, _ = TransformersLLM(device="cpu").load()  # de-quantised, plain (trainable)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    peft = get_peft_model(model, lora).eval()
    peft.save_pretrained(tmp_path / "adapter")
    saved = export_lora_gguf(tmp_path / "adapter", smollm2_path(), tmp_path / "saved.gguf")
    live = export_lora_gguf(peft, smollm2_path(), tmp_path / "live.gguf")
    assert saved.read_bytes() == live.read_bytes()
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 8

    prompt = Prompt(
        messages=[
            {"role": "user", "content": "Name three colours of the rainbow and say why the sky is blue."}
        ]
    )
    for path in (None, str(saved)):
        llm = LlamaCppLLM(lora_path=path, n_threads=2, parameters={"temperature": 0.0, "max_tokens": 24})
        trace = [e for e in llm.stream(prompt) if e.output is not None][-1].tokens
        assert trace is not None and trace.output_logprobs is not None and len(trace.output_ids) >= 5
        with_adapter = _logprobs(peft, trace.prompt_ids, trace.output_ids)
        with peft.disable_adapter():
            without = _logprobs(peft, trace.prompt_ids, trace.output_ids)
        mine, other = (with_adapter, without) if path else (without, with_adapter)
        gap = sum(abs(x - y) for x, y in zip(trace.output_logprobs, mine, strict=True)) / len(mine)
        moved = sum(abs(x - y) for x, y in zip(trace.output_logprobs, other, strict=True)) / len(mine)
        assert gap < 0.15, (path, gap)  # measured: 0.05 without the adapter, 0.06 with it
        assert moved > 0.5, (path, moved)  # measured: 1.4 and 1.35 nats per token

    with pytest.raises(LLMError, match="no LoRA adapter file"):
        LlamaCppLLM(lora_path=str(tmp_path / "missing.gguf")).load()
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(LLMError, match="could not load the LoRA adapter"):
        LlamaCppLLM(lora_path=str(tmp_path / "junk.gguf")).load()


@needs_local_model
@needs_gguf
def test_a_full_fine_tune_exported_to_gguf_decodes_with_its_own_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every block matrix of SmolLM2 perturbed (as a full fine-tune changes them), written as a
    whole GGUF model: llama.cpp's log-probs of its greedy tokens match the perturbed model's and
    sit far from the base model's, from a live model and from a saved directory alike; the
    tokenizer and chat template come from the base file. Measured at this perturbation (0.1 of
    each matrix's std): f16 0.001 nats/token from transformers, q8_0 0.059, both 0.58 from the
    base model (a stronger perturbation makes the model chaotic: q8_0's activation rounding
    then grows to nats)."""
    import copy

    import torch

    from tapekit.llm import export_model_gguf
    from tapekit.llm.llamacpp import LlamaCppLLM, smollm2_path
    from tapekit.llm.transformers import TransformersLLM

    torch.manual_seed(0)
    base_model, _ = TransformersLLM(device="cpu").load()
    model = copy.deepcopy(base_model)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.ndim == 2 and "embed" not in name:
                weight.add_(torch.randn_like(weight) * weight.std() * 0.1)
    live = export_model_gguf(model, smollm2_path(), tmp_path / "live.gguf", quantization="f16")
    model.save_pretrained(tmp_path / "saved")
    import gguf

    parsed: list[str] = []
    real_reader = gguf.GGUFReader

    def counting_reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(str(path))
        return real_reader(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting_reader)
    saved = export_model_gguf(tmp_path / "saved", smollm2_path(), tmp_path / "saved.gguf", quantization="f16")
    assert live.read_bytes() == saved.read_bytes()
    q8 = export_model_gguf(model, smollm2_path(), tmp_path / "q8.gguf")  # the default, q8_0
    assert parsed == []  # the base file's metadata is parsed once (seconds), not at every export
    monkeypatch.undo()
    assert q8.stat().st_size < 0.6 * live.stat().st_size

    prompt = Prompt(messages=[{"role": "user", "content": "Name three colours of the rainbow."}])
    for path, limit in ((live, 0.02), (q8, 0.15)):
        llm = LlamaCppLLM(model_path=str(path), parameters={"temperature": 0.0, "max_tokens": 16})
        trace = [e for e in llm.stream(prompt) if e.output is not None][-1].tokens
        assert trace is not None and trace.output_logprobs is not None and len(trace.output_ids) >= 5
        mine = _logprobs(model, trace.prompt_ids, trace.output_ids)
        other = _logprobs(base_model, trace.prompt_ids, trace.output_ids)
        gap = sum(abs(x - y) for x, y in zip(trace.output_logprobs, mine, strict=True)) / len(mine)
        moved = sum(abs(x - y) for x, y in zip(trace.output_logprobs, other, strict=True)) / len(mine)
        assert gap < limit, (path.name, gap)
        assert moved > 0.4, (path.name, moved)

    with pytest.raises(ValueError, match="not a saved model directory"):
        export_model_gguf(tmp_path / "nothing", smollm2_path(), tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="quantization"):
        export_model_gguf(model, smollm2_path(), tmp_path / "x.gguf", quantization="q2")  # type: ignore[arg-type]
