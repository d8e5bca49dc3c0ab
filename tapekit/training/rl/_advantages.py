"""Group-normalised advantages for GRPO-style on-policy RL (pure Python, no torch).

A *group* is the G rollouts of one task made by the same policy. Each rollout's advantage is
its reward relative to its group:

- ``scale_rewards=True`` (GRPO): ``A_i = (r_i - mean(r)) / (std(r) + eps)``, with the unbiased
  (n - 1) standard deviation of the group, as TRL's GRPO trainer computes it;
- ``scale_rewards=False`` (Dr. GRPO): ``A_i = r_i - mean(r)``: no division by the standard
  deviation, which otherwise up-weights groups that are almost all right or all wrong.

A group whose rewards are all equal (or a group of one) carries no learning signal: its
advantages are exactly 0.0 and it is reported in :attr:`GroupAdvantages.zero_groups`. Its mean
absolute advantage is the learning-gain proxy that the SEC curriculum uses
(:mod:`tapekit.training.curriculum`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupAdvantages:
    """Advantages of a batch of rollouts, in the order of the rewards given.

    ``groups`` maps each group key to the indices of its rollouts; ``zero_groups`` lists the keys
    of groups whose advantages are all zero; ``group_mean_abs`` is each group's mean |A|.
    """

    advantages: list[float]
    groups: dict[Hashable, list[int]]
    zero_groups: list[Hashable] = field(default_factory=list)
    group_mean_abs: dict[Hashable, float] = field(default_factory=dict)

    @property
    def zero_share(self) -> float:
        """The share of groups with zero advantage (0.0 for an empty batch)."""
        return len(self.zero_groups) / len(self.groups) if self.groups else 0.0


def _group_indices(keys: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def _one_group(rewards: list[float], scale_rewards: bool, eps: float, tol: float) -> list[float]:
    n = len(rewards)
    mean = sum(rewards) / n
    if n < 2 or max(rewards) - min(rewards) <= tol:
        return [0.0] * n
    centred = [r - mean for r in rewards]
    if not scale_rewards:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (n - 1))
    return [c / (std + eps) for c in centred]


def group_advantages(
    rewards: Sequence[float],
    group_keys: Sequence[Hashable],
    *,
    scale_rewards: bool = True,
    eps: float = 1e-4,
    tol: float = 1e-12,
) -> GroupAdvantages:
    """Advantages of ``rewards`` normalised within the groups given by ``group_keys``.

    ``rewards[i]`` belongs to group ``group_keys[i]`` (a task id, usually). Groups whose rewards
    differ by at most ``tol`` get advantages of exactly 0.0 and are listed as zero groups.
    Raises ``ValueError`` for mismatched lengths or a non-finite reward (naming its index).
    """
    if len(rewards) != len(group_keys):
        raise ValueError(
            f"group_advantages: {len(rewards)} rewards but {len(group_keys)} group keys (one per reward)"
        )
    values = [float(r) for r in rewards]
    for i, r in enumerate(values):
        if not math.isfinite(r):
            raise ValueError(f"group_advantages: reward {i} (group {group_keys[i]!r}) is {r}")
    groups = _group_indices(group_keys)
    advantages = [0.0] * len(values)
    zero: list[Hashable] = []
    mean_abs: dict[Hashable, float] = {}
    for key, idx in groups.items():
        adv = _one_group([values[i] for i in idx], scale_rewards, eps, tol)
        for i, a in zip(idx, adv, strict=True):
            advantages[i] = a
        if all(a == 0.0 for a in adv):
            zero.append(key)
        mean_abs[key] = sum(abs(a) for a in adv) / len(adv)
    return GroupAdvantages(advantages, groups, zero, mean_abs)


def mean_abs_by_key(
    group_mean_abs: Mapping[Hashable, float], key_of_group: Mapping[Hashable, str]
) -> dict[str, float]:
    """The mean over groups of each group's mean |A|, per category (``key_of_group[group]``).

    This is SEC's arm reward: the average absolute advantage of a category's groups in a step.
    Raises ``KeyError`` naming a group that has no category.
    """
    sums: dict[str, list[float]] = {}
    for group, value in group_mean_abs.items():
        if group not in key_of_group:
            raise KeyError(f"mean_abs_by_key: group {group!r} has no category")
        sums.setdefault(key_of_group[group], []).append(value)
    return {cat: sum(vals) / len(vals) for cat, vals in sums.items()}
