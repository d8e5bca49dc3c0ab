"""The clipped policy-gradient loss of GRPO-style RL on token-exact samples (pure torch).

For every token the model itself sampled (``loss_mask == 1``), with ``logp`` its log-prob under
the policy being trained, ``logp_old`` its log-prob under the policy that *sampled* it (the
``logprobs`` column of the samples) and ``A`` the advantage of its rollout:

- importance ratio ``rho = exp(logp - logp_old)`` (so a stale or different sampler is corrected);
- clipped surrogate ``L = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)``: once ``rho``
  leaves the trust region in the direction the advantage pushes it, the token gives no gradient;
- optional KL to a reference policy with the k3 estimator (Schulman):
  ``KL = exp(logp_ref - logp) - (logp_ref - logp) - 1`` (>= 0, unbiased), added as ``beta * KL``.

Tokens outside the mask get exactly zero gradient. Per-token losses are aggregated by
:func:`aggregate`: ``"token"`` (sum over all trained tokens / their count), ``"sequence"`` (mean
per sequence, then mean over sequences; the original GRPO), or ``"constant"`` (sum / (sequences x
``max_tokens``); Dr. GRPO's length-unbiased constant normaliser).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch


Aggregation = Literal["token", "sequence", "constant"]
AGGREGATIONS: tuple[str, ...] = ("token", "sequence", "constant")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each token of ``input_ids`` ([B, T]) given the tokens before it.

    ``logits`` is [B, T, V] from a causal LM (position t predicts token t+1). Position 0 has no
    prediction and gets 0.0. Logits are divided by ``temperature`` first, which must match the
    temperature the samples were drawn at for the ratio against their log-probs to be right.
    """
    import torch

    if logits.dim() != 3 or input_ids.dim() != 2 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"token_logprobs: logits {tuple(logits.shape)} must be [B, T, V] for input_ids "
            f"{tuple(input_ids.shape)} [B, T]"
        )
    if temperature <= 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    scaled = logits[:, :-1].float() / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = scaled.gather(-1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.cat([picked.new_zeros(picked.shape[0], 1), picked], dim=1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): ``exp(d) - d - 1`` with ``d = ref - logp``."""
    import torch

    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token",
    *,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` [B, T] over the tokens where ``mask`` is 1 to a scalar.

    ``total_tokens`` / ``total_sequences`` replace this batch's own counts, so micro-batches of
    one optimiser step add up to the loss of the whole batch. ``"constant"`` needs ``max_tokens``.
    """
    import torch

    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregate: unknown aggregation {mode!r} (one of {', '.join(AGGREGATIONS)})")
    masked = values * mask
    if mode == "token":
        denom = total_tokens if total_tokens is not None else float(mask.sum().item())
        return masked.sum() / max(denom, 1.0)
    counts = mask.sum(dim=1)
    if mode == "sequence":
        per_seq = masked.sum(dim=1) / torch.clamp(counts, min=1.0)
        n_seq = total_sequences if total_sequences is not None else float((counts > 0).sum().item())
        return per_seq.sum() / max(n_seq, 1.0)
    if max_tokens is None or max_tokens <= 0:
        raise ValueError("aggregate: the 'constant' aggregation needs max_tokens > 0 (Dr. GRPO's normaliser)")
    n_seq = total_sequences if total_sequences is not None else float(values.shape[0])
    return masked.sum() / (max(n_seq, 1.0) * max_tokens)


@dataclass
class PolicyLoss:
    """The loss of one (micro-)batch and the sums its statistics are made of.

    ``tokens`` counts trained tokens; ``clipped_low`` / ``clipped_high`` count tokens whose ratio
    was clipped below 1 - eps_low (with A < 0) or above 1 + eps_high (with A > 0), i.e. that gave
    no gradient; ``kl_sum`` and ``ratio_sum`` are sums over trained tokens.
    """

    loss: torch.Tensor
    tokens: float
    clipped_low: float
    clipped_high: float
    kl_sum: float
    ratio_sum: float


def _check_shapes(logprobs: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(
                f"policy_loss: {name} has shape {tuple(tensor.shape)}, logprobs {tuple(logprobs.shape)}"
            )


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token",
    total_tokens: float | None = None,
    total_sequences: float | None = None,
    max_tokens: int | None = None,
) -> PolicyLoss:
    """The clipped surrogate loss (plus ``kl_coef`` x k3 KL) over the tokens of ``loss_mask``.

    ``logprobs`` (with grad), ``old_logprobs`` (the sampler's) and ``loss_mask`` are [B, T];
    ``advantages`` is [B] (one per sequence) or [B, T]. ``clip_high`` defaults to ``clip_low``
    (a larger one is DAPO's clip-higher). See :func:`aggregate` for the aggregation options.
    """
    import torch

    _check_shapes(logprobs, old_logprobs=old_logprobs, loss_mask=loss_mask, ref_logprobs=ref_logprobs)
    if kl_coef and ref_logprobs is None:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logprobs (the reference model's log-probs)")
    if clip_low < 0 or (clip_high is not None and clip_high < 0):
        raise ValueError(f"policy_loss: clip ranges must be >= 0, got {clip_low}, {clip_high}")
    high = clip_low if clip_high is None else clip_high
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    if adv.shape[0] != logprobs.shape[0]:
        raise ValueError(f"policy_loss: {adv.shape[0]} advantages for {logprobs.shape[0]} sequences")
    mask = loss_mask.to(logprobs.dtype)
    on = mask > 0
    log_ratio = torch.where(on, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_low, 1.0 + high) * adv)
    per_token = -surrogate
    kl = torch.zeros_like(logprobs)
    if ref_logprobs is not None:
        ref = torch.where(on, ref_logprobs.detach(), logprobs.detach())
        kl = k3_kl(torch.where(on, logprobs, logprobs.detach()), ref)
        if kl_coef:
            per_token = per_token + kl_coef * kl
    loss = aggregate(
        per_token,
        mask,
        aggregation,
        total_tokens=total_tokens,
        total_sequences=total_sequences,
        max_tokens=max_tokens,
    )
    with torch.no_grad():
        full_adv = adv.expand_as(ratio)
        low = on & (ratio < 1.0 - clip_low) & (full_adv < 0)
        hi = on & (ratio > 1.0 + high) & (full_adv > 0)
        return PolicyLoss(
            loss=loss,
            tokens=float(on.sum().item()),
            clipped_low=float(low.sum().item()),
            clipped_high=float(hi.sum().item()),
            kl_sum=float((kl * mask).sum().item()),
            ratio_sum=float((ratio * mask).sum().item()),
        )
