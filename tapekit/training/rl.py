"""The core of GRPO-style on-policy RL on token-exact samples: batch, advantages, one step.

The rollout loop (G rollouts per task through the batch runner, scoring, turning tapes into
samples) is not here yet; this module takes samples that already exist, in the training
schema of :mod:`tapekit.training.samples` (``input_ids``, ``loss_mask``, ``logprobs``,
``has_logprobs``, ``tape_id``, ``reward``), plus a group column (``task_id`` by default: the
task the rollout attempted) and, optionally, ``category`` and ``policy_version``:

>>> batch = make_rl_batch(rows, RLConfig())                      # doctest: +SKIP
>>> stats = grpo_step(model, optimizer, batch, RLConfig(), policy_version=3)  # doctest: +SKIP
>>> stats.to_dict()["zero_adv_share"]                            # doctest: +SKIP

Advantages are computed per tape (one reward per tape, G tapes per group; see
:mod:`tapekit.training.advantages`) and shared by every sample cut from that tape. The loss is
:func:`tapekit.training.grpo_loss.policy_loss`, with the ratio taken against each sample's stored
sampling log-probs; a sample without them (``has_logprobs`` false) is treated as on-policy
(ratio 1, its log-probs taken from the current model) and counted in the stats.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tapekit.training.advantages import GroupAdvantages, group_advantages, mean_abs_by_key
from tapekit.training.grpo_loss import AGGREGATIONS, Aggregation, policy_loss, token_logprobs

if TYPE_CHECKING:
    import torch

__all__ = [
    "RLBatch",
    "RLConfig",
    "RLStepStats",
    "group_minibatches",
    "grpo_step",
    "make_rl_batch",
    "merge_stats",
    "reference_logprobs",
]


@dataclass(frozen=True)
class RLConfig:
    """Hyper-parameters of one GRPO step.

    ``clip_high`` defaults to ``clip_low``; ``kl_coef`` > 0 needs a reference model;
    ``aggregation`` is ``"token"``, ``"sequence"`` or ``"constant"`` (which needs ``max_tokens``);
    ``scale_rewards=False`` is Dr. GRPO (advantages not divided by the group's std);
    ``temperature`` must be the sampling temperature; ``micro_batch_size`` splits the forward and
    backward passes (one optimiser step per batch either way); ``max_grad_norm`` <= 0 disables
    gradient clipping; ``group_key`` names the column grouping the G rollouts of one task;
    ``negative_scale`` multiplies the negative advantages (1.0: plain GRPO; 0.0: only the
    rollouts better than their group's mean are reinforced, as in rejection-sampling
    fine-tuning; in between: a softer push away from the worse ones). ``share_prefix``: rows
    whose tokens before their first trained token are identical (a group's rollouts of one
    prompt) run that prefix through the model once per micro-batch
    (:mod:`tapekit.training._shared_prefix`; the same log-probs and gradients, fewer tokens
    computed); plain-head models only, others take the unshared pass either way.
    """

    clip_low: float = 0.2
    clip_high: float | None = None
    kl_coef: float = 0.0
    aggregation: Aggregation = "token"
    max_tokens: int | None = None
    scale_rewards: bool = True
    temperature: float = 1.0
    micro_batch_size: int | None = None
    max_grad_norm: float = 1.0
    group_key: str = "task_id"
    pad_id: int = 0
    negative_scale: float = 1.0
    share_prefix: bool = True

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"RLConfig.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.aggregation == "constant" and not self.max_tokens:
            raise ValueError("RLConfig: aggregation='constant' needs max_tokens (Dr. GRPO's normaliser)")
        if self.temperature <= 0:
            raise ValueError(f"RLConfig.temperature must be > 0, got {self.temperature}")
        if self.kl_coef < 0:
            raise ValueError(f"RLConfig.kl_coef must be >= 0, got {self.kl_coef}")
        if self.micro_batch_size is not None and self.micro_batch_size <= 0:
            raise ValueError(f"RLConfig.micro_batch_size must be positive, got {self.micro_batch_size}")
        if not 0.0 <= self.negative_scale <= 1.0:
            raise ValueError(f"RLConfig.negative_scale must be in [0, 1], got {self.negative_scale}")


@dataclass
class RLBatch:
    """Padded tensors of one RL step (right padding) and the group bookkeeping behind them.

    ``old_logprobs`` holds the sampling log-probs (0.0 where unknown); ``has_logprobs`` [B] says
    which rows have them. ``tape_rewards`` has one reward per tape, ``groups`` the tapes'
    advantages per group, ``group_category`` each group's category (when the rows carry one).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    has_logprobs: torch.Tensor
    advantages: torch.Tensor
    tape_rewards: list[float]
    groups: GroupAdvantages
    policy_versions: list[int | None]
    group_category: dict[Any, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """The number of samples (rows)."""
        return int(self.input_ids.shape[0])

    def to(self, device: Any) -> RLBatch:
        """This batch with its tensors on ``device`` (the same object when they are there already)."""
        if self.input_ids.device == device:
            return self
        tensors = ("input_ids", "attention_mask", "loss_mask", "old_logprobs", "has_logprobs", "advantages")
        return replace(self, **{name: getattr(self, name).to(device) for name in tensors})


def _check_row(i: int, row: Mapping[str, Any], group_key: str) -> None:
    where = f"sample {i} (tape {row.get('tape_id')!r})"
    for name in ("input_ids", "loss_mask", "tape_id", group_key):
        if name not in row or row[name] is None:
            raise ValueError(f"make_rl_batch: {where} has no {name!r} column")
    n = len(row["input_ids"])
    if n == 0:
        raise ValueError(f"make_rl_batch: {where} has no tokens")
    if len(row["loss_mask"]) != n:
        raise ValueError(f"make_rl_batch: {where} loss_mask has {len(row['loss_mask'])} entries, not {n}")
    logprobs = row.get("logprobs") or []
    if row.get("has_logprobs") and len(logprobs) != n:
        raise ValueError(f"make_rl_batch: {where} logprobs has {len(logprobs)} entries, not {n}")


def _tape_rewards(
    rows: Sequence[Mapping[str, Any]], group_key: str
) -> tuple[list[Any], list[Any], list[float]]:
    """Each tape once (in order of appearance): its key, its group and its reward."""
    tapes: dict[Any, tuple[Any, float]] = {}
    for i, row in enumerate(rows):
        key, reward = row["tape_id"], float(row.get("reward", 0.0))
        if key in tapes:
            group, seen = tapes[key]
            if group != row[group_key] or not math.isclose(seen, reward, rel_tol=0, abs_tol=1e-9):
                raise ValueError(
                    f"make_rl_batch: sample {i} of tape {key!r} has group {row[group_key]!r} and reward "
                    f"{reward}, an earlier sample of that tape {group!r} and {seen}"
                )
        else:
            tapes[key] = (row[group_key], reward)
    keys = list(tapes)
    return keys, [tapes[k][0] for k in keys], [tapes[k][1] for k in keys]


def _group_categories(rows: Sequence[Mapping[str, Any]], group_key: str) -> dict[Any, str]:
    """Each group's category, from the rows' ``category`` column (empty when no row has one)."""
    categories: dict[Any, str] = {}
    for i, row in enumerate(rows):
        category = row.get("category")
        if category is None:
            continue
        seen = categories.setdefault(row[group_key], str(category))
        if seen != str(category):
            raise ValueError(
                f"make_rl_batch: sample {i} of group {row[group_key]!r} has category {category!r}, "
                f"an earlier sample of that group {seen!r}"
            )
    missing = {r[group_key] for r in rows} - set(categories)
    if categories and missing:
        raise ValueError(f"make_rl_batch: groups {sorted(map(str, missing))} have no category, others do")
    return categories


def make_rl_batch(rows: Iterable[Mapping[str, Any]], config: RLConfig) -> RLBatch:
    """Pad sample rows into tensors and attach each row its tape's group-normalised advantage.

    ``rows`` is a list of dicts or a ``datasets.Dataset`` in the sample schema plus the
    ``config.group_key`` column. Raises ``ValueError`` naming the sample for a missing column,
    mismatched lengths, or two samples of one tape with different rewards or groups.
    """
    import torch

    data = [dict(r) for r in rows]
    if not data:
        raise ValueError("make_rl_batch: no samples")
    for i, row in enumerate(data):
        _check_row(i, row, config.group_key)
    tape_keys, tape_groups, rewards = _tape_rewards(data, config.group_key)
    groups = group_advantages(rewards, tape_groups, scale_rewards=config.scale_rewards)
    scale = config.negative_scale
    tape_adv = {k: a if a >= 0 else a * scale for k, a in zip(tape_keys, groups.advantages, strict=True)}
    width = max(len(r["input_ids"]) for r in data)
    shape = (len(data), width)
    input_ids = torch.full(shape, config.pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    old = torch.zeros(shape, dtype=torch.float32)
    for i, row in enumerate(data):
        n = len(row["input_ids"])
        input_ids[i, :n] = torch.tensor(row["input_ids"], dtype=torch.long)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor([1.0 if m else 0.0 for m in row["loss_mask"]])
        if row.get("has_logprobs"):
            old[i, :n] = torch.tensor([float(x) for x in row["logprobs"]])
    loss_mask[:, 0] = 0.0  # the first token has no prediction to train
    return RLBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        old_logprobs=old,
        has_logprobs=torch.tensor([bool(r.get("has_logprobs")) for r in data]),
        advantages=torch.tensor([tape_adv[r["tape_id"]] for r in data], dtype=torch.float32),
        tape_rewards=rewards,
        groups=groups,
        policy_versions=[None if r.get("policy_version") is None else int(r["policy_version"]) for r in data],
        group_category=_group_categories(data, config.group_key),
    )


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
    rows computed once (:func:`~tapekit.training._shared_prefix.shared_prefix_logprobs`); else the
    LM head on the trained tokens only when the model allows it
    (:func:`~tapekit.training._head_loss.masked_token_logprobs`, 0.0 elsewhere: the loss masks
    those positions out); else from the full logits."""
    from tapekit.training._head_loss import masked_token_logprobs
    from tapekit.training._shared_prefix import shared_prefix_logprobs

    ids, attention = batch.input_ids[sl], batch.attention_mask[sl]
    mask = batch.loss_mask[sl]
    logp = shared_prefix_logprobs(model, ids, attention, mask, temperature) if share_prefix else None
    if logp is None:
        logp = masked_token_logprobs(model, ids, attention, mask, temperature)
    if logp is None:
        logp = token_logprobs(_logits(model, ids, attention), ids, temperature)
    return logp  # type: ignore[no-any-return]


def reference_logprobs(model: Any, batch: RLBatch, config: RLConfig) -> torch.Tensor:
    """Per-token log-probs of ``batch`` under ``model`` (a frozen reference policy), without grad."""
    import torch

    parts = []
    batch = batch.to(_device(model))
    with torch.no_grad():
        for sl in _slices(batch.size, config.micro_batch_size):
            parts.append(_policy_logprobs(model, batch, sl, config.temperature, config.share_prefix))
    return torch.cat(parts)


def _slices(n: int, size: int | None) -> list[slice]:
    step = size or n
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


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
    processes there: :mod:`tapekit.training._rl_dist`).
    """
    import torch

    if config.kl_coef and ref_model is None:
        raise ValueError("grpo_step: config.kl_coef > 0 needs ref_model")
    start = time.perf_counter()
    batch = batch.to(_device(model))
    ref = reference_logprobs(ref_model, batch, config) if ref_model is not None else None
    if ref is not None:
        ref = ref.to(batch.input_ids.device)
    total_tokens = float(batch.loss_mask.sum().item())
    total_sequences = float((batch.loss_mask.sum(dim=1) > 0).sum().item())
    if config.aggregation == "constant":
        total_sequences = float(batch.size)
    optimizer.zero_grad()
    sums = {"loss": 0.0, "tokens": 0.0, "low": 0.0, "high": 0.0, "kl": 0.0, "ratio": 0.0}
    for sl in _slices(batch.size, config.micro_batch_size):
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


def group_minibatches(rows: list[dict[str, Any]], key: str, n: int) -> list[list[dict[str, Any]]]:
    """``rows`` split into at most ``n`` parts of whole groups (groups dealt round-robin in
    order of appearance, so the split is deterministic)."""
    order: dict[Any, int] = {}
    for row in rows:
        order.setdefault(row[key], len(order))
    parts: list[list[dict[str, Any]]] = [[] for _ in range(min(n, len(order)))]
    for row in rows:
        parts[order[row[key]] % len(parts)].append(row)
    return parts


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
