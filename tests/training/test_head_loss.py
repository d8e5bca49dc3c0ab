"""The labelled-positions LM-head loss equals the model's own loss (value and gradients), for
padded batches, packed rows and a LoRA-wrapped model; other architectures fall back."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tapekit.training._head_loss import labelled_loss, plain_head_parts
from tests.training.train_helpers import make_model, sum_rows, with_lora


def padded_batch(tokenizer: Any, n: int = 6) -> dict[str, torch.Tensor]:
    rows = sum_rows(tokenizer, n)
    width = max(len(r["input_ids"]) for r in rows) + 2  # at least two pads on every row
    ids = torch.full((n, width), tokenizer.pad_token_id)
    labels = torch.full((n, width), -100)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        k = len(r["input_ids"])
        ids[i, :k] = torch.tensor(r["input_ids"])
        pairs = zip(r["input_ids"], r["loss_mask"], strict=True)
        labels[i, :k] = torch.tensor([t if m else -100 for t, m in pairs])
        mask[i, :k] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def packed_batch(tokenizer: Any) -> dict[str, torch.Tensor]:
    """Three samples in one row, position ids restarting at 0 for each, no attention mask."""
    rows = sum_rows(tokenizer, 3)
    ids = [t for r in rows for t in r["input_ids"]]
    labels = [t if m else -100 for r in rows for t, m in zip(r["input_ids"], r["loss_mask"], strict=True)]
    positions = [p for r in rows for p in range(len(r["input_ids"]))]
    return {
        "input_ids": torch.tensor([ids]),
        "labels": torch.tensor([labels]),
        "position_ids": torch.tensor([positions]),
    }


def grads(model: Any) -> dict[str, torch.Tensor]:
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out


def assert_same_loss_and_grads(model: Any, batch: dict[str, torch.Tensor], num_items: Any = None) -> None:
    own = model(**batch, use_cache=False, num_items_in_batch=num_items).loss
    own.backward()
    expected = grads(model)
    mine = labelled_loss(model, batch, num_items)
    assert mine is not None
    mine.backward()
    got = grads(model)
    assert mine.item() == pytest.approx(own.item(), rel=1e-5)
    assert expected.keys() == got.keys() and expected
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_padded_batch_same_loss_and_gradients() -> None:
    model, tok = make_model()
    batch = padded_batch(tok)
    assert_same_loss_and_grads(model, batch)
    # the Trainer's reduction: the sum over the accumulated batch's labelled tokens
    assert_same_loss_and_grads(model, batch, num_items=torch.tensor(57))


def test_packed_rows_same_loss_and_gradients() -> None:
    model, tok = make_model()
    batch = packed_batch(tok)
    assert_same_loss_and_grads(model, batch)
    # the position ids keep the samples apart: without them the loss differs
    crossed = labelled_loss(model, {k: v for k, v in batch.items() if k != "position_ids"})
    assert abs(crossed.item() - labelled_loss(model, batch).item()) > 1e-4


def test_lora_model_trains_only_the_adapter_with_the_same_loss() -> None:
    model, tok = make_model()
    wrapped = with_lora(model)
    assert_same_loss_and_grads(wrapped, padded_batch(tok))
    assert all("lora_" in n for n, p in wrapped.named_parameters() if p.requires_grad)


def test_other_architectures_fall_back() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=32))
    assert plain_head_parts(gpt2) is None
    batch = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[1, 2, 3]])}
    assert labelled_loss(gpt2, batch) is None
    model, _ = make_model()
    model.config.logit_scale = 0.5  # a scaled head is not a plain head
    assert plain_head_parts(model) is None


def rl_rows(tokenizer: Any) -> list[dict[str, Any]]:
    """Two groups of two rollouts (rewards 1/0) with sampling log-probs a little off-policy."""
    rows = []
    for i, row in enumerate(sum_rows(tokenizer, 4)):
        n = len(row["input_ids"])
        rows.append(
            {
                **row,
                "tape_id": f"t{i}",
                "task_id": f"task{i // 2}",
                "logprobs": [(-0.5 - 0.1 * k) if m else 0.0 for k, m in enumerate(row["loss_mask"])],
                "has_logprobs": True,
                "reward": float(i % 2),
            }
        )
        assert len(rows[-1]["logprobs"]) == n
    return rows


def test_rl_step_same_with_the_labelled_head() -> None:
    import copy

    from tapekit.training._head_loss import masked_token_logprobs
    from tapekit.training.rl import RLConfig, grpo_step, make_rl_batch, token_logprobs

    model, tok = make_model()
    batch = make_rl_batch(rl_rows(tok), RLConfig())
    full = token_logprobs(
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch.input_ids, 0.7
    )
    mine = masked_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, 0.7)
    on = batch.loss_mask.bool()
    torch.testing.assert_close(mine[on], full[on])
    assert (mine[~on] == 0).all() and on.sum() > 0

    # one GRPO step (with a KL term) through the labelled head and through the full logits
    # (a logit_scale the Llama forward ignores switches the labelled head off)
    results = []
    for plain in (True, False):
        policy, ref = copy.deepcopy(model), copy.deepcopy(model)
        if not plain:
            policy.config.logit_scale = ref.config.logit_scale = 2.0
            assert plain_head_parts(policy) is None
        cfg = RLConfig(kl_coef=0.1, temperature=0.7)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
        stats = grpo_step(policy, optimizer, make_rl_batch(rl_rows(tok), cfg), cfg, ref_model=ref)
        results.append((stats, dict(policy.named_parameters())))
    (a, wa), (b, wb) = results
    assert a.loss == pytest.approx(b.loss, rel=1e-5) and a.clip_fraction == b.clip_fraction
    assert a.loss != 0.0
    for name, p in wa.items():
        torch.testing.assert_close(p, wb[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_wrapped_model_keeps_its_own_forward() -> None:
    """A DDP-style wrapper (``.module``) syncs gradients in its forward: no labelled head."""
    model, _ = make_model()

    class Wrapper(torch.nn.Module):
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

    assert plain_head_parts(model) is not None
    assert plain_head_parts(Wrapper(model)) is None
