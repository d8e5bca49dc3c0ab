"""GRPO log-probs with each shared prompt run once equal the unshared pass's (values and
gradients), for full and LoRA models; rows that share nothing, or other architectures, fall back."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tapekit.training._head_loss import masked_token_logprobs
from tapekit.training.rl import RLConfig, grpo_step, make_rl_batch
from tapekit.training.rl._shared_prefix import prefix_groups, shared_prefix_logprobs
from tests.training.train_helpers import make_model, with_lora


def test_prefix_groups_pairs_rows_by_their_tokens_before_the_first_trained_one() -> None:
    rows = [[1, 2, 3, 7], [1, 2, 3, 8, 9], [1, 2, 4, 7], [1, 2, 3], [5, 6], [1, 2, 3, 7, 7]]
    first = [3, 3, 3, 0, 1, 3]  # row 3 has no trained token; row 4's prefix is [5]
    assert prefix_groups(rows, first) == [(3, [0, 1, 5]), (3, [2]), (1, [4])]
    # the same tokens cut at another point are another prefix
    assert prefix_groups([[1, 2, 3], [1, 2, 3]], [1, 2]) == [(1, [0]), (2, [1])]
    with pytest.raises(ValueError):
        prefix_groups([[1, 2]], [1, 1])


def group_rows(tokenizer: Any) -> list[dict[str, Any]]:
    """Two groups of rollouts of one prompt each (answers of different lengths, one with a hole
    in its trained tokens, one a single token), a row of another prompt, and a row with no
    trained token at all."""
    prompts = [tokenizer("12+7=")["input_ids"], tokenizer("3+4=")["input_ids"]]
    answers = [[5, 6, 7], [9], [1, 2, 3, 4, 5, 6], [8, 8], [3, 1, 4]]
    rows = []
    for i, answer in enumerate(answers):
        prompt = prompts[0] if i < 3 else prompts[1]
        mask = [0] * len(prompt) + [1] * len(answer)
        if i == 2:
            mask[len(prompt) + 2] = 0
        rows.append((prompt + answer, mask))
    rows.append(([*prompts[0][:2], 4, 4], [0, 0, 1, 1]))
    rows.append((prompts[1] + [2, 2], [0] * (len(prompts[1]) + 2)))
    out = []
    for i, (ids, mask) in enumerate(rows):
        out.append({
            "input_ids": ids, "loss_mask": mask, "tape_id": f"t{i}", "task_id": f"task{i // 3}",
            "logprobs": [-0.4 - 0.05 * k if m else 0.0 for k, m in enumerate(mask)],
            "has_logprobs": True, "reward": float(i % 2),
        })  # fmt: skip
    return out


def _assert_same_logprobs_and_grads(model: Any, tokenizer: Any) -> None:
    batch = make_rl_batch(group_rows(tokenizer), RLConfig())
    args = (batch.input_ids, batch.attention_mask, batch.loss_mask, 0.7)
    weights = torch.randn(batch.input_ids.shape)
    params = [p for p in model.parameters() if p.requires_grad]
    plain = masked_token_logprobs(model, *args)
    plain_grads = torch.autograd.grad((plain * weights).sum(), params)
    shared = shared_prefix_logprobs(model, *args)
    assert shared is not None
    shared_grads = torch.autograd.grad((shared * weights).sum(), params)
    on = batch.loss_mask.bool()
    assert on.sum() > 10
    torch.testing.assert_close(shared[on], plain[on], rtol=1e-5, atol=1e-5)
    assert (shared[~on] == 0).all()
    for a, b in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)  # summed in another order
    assert any(g.abs().sum() > 0 for g in shared_grads)


def test_shared_prefix_logprobs_and_gradients_equal_the_unshared_pass() -> None:
    model, tok = make_model()
    _assert_same_logprobs_and_grads(model, tok)


def test_shared_prefix_with_a_lora_model() -> None:
    model, tok = make_model()
    wrapped = with_lora(model)
    _assert_same_logprobs_and_grads(wrapped, tok)


def test_nothing_shared_or_another_architecture_falls_back() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model, tok = make_model()
    rows = group_rows(tok)
    distinct = make_rl_batch([rows[0], rows[3]], RLConfig())  # two prompts, one row each
    args = (distinct.input_ids, distinct.attention_mask, distinct.loss_mask)
    assert shared_prefix_logprobs(model, *args) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=200, n_positions=64))
    batch = make_rl_batch(rows, RLConfig())
    assert shared_prefix_logprobs(gpt2, batch.input_ids, batch.attention_mask, batch.loss_mask) is None
    with pytest.raises(ValueError, match="temperature"):
        shared_prefix_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask, 0.0)


def test_a_grpo_step_with_and_without_sharing_moves_the_weights_alike() -> None:
    model, tok = make_model()
    results = []
    for share in (True, False):
        policy = copy.deepcopy(model)
        cfg = RLConfig(temperature=0.7, share_prefix=share, micro_batch_size=4)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
        stats = grpo_step(policy, optimizer, make_rl_batch(group_rows(tok), cfg), cfg)
        results.append((stats, dict(policy.named_parameters())))
    (a, wa), (b, wb) = results
    assert a.loss != 0.0 and a.loss == pytest.approx(b.loss, rel=1e-5)
    assert a.clip_fraction == b.clip_fraction and a.tokens == b.tokens
    moved = 0
    for name, p in wa.items():
        torch.testing.assert_close(p, wb[name], rtol=1e-3, atol=1e-4, msg=name)
        moved += int(not torch.equal(p, dict(model.named_parameters())[name]))
    assert moved > 0


def test_a_common_system_prompt_runs_once_per_micro_batch_with_the_same_logprobs_and_grads() -> None:
    from tapekit.training.rl._shared_prefix import COMMON_MIN

    model, tok = make_model()
    system = tok("You add numbers. Answer with the sum, nothing else, please, now.")["input_ids"]
    assert len(system) >= COMMON_MIN
    rows = []
    for i, question in enumerate(["12+7=", "3+4=", "5+5=", "3+4="]):  # distinct pages, one repeated
        prompt = system + tok(question)["input_ids"]
        answer = [5 + i, 6, 7][: 1 + i % 3]
        mask = [0] * len(prompt) + [1] * len(answer)
        rows.append({
            "input_ids": prompt + answer, "loss_mask": mask, "tape_id": f"t{i}", "task_id": f"task{i}",
            "logprobs": [-0.5 if m else 0.0 for m in mask], "has_logprobs": True, "reward": float(i % 2),
        })  # fmt: skip
    batch = make_rl_batch(rows, RLConfig())
    args = (batch.input_ids, batch.attention_mask, batch.loss_mask, 0.7)
    seen: list[tuple[int, ...]] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    params = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(batch.input_ids.shape)
    try:
        shared = shared_prefix_logprobs(model, *args)
    finally:
        hook.remove()
    assert shared is not None
    assert seen[0][0] == 1 and seen[0][1] >= len(system)  # the common prefix, once, one row
    assert sum(n for _, n in seen) < int(batch.attention_mask.sum())  # fewer positions than the rows' tokens
    plain = masked_token_logprobs(model, *args)
    on = batch.loss_mask.bool()
    torch.testing.assert_close(shared[on], plain[on], rtol=1e-5, atol=1e-5)
    shared_grads = torch.autograd.grad((shared * weights).sum(), params)
    plain_grads = torch.autograd.grad((plain * weights).sum(), params)
    for a, b in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_micro_batches_keep_each_prefix_together_and_fill_the_room_with_single_rows() -> None:
    from tapekit.training.rl._shared_prefix import micro_batches

    a, b = [1, 2, 3], [4, 5, 6]
    # prefix a: rows 0, 3, 6; b: 2, 5; single rows 1, 4, 7; row 8 trains nothing
    rows = [[*a, 7], [9, 9], [*b, 8], [*a, 8], [3, 3], [*b, 9], [*a, 9], [2, 2], [5, 5]]
    first = [3, 1, 3, 3, 1, 3, 3, 1, 0]
    assert micro_batches(rows, first, 4) == [[0, 3, 6, 1], [2, 5, 4, 7], [8]]
    assert micro_batches(rows, first, 2) == [[0, 3], [6, 1], [2, 5], [4, 7], [8]]  # a group cut at the size
    with pytest.raises(ValueError, match="size must be > 0"):
        micro_batches(rows, first, 0)


def test_a_grpo_step_puts_attempts_whose_turns_lie_apart_in_one_micro_batch() -> None:
    # two attempts at each of two pages, each attempt's second turn between them (as a
    # multi-turn episode's rows come): in row order no micro-batch of 2 holds a page's pair;
    # the step reorders, shares each pair's prompt and moves the weights as the plain pass
    from tapekit.training.rl._step import _micro_batched

    model, tok = make_model()
    page = {p: tok(p)["input_ids"] for p in ("12+7=", "3+4=", "9+9=", "5+1=")}
    order = ["12+7=", "9+9=", "3+4=", "5+1=", "12+7=", "3+4="]  # 9+9 and 5+1: the second turns
    rows = []
    for i, p in enumerate(order):
        answer = [5 + i, 6]
        mask = [0] * len(page[p]) + [1] * len(answer)
        rows.append({
            "input_ids": page[p] + answer, "loss_mask": mask, "tape_id": f"t{i}", "task_id": "task",
            "logprobs": [-0.5 if m else 0.0 for m in mask], "has_logprobs": True, "reward": float(i % 2),
        })  # fmt: skip
    cfg = RLConfig(temperature=0.7, share_prefix=True, micro_batch_size=2)
    batch = make_rl_batch(rows, cfg)
    reordered, slices = _micro_batched(batch, cfg)

    def prompts(sl: slice) -> set[tuple[int, ...]]:
        pairs = zip(reordered.input_ids[sl], reordered.loss_mask[sl].bool(), strict=True)
        return {tuple(ids[: int(m.int().argmax())].tolist()) for ids, m in pairs}

    assert [len(prompts(sl)) for sl in slices] == [1, 1, 2]  # each page's pair in one micro-batch
    assert sorted(reordered.advantages.tolist()) == sorted(batch.advantages.tolist())
    with pytest.raises(ValueError, match="not an order"):
        batch.take([0, 0, 1, 2, 3, 4])
    results = []
    for share in (True, False):
        policy = copy.deepcopy(model)
        step_cfg = RLConfig(temperature=0.7, share_prefix=share, micro_batch_size=2)
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
        seen: list[int] = []
        hook = policy.model.register_forward_pre_hook(
            lambda _m, _a, kw, seen=seen: seen.append(int(kw["input_ids"].numel())), with_kwargs=True
        )
        stats = grpo_step(policy, optimizer, make_rl_batch(rows, step_cfg), step_cfg)
        hook.remove()
        results.append((stats, dict(policy.named_parameters()), sum(seen)))
    (a, wa, shared_positions), (b, wb, plain_positions) = results
    assert shared_positions < plain_positions
    assert a.loss != 0.0 and a.loss == pytest.approx(b.loss, rel=1e-5) and a.tokens == b.tokens
    for name, p in wa.items():
        torch.testing.assert_close(p, wb[name], rtol=1e-3, atol=1e-4, msg=name)
