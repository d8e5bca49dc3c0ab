"""Shared fixtures of the training tests: a tiny Llama and tokenizer made locally (nothing is
downloaded) and arithmetic samples in the training schema (prompt masked, answer trained)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl", reason="the training tests need the train extra (trl, peft, datasets)")
pytest.importorskip("torch", reason="the training tests need torch")

from tapekit.testing.tiny import TinyConfig, make_tiny

TINY = TinyConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, seed=0)


def chat(a: int, b: int) -> tuple[str, str]:
    """The prompt and the answer of one sum, in the tiny model's chat format."""
    return f"<|im_start|>user\n{a}+{b}<|im_end|>\n<|im_start|>assistant\n", f"{a + b}<|im_end|>"


def make_model(path: Any = None) -> tuple[Any, Any]:
    """A fresh tiny model and tokenizer (same weights every time), saved to ``path`` if given."""
    texts = ["".join(chat(a, b)) for a in range(12) for b in range(12)]
    return make_tiny(texts, TINY, path=path)


def with_lora(model: Any) -> Any:
    """``model`` wrapped in a rank-4 LoRA adapter on q_proj and v_proj whose B matrices are
    non-zero (a fresh adapter's are zero, which would make its gradients trivial)."""
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    wrapped = get_peft_model(model, config)
    for name, p in wrapped.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return wrapped


def sum_rows(tokenizer: Any, n: int = 40, start: int = 0) -> list[dict[str, Any]]:
    """``n`` samples of the training schema: the prompt masked out, the answer trained."""
    rows = []
    for i in range(start, start + n):
        a, b = i % 12, (i // 12 + i) % 12  # distinct pairs for up to 144 rows
        prompt, answer = chat(a, b)
        p, c = tokenizer(prompt)["input_ids"], tokenizer(answer)["input_ids"]
        rows.append(
            {
                "input_ids": p + c,
                "loss_mask": [0] * len(p) + [1] * len(c),
                "tape_id": f"t{i}",
                "agent": "adder",
                "reward": 1.0,
            }
        )
    return rows
