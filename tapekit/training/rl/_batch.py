"""The batch of one GRPO step: sample rows padded into tensors, each row with its tape's
group-normalised advantage (:mod:`~tapekit.training.rl._advantages`), and the split of a step's
rows into minibatches of whole groups.

The rows are in the training schema of :mod:`tapekit.training.samples` (``input_ids``,
``loss_mask``, ``logprobs``, ``has_logprobs``, ``tape_id``, ``reward``), plus a group column
(``task_id`` by default: the task the rollout attempted) and, optionally, ``category`` and
``policy_version``. torch is imported inside the functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tapekit.training.rl._advantages import GroupAdvantages, group_advantages
from tapekit.training.rl._config import RLConfig

if TYPE_CHECKING:
    import torch


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

    def take(self, order: list[int]) -> RLBatch:
        """This batch with its rows in ``order`` (a permutation of the rows); the tapes' rewards
        and the groups are the same."""
        import torch

        if sorted(order) != list(range(self.size)):
            raise ValueError(f"RLBatch.take: {order} is not an order of the {self.size} rows")
        if order == list(range(self.size)):
            return self
        index = torch.tensor(order, dtype=torch.long, device=self.input_ids.device)
        tensors = ("input_ids", "attention_mask", "loss_mask", "old_logprobs", "has_logprobs", "advantages")
        return replace(
            self,
            policy_versions=[self.policy_versions[i] for i in order],
            **{name: getattr(self, name).index_select(0, index) for name in tensors},
        )

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


def signal_minibatches(
    rows: list[dict[str, Any]], full: RLBatch | None, config: RLConfig, n: int
) -> list[RLBatch]:
    """The rows of the groups that give a gradient (not zero-advantage groups of ``full``, the
    batch of all ``rows``) as up to ``n`` batches of whole groups; none when no group does."""
    if full is None:
        return []
    zero = set(full.groups.zero_groups)
    live = [r for r in rows if r[config.group_key] not in zero]
    return [make_rl_batch(part, config) for part in group_minibatches(live, config.group_key, n)]
