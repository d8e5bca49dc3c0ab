"""One GRPO optimiser step on a padded batch of token-exact samples, and what it did.

:func:`grpo_step` takes an :class:`~tapekit.training.rl._batch.RLBatch` (rows padded, each with
its tape's advantage) and an :class:`~tapekit.training.rl._config.RLConfig`, computes the
current policy's log-probs of the trained tokens (each group's shared prompt once, or the LM
head on the trained positions only, when the model allows), the clipped loss of
:func:`~tapekit.training.rl._loss.policy_loss` against each sample's stored sampling log-probs
(a sample without them, ``has_logprobs`` false, is treated as on-policy: ratio 1, counted in the
stats), and makes one optimiser step:

>>> batch = make_rl_batch(rows, RLConfig())                      # doctest: +SKIP
>>> stats = grpo_step(model, optimizer, batch, RLConfig(), policy_version=3)  # doctest: +SKIP
>>> stats.to_dict()["zero_adv_share"]                            # doctest: +SKIP

The loop that runs it on the agent's own rollouts is :func:`~tapekit.training.rl.train_rl`.
torch is imported inside the functions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tapekit.training.rl._advantages import mean_abs_by_key
from tapekit.training.rl._batch import RLBatch
from tapekit.training.rl._config import RLConfig
from tapekit.training.rl._loss import policy_loss, token_logprobs

if TYPE_CHECKING:
    import torch


@dataclass
class RLStepStats:
    """What one :func:`grpo_step` did. ``tokens`` are the tokens with a loss (the sampled ones),
    ``input_tokens`` every token of the forward and backward passes (prompts too), and
    ``tokens_per_s`` counts the latter. ``policy_lag_*`` are None when no sample has a version;
    ``category_mean_abs_adv`` (SEC's arm rewards) is empty when the rows carry no category."""

    loss: float
    reward_mean: float
    reward_std: float
    zero_adv_share: float
    groups: int
    clip_fraction: float
    clip_low_fraction: float
    clip_high_fraction: float
    ratio_mean: float
    kl: float
    tokens: int
    tokens_per_s: float
    grad_norm: float
    samples_without_logprobs: int
    policy_lag_mean: float | None
    policy_lag_max: int | None
    category_mean_abs_adv: dict[str, float] = field(default_factory=dict)
    input_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The stats as a flat JSON-serialisable dict."""
        return asdict(self)


def _device(model: Any) -> Any:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    import torch

    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def _logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    logits = getattr(out, "logits", out)
    if not hasattr(logits, "shape") or logits.dim() != 3:
        raise TypeError("grpo_step: the model must return [B, T, V] logits or an output with .logits")
    return logits


def _policy_logprobs(
    model: Any, batch: RLBatch, sl: slice, temperature: float, share_prefix: bool = True
) -> torch.Tensor:
    """Per-token log-probs of rows ``sl``: with ``share_prefix``, each prefix shared by several
    rows computed once (:func:`~tapekit.training.rl._shared_prefix.shared_prefix_logprobs`); else the
    LM head on the trained tokens only when the model allows it
    (:func:`~tapekit.training._head_loss.masked_token_logprobs`, 0.0 elsewhere: the loss masks
    those positions out); else from the full logits."""
    from tapekit.training._head_loss import masked_token_logprobs
    from tapekit.training.rl._shared_prefix import shared_prefix_logprobs

    ids, attention = batch.input_ids[sl], batch.attention_mask[sl]
    mask = batch.loss_mask[sl]
    logp = shared_prefix_logprobs(model, ids, attention, mask, temperature) if share_prefix else None
    if logp is None:
        logp = masked_token_logprobs(model, ids, attention, mask, temperature)
    if logp is None:
        logp = token_logprobs(_logits(model, ids, attention), ids, temperature)
    return logp  # type: ignore[no-any-return]


def reference_logprobs(
    model: Any, batch: RLBatch, config: RLConfig, slices: list[slice] | None = None
) -> torch.Tensor:
    """Per-token log-probs of ``batch`` under ``model`` (a frozen reference policy), without
    grad, computed micro-batch by micro-batch (``slices``; default: ``config.micro_batch_size``
    rows each, in order)."""
    import torch

    parts = []
    batch = batch.to(_device(model))
    with torch.no_grad():
        for sl in slices or _slices(batch.size, config.micro_batch_size):
            parts.append(_policy_logprobs(model, batch, sl, config.temperature, config.share_prefix))
    return torch.cat(parts)


def _slices(n: int, size: int | None) -> list[slice]:
    step = size or n
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _micro_batched(batch: RLBatch, config: RLConfig) -> tuple[RLBatch, list[slice]]:
    """``batch`` in micro-batch order and its micro-batches: with ``share_prefix`` and a
    ``micro_batch_size`` smaller than the batch, the rows that share a prefix are put in one
    micro-batch (:func:`~tapekit.training.rl._shared_prefix.batch_micro_batches`: a group's
    attempts at one page, whose turns may lie apart in row order); else fixed slices in row
    order."""
    from tapekit.training.rl._shared_prefix import batch_micro_batches

    size = config.micro_batch_size
    if not (config.share_prefix and size and size < batch.size):
        return batch, _slices(batch.size, size)
    bins = batch_micro_batches(batch.input_ids, batch.attention_mask, batch.loss_mask, size)
    slices, start = [], 0
    for b in bins:
        slices.append(slice(start, start + len(b)))
        start += len(b)
    return batch.take([i for b in bins for i in b]), slices


def _lag(versions: list[int | None], current: int | None) -> tuple[float | None, int | None]:
    known = [v for v in versions if v is not None]
    if current is None or not known:
        return None, None
    lags = [current - v for v in known]
    return sum(lags) / len(lags), max(lags)


def _reward_stats(rewards: list[float]) -> tuple[float, float]:
    mean = sum(rewards) / len(rewards)
    return mean, math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


def grpo_step(
    model: Any,
    optimizer: Any,
    batch: RLBatch,
    config: RLConfig,
    *,
    ref_model: Any = None,
    policy_version: int | None = None,
    grad_sync: Callable[[], None] | None = None,
) -> RLStepStats:
    """One optimiser step of the clipped policy-gradient loss on ``batch``; returns its stats.

    ``model`` is called as ``model(input_ids=..., attention_mask=...)`` and returns logits or an
    output with ``.logits`` (a transformers causal LM, or any torch module that does). With
    ``config.kl_coef`` > 0, ``ref_model`` gives the reference log-probs. ``policy_version`` is the
    version being trained; the policy lag is it minus each sample's ``policy_version``.
    The model's train/eval mode is left as it is: keep dropout off (eval mode, or a model without
    dropout) so that the ratio of a fresh sample is exactly 1. ``grad_sync`` runs after the
    backward passes and before the clipping (data-parallel runs average the gradients of the
    processes there: :mod:`tapekit.training.rl._dist`).
    """
    import torch

    if config.kl_coef and ref_model is None:
        raise ValueError("grpo_step: config.kl_coef > 0 needs ref_model")
    start = time.perf_counter()
    batch, slices = _micro_batched(batch.to(_device(model)), config)
    ref = reference_logprobs(ref_model, batch, config, slices) if ref_model is not None else None
    if ref is not None:
        ref = ref.to(batch.input_ids.device)
    total_tokens = float(batch.loss_mask.sum().item())
    total_sequences = float((batch.loss_mask.sum(dim=1) > 0).sum().item())
    if config.aggregation == "constant":
        total_sequences = float(batch.size)
    optimizer.zero_grad()
    sums = {"loss": 0.0, "tokens": 0.0, "low": 0.0, "high": 0.0, "kl": 0.0, "ratio": 0.0}
    for sl in slices:
        logp = _policy_logprobs(model, batch, sl, config.temperature, config.share_prefix)
        have = batch.has_logprobs[sl].unsqueeze(1)
        old = torch.where(have, batch.old_logprobs[sl], logp.detach())
        out = policy_loss(
            logp,
            old,
            batch.advantages[sl],
            batch.loss_mask[sl],
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            ref_logprobs=None if ref is None else ref[sl],
            kl_coef=config.kl_coef,
            aggregation=config.aggregation,
            total_tokens=total_tokens,
            total_sequences=total_sequences,
            max_tokens=config.max_tokens,
        )
        out.loss.backward()
        sums["loss"] += float(out.loss.item())
        sums["tokens"] += out.tokens
        sums["low"] += out.clipped_low
        sums["high"] += out.clipped_high
        sums["kl"] += out.kl_sum
        sums["ratio"] += out.ratio_sum
    if grad_sync is not None:
        grad_sync()
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm).item()) if params else 0.0
    optimizer.step()
    elapsed = max(time.perf_counter() - start, 1e-9)
    tokens = max(sums["tokens"], 1.0)
    reward_mean, reward_std = _reward_stats(batch.tape_rewards)
    lag_mean, lag_max = _lag(batch.policy_versions, policy_version)
    return RLStepStats(
        loss=sums["loss"],
        reward_mean=reward_mean,
        reward_std=reward_std,
        zero_adv_share=batch.groups.zero_share,
        groups=len(batch.groups.groups),
        clip_fraction=(sums["low"] + sums["high"]) / tokens,
        clip_low_fraction=sums["low"] / tokens,
        clip_high_fraction=sums["high"] / tokens,
        ratio_mean=sums["ratio"] / tokens,
        kl=sums["kl"] / tokens,
        tokens=int(sums["tokens"]),
        tokens_per_s=float(batch.attention_mask.sum().item()) / elapsed,
        input_tokens=int(batch.attention_mask.sum().item()),
        grad_norm=grad_norm,
        samples_without_logprobs=int((~batch.has_logprobs).sum().item()),
        policy_lag_mean=lag_mean,
        policy_lag_max=lag_max,
        category_mean_abs_adv=(
            mean_abs_by_key(batch.groups.group_mean_abs, batch.group_category) if batch.group_category else {}
        ),
    )


def merge_stats(all_stats: list[RLStepStats]) -> RLStepStats:
    """The stats of several optimiser steps on one batch: clip fraction, ratio, KL and loss
    averaged over the steps (token-weighted), tokens and grad norm of the whole."""
    if len(all_stats) == 1:
        return all_stats[0]
    tokens = sum(s.tokens for s in all_stats) or 1

    def mean(name: str) -> float:
        return sum(getattr(s, name) * s.tokens for s in all_stats) / tokens

    inputs = sum(s.input_tokens for s in all_stats)
    seconds = sum(s.input_tokens / s.tokens_per_s for s in all_stats if s.tokens_per_s > 0)
    return replace(
        all_stats[0],
        loss=sum(s.loss for s in all_stats) / len(all_stats),
        clip_fraction=mean("clip_fraction"),
        clip_low_fraction=mean("clip_low_fraction"),
        clip_high_fraction=mean("clip_high_fraction"),
        ratio_mean=mean("ratio_mean"),
        kl=mean("kl"),
        tokens=sum(s.tokens for s in all_stats),
        tokens_per_s=inputs / seconds if seconds else 0.0,
        input_tokens=inputs,
        grad_norm=max(s.grad_norm for s in all_stats),
    )
