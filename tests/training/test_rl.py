"""GRPO core on hand-computed toys: group advantages (GRPO and Dr. GRPO), the clipped loss
(gradient sign, clipping, masked tokens, the ratio against the sampler's log-probs), the k3 KL,
aggregations, micro-batching, the step's stats, and a few GRPO steps raising a tiny model's
expected reward. Every expected number below is worked out by hand in the test."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest

from tapekit.training.rl import group_advantages, mean_abs_by_key

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (scripts/install-local.sh)")
LN2 = math.log(2.0)


# ---------------------------------------------------------------- advantages (no torch)


def test_group_advantages_by_hand() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5]
    keys = ["a"] * 4 + ["b"] * 4 + ["c"]
    out = group_advantages(rewards, keys)
    # group a: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3); A = +-0.5 / (sqrt(1/3) + 1e-4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert out.advantages[:4] == pytest.approx([a, -a, -a, a], abs=1e-12)
    assert out.advantages[4:] == [0.0] * 5  # b all equal, c a group of one: no signal
    assert out.zero_groups == ["b", "c"]
    assert out.zero_share == pytest.approx(2 / 3)
    assert out.group_mean_abs == pytest.approx({"a": a, "b": 0.0, "c": 0.0})


def test_dr_grpo_does_not_divide_by_std() -> None:
    out = group_advantages([3.0, 1.0, 2.0], ["g"] * 3, scale_rewards=False)
    assert out.advantages == [1.0, -1.0, 0.0]  # r - mean(r), mean 2
    scaled = group_advantages([3.0, 1.0, 2.0], ["g"] * 3)
    assert scaled.advantages == pytest.approx([1 / (1 + 1e-4), -1 / (1 + 1e-4), 0.0])  # unbiased std = 1


def test_advantage_errors_and_category_means() -> None:
    with pytest.raises(ValueError, match="2 rewards but 1 group keys"):
        group_advantages([1.0, 0.0], ["g"])
    with pytest.raises(ValueError, match=r"reward 1 .*'h'.* nan"):
        group_advantages([1.0, float("nan")], ["g", "h"])
    means = mean_abs_by_key({"t1": 1.0, "t2": 0.0, "t3": 0.5}, {"t1": "easy", "t2": "easy", "t3": "hard"})
    assert means == {"easy": 0.5, "hard": 0.5}
    with pytest.raises(KeyError, match="t9"):
        mean_abs_by_key({"t9": 1.0}, {})


# ---------------------------------------------------------------- the loss on leaf log-probs


@needs_torch
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_clipped_loss_values_and_gradients_by_hand(sign: float) -> None:
    import torch

    from tapekit.training.rl import policy_loss

    # token 0 is masked (prompt); the sampler gave each trained token p = 0.5; the policy now
    # gives 0.5, 1.0, 0.25: ratios 1, 2, 0.5. eps = 0.2, one trained sequence, token mean over 3.
    new = torch.tensor([[math.log(0.9), math.log(0.5), 0.0, math.log(0.25)]], requires_grad=True)
    old = torch.tensor([[0.0, math.log(0.5), math.log(0.5), math.log(0.5)]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    out = policy_loss(new, old, torch.tensor([sign]), mask, clip_low=0.2)
    out.loss.backward()
    assert new.grad is not None
    if sign > 0:
        # -min(rA, clip(r)A): -1, -min(2, 1.2) = -1.2 (clipped), -min(0.5, 0.8) = -0.5
        assert out.loss.item() == pytest.approx((-1 - 1.2 - 0.5) / 3)
        # d/dlogp (-rA) = -rA; the clipped token (r = 2 > 1.2 with A > 0) gives none
        assert new.grad.tolist()[0] == pytest.approx([0.0, -1 / 3, 0.0, -0.5 / 3])
        assert (out.clipped_high, out.clipped_low) == (1.0, 0.0)
    else:
        # -min(-1, -1) = 1; -min(-2, -1.2) = 2 (not clipped: A < 0 and r high); -min(-0.5, -0.8) = 0.8
        assert out.loss.item() == pytest.approx((1 + 2 + 0.8) / 3)
        assert new.grad.tolist()[0] == pytest.approx([0.0, 1 / 3, 2 / 3, 0.0])
        assert (out.clipped_high, out.clipped_low) == (0.0, 1.0)
    assert out.tokens == 3.0
    assert out.ratio_sum == pytest.approx(1 + 2 + 0.5)


@needs_torch
def test_masked_tokens_get_exactly_zero_gradient() -> None:
    import torch

    from tapekit.training.rl import policy_loss

    # masked positions hold nonsense (old log-prob 0.0, the policy at -50: ratio e^-50)
    new = torch.tensor([[-50.0, -0.7, -50.0, -0.2]], requires_grad=True)
    old = torch.tensor([[0.0, -0.7, 0.0, -0.2]])
    mask = torch.tensor([[0, 1, 0, 1]])
    ref = torch.tensor([[3.0, -0.7, 9.0, -0.2]])
    out = policy_loss(new, old, torch.tensor([[2.0, 2.0, -5.0, 2.0]]), mask, ref_logprobs=ref, kl_coef=0.5)
    out.loss.backward()
    assert new.grad is not None
    assert new.grad[0, 0].item() == 0.0 and new.grad[0, 2].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-1.0)  # -rA / 2 tokens = -2 / 2; ratio 1, KL grad 0
    assert out.loss.item() == pytest.approx(-2.0)
    assert out.kl_sum == 0.0


@needs_torch
def test_k3_kl_value_and_gradient_by_hand() -> None:
    import torch

    from tapekit.training.rl import k3_kl, policy_loss

    logp = torch.tensor([[0.0, math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[0.0, math.log(0.25)]])
    # d = ref - logp = -ln 2: exp(d) - d - 1 = 0.5 + ln 2 - 1
    assert k3_kl(logp, ref)[0, 1].item() == pytest.approx(LN2 - 0.5)
    mask = torch.tensor([[0, 1]])
    out = policy_loss(logp, logp.detach(), torch.tensor([0.0]), mask, ref_logprobs=ref, kl_coef=0.1)
    out.loss.backward()
    assert logp.grad is not None
    assert out.loss.item() == pytest.approx(0.1 * (LN2 - 0.5))
    assert out.kl_sum == pytest.approx(LN2 - 0.5)
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp) = 0.5, times 0.1
    assert logp.grad[0, 1].item() == pytest.approx(0.05)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(logp, logp, torch.tensor([1.0]), torch.tensor([[0, 1]]), kl_coef=0.1)


@needs_torch
def test_aggregations_by_hand() -> None:
    import torch

    from tapekit.training.rl import aggregate

    values = torch.tensor([[1.0, 9.0, 0.0, 0.0], [2.0, 4.0, 6.0, 9.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    assert aggregate(values, mask, "token").item() == pytest.approx((1 + 2 + 4 + 6) / 4)
    assert aggregate(values, mask, "sequence").item() == pytest.approx((1 + 4) / 2)  # means 1 and 4
    assert aggregate(values, mask, "constant", max_tokens=8).item() == pytest.approx(13 / (2 * 8))
    assert aggregate(values, mask, "token", total_tokens=13).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(values, mask, "constant")
    with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
        aggregate(values, mask, "mean")  # type: ignore[arg-type]


# ---------------------------------------------------------------- a unigram policy through grpo_step


def _unigram(logits: list[float]) -> Any:
    """A policy giving every position the same next-token logits (so p = softmax(table))."""
    import torch

    class Unigram(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.tensor(logits))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.table.expand(input_ids.shape[0], input_ids.shape[1], -1)

    return Unigram()


def _row(tape: str, token: int, reward: float, logprob: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "tape_id": tape,
        "task_id": extra.pop("task_id", "t"),
        "input_ids": [0, token],
        "loss_mask": [0, 1],
        "logprobs": [0.0, logprob if logprob is not None else 0.0],
        "has_logprobs": logprob is not None,
        "reward": reward,
        **extra,
    }


def _step(rows: list[dict[str, Any]], **config: Any) -> tuple[list[float], Any]:
    """One SGD step (lr 1, no grad clipping) on a unigram policy with p = [0.25, 0.75]."""
    import torch

    from tapekit.training.rl import RLConfig, grpo_step, make_rl_batch

    model = _unigram([0.0, math.log(3.0)])
    cfg = RLConfig(scale_rewards=False, max_grad_norm=0.0, **config)
    stats = grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), make_rl_batch(rows, cfg), cfg)
    return [x - y for x, y in zip(model.table.tolist(), [0.0, math.log(3.0)], strict=True)], stats


@needs_torch
@pytest.mark.parametrize("sampler_p", [0.7, 0.5])
def test_ratio_is_taken_against_the_sampling_logprobs(sampler_p: float) -> None:
    # tape x sampled token 1 (now p = 0.75) with reward 1, tape y token 0 (p = 0.25, stored exactly)
    # with reward 0: Dr. GRPO advantages +0.5 and -0.5. d logp(k) / d table = onehot(k) - p.
    rows = [_row("x", 1, 1.0, math.log(sampler_p)), _row("y", 0, 0.0, math.log(0.25))]
    delta, stats = _step(rows)
    r = 0.75 / sampler_p  # 1.0714 (inside 1 +- 0.2) for a sampler at 0.7; 1.5 (clipped) at 0.5
    # loss = 1/2 [-(0.5 r) - (-0.5 * 1)] when x is not clipped; grad = 1/2 [-0.5 r (e1 - p) + 0.5 (e0 - p)]
    # e1 - p = [-0.25, 0.25], e0 - p = [0.75, -0.75]; SGD with lr 1 moves the table by -grad
    x_part = 0.0 if r > 1.2 else 0.0625 * r
    expected = [-(x_part + 0.1875), x_part + 0.1875]
    assert delta == pytest.approx(expected, abs=1e-6)
    assert stats.ratio_mean == pytest.approx((r + 1.0) / 2)
    assert stats.clip_high_fraction == (0.5 if r > 1.2 else 0.0)
    assert delta[1] > 0  # the rewarded token's logit goes up either way


@needs_torch
def test_positive_advantage_raises_the_sampled_tokens_logprob() -> None:
    def logp_change(delta: list[float], token: int) -> float:
        table = [0.0 + delta[0], math.log(3.0) + delta[1]]
        new = table[token] - math.log(sum(math.exp(v) for v in table))
        return new - math.log([0.25, 0.75][token])

    # token 1 rewarded (A > 0) against token 0 unrewarded in the same group
    delta, _ = _step([_row("x", 1, 1.0, math.log(0.75)), _row("z", 0, 0.0, math.log(0.25))])
    assert logp_change(delta, 1) > 0 > logp_change(delta, 0)
    # the same tokens with the rewards swapped: token 1 now has A < 0
    delta, _ = _step([_row("x", 1, 0.0, math.log(0.75)), _row("z", 0, 1.0, math.log(0.25))])
    assert logp_change(delta, 1) < 0 < logp_change(delta, 0)
    # a group of equal rewards gives nothing: zero advantage, no update
    delta, stats = _step([_row("x", 1, 1.0, math.log(0.75)), _row("w", 0, 1.0, math.log(0.25))])
    assert delta == pytest.approx([0.0, 0.0], abs=1e-7) and stats.zero_adv_share == 1.0


@needs_torch
def test_missing_sampling_logprobs_count_as_on_policy() -> None:
    delta, stats = _step([_row("x", 1, 1.0, None), _row("y", 0, 0.0, math.log(0.25))])
    assert stats.samples_without_logprobs == 1
    assert stats.ratio_mean == pytest.approx(1.0)
    assert delta == pytest.approx([-(0.0625 + 0.1875), 0.0625 + 0.1875], abs=1e-6)  # r = 1 in the formula


@needs_torch
def test_step_stats_lag_rewards_categories_and_kl() -> None:
    rows = [
        _row("a1", 1, 1.0, math.log(0.75), task_id="A", category="easy", policy_version=3),
        _row("a2", 0, 0.0, math.log(0.25), task_id="A", category="easy", policy_version=1),
        _row("b1", 1, 1.0, math.log(0.75), task_id="B", category="hard", policy_version=4),
        _row("b2", 0, 1.0, math.log(0.25), task_id="B", category="hard", policy_version=4),
    ]
    import torch

    from tapekit.training.rl import RLConfig, grpo_step, make_rl_batch

    cfg = RLConfig(scale_rewards=False, kl_coef=0.1)
    model = _unigram([0.0, math.log(3.0)])
    ref = _unigram([0.0, 0.0])  # p_ref = [0.5, 0.5]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = grpo_step(model, optimizer, make_rl_batch(rows, cfg), cfg, ref_model=ref, policy_version=4)
    assert (stats.policy_lag_mean, stats.policy_lag_max) == (pytest.approx((1 + 3 + 0 + 0) / 4), 3)
    assert stats.reward_mean == 0.75 and stats.reward_std == pytest.approx(math.sqrt(3 / 16))
    assert stats.zero_adv_share == 0.5 and stats.groups == 2
    assert stats.category_mean_abs_adv == {"easy": 0.5, "hard": 0.0}
    # k3 per token: token 1 (p 0.75 vs 0.5): 2/3 - ln(2/3) - 1; token 0 (0.25 vs 0.5): 2 - ln 2 - 1
    k1, k0 = 2 / 3 - math.log(2 / 3) - 1, 1 - LN2
    assert stats.kl == pytest.approx((2 * k1 + 2 * k0) / 4)
    assert stats.tokens == 4 and stats.tokens_per_s > 0
    assert stats.input_tokens == 8  # 4 rows of 2 tokens: the prompt token goes through the passes too
    from dataclasses import replace

    from tapekit.training.rl import merge_stats

    fast, slow = replace(stats, tokens_per_s=8.0), replace(stats, tokens_per_s=4.0)  # 1 s and 2 s
    merged = merge_stats([fast, slow])
    assert merged.input_tokens == 16 and merged.tokens == 8
    assert merged.tokens_per_s == pytest.approx(16 / 3)  # every token over the time of both steps
    logged = set(stats.to_dict())
    assert logged >= {"clip_fraction", "kl", "tokens_per_s", "policy_lag_mean", "zero_adv_share"}


@needs_torch
def test_micro_batches_make_the_same_update() -> None:
    rows = [
        _row("x", 1, 1.0, math.log(0.6)),
        _row("y", 0, 0.0, math.log(0.3)),
        _row("z", 1, 0.5, math.log(0.9)),
    ]
    for aggregation, extra in (("token", {}), ("sequence", {}), ("constant", {"max_tokens": 4})):
        whole, _ = _step(rows, aggregation=aggregation, **extra)
        split, _ = _step(rows, aggregation=aggregation, micro_batch_size=1, **extra)
        assert split == pytest.approx(whole, abs=1e-7)
    import torch

    from tapekit.training.rl import RLConfig, make_rl_batch

    batch = make_rl_batch(rows, RLConfig())
    assert batch.to(torch.device("cpu")) is batch and batch.size == 3
    assert batch.loss_mask.tolist() == [[0.0, 1.0]] * 3


@pytest.mark.skipif(not HAVE_TORCH or not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_step_on_gpu_matches_cpu() -> None:
    import torch

    from tapekit.training.rl import RLConfig, grpo_step, make_rl_batch

    rows = [_row("x", 1, 1.0, math.log(0.7)), _row("y", 0, 0.0, math.log(0.25))]
    cpu, _ = _step(rows)
    model = _unigram([0.0, math.log(3.0)]).cuda()
    cfg = RLConfig(scale_rewards=False, max_grad_norm=0.0)
    grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), make_rl_batch(rows, cfg), cfg)
    gpu = [x - y for x, y in zip(model.table.tolist(), [0.0, math.log(3.0)], strict=True)]
    assert gpu == pytest.approx(cpu, abs=1e-6)


@pytest.mark.skipif(
    not (HAVE_TORCH and importlib.util.find_spec("datasets")), reason="needs torch and datasets"
)
def test_batch_from_a_datasets_dataset() -> None:
    from datasets import Dataset

    from tapekit.training.rl import RLConfig, make_rl_batch

    rows = [_row("x", 1, 1.0, math.log(0.7)), _row("y", 0, 0.0, None)]
    batch = make_rl_batch(Dataset.from_list(rows), RLConfig(scale_rewards=False))
    assert batch.advantages.tolist() == [0.5, -0.5]
    assert batch.has_logprobs.tolist() == [True, False]
    assert batch.old_logprobs[0, 1].item() == pytest.approx(math.log(0.7))


@needs_torch
def test_batch_errors_name_the_sample() -> None:
    from tapekit.training.rl import RLConfig, make_rl_batch

    bad = _row("x", 1, 1.0, 0.0)
    bad["loss_mask"] = [1]
    with pytest.raises(ValueError, match="sample 1 \\(tape 'x'\\) loss_mask has 1 entries, not 2"):
        make_rl_batch([_row("y", 0, 0.0, 0.0), bad], RLConfig())
    with pytest.raises(ValueError, match=r"sample 1 of tape 'x' has group 't' and reward 0\.0"):
        make_rl_batch([_row("x", 1, 1.0, 0.0), _row("x", 0, 0.0, 0.0)], RLConfig())
    with pytest.raises(ValueError, match="no 'task_id' column"):
        make_rl_batch([{k: v for k, v in _row("x", 1, 1.0, 0.0).items() if k != "task_id"}], RLConfig())
    with pytest.raises(ValueError, match="needs max_tokens"):
        RLConfig(aggregation="constant")


# ---------------------------------------------------------------- end to end on the tiny model


def _sample(
    model: Any, prompt: list[int], n: int, length: int, gen: Any
) -> list[tuple[list[int], list[float]]]:
    """``n`` completions of ``length`` tokens with their sampling log-probs (temperature 1)."""
    import torch

    out = []
    with torch.no_grad():
        for _ in range(n):
            ids, lps = list(prompt), []
            for _ in range(length):
                logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
                token = int(torch.multinomial(logp.exp(), 1, generator=gen).item())
                ids.append(token)
                lps.append(float(logp[token]))
            out.append((ids[len(prompt) :], lps))
    return out


def _expected_reward(model: Any, prompt: list[int]) -> float:
    """P(first completion token id is even): the exact expected reward of the toy task."""
    import torch

    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
    return float(p[0::2].sum())


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "tokenizers")),
    reason="needs torch, transformers and tokenizers (extra `train`)",
)
def test_grpo_steps_raise_the_expected_reward_of_a_tiny_model() -> None:
    import torch

    from tapekit.testing.tiny import TinyConfig, make_tiny
    from tapekit.training.rl import RLConfig, grpo_step, make_rl_batch

    texts = [f"<|im_start|>user\npick {i}<|im_end|>\n<|im_start|>assistant\n{i}<|im_end|>" for i in range(20)]
    tiny = TinyConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1)
    model, tokenizer = make_tiny(texts, tiny)
    chat = "<|im_start|>user\npick {}<|im_end|>\n<|im_start|>assistant\n"
    prompts = [tokenizer(chat.format(i))["input_ids"] for i in range(3)]
    before = [_expected_reward(model, p) for p in prompts]
    cfg = RLConfig(clip_low=0.2, scale_rewards=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    gen = torch.Generator().manual_seed(0)
    for step in range(8):
        model.eval()
        rows = []
        for t, prompt in enumerate(prompts):
            for g, (completion, lps) in enumerate(_sample(model, prompt, 6, 2, gen)):
                rows.append(
                    {
                        "tape_id": f"s{step}t{t}g{g}",
                        "task_id": f"t{t}",
                        "input_ids": prompt + completion,
                        "loss_mask": [0] * len(prompt) + [1] * len(completion),
                        "logprobs": [0.0] * len(prompt) + lps,
                        "has_logprobs": True,
                        "reward": 1.0 if completion[0] % 2 == 0 else 0.0,
                        "policy_version": step,
                    }
                )
        stats = grpo_step(model, optimizer, make_rl_batch(rows, cfg), cfg, policy_version=step)
        assert stats.ratio_mean == pytest.approx(1.0, abs=1e-3)  # fresh samples: on-policy
        assert stats.policy_lag_max == 0
    after = [_expected_reward(model, p) for p in prompts]
    assert sum(after) / 3 > sum(before) / 3 + 0.15, (before, after)
