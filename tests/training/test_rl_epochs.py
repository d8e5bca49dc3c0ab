"""Several optimiser steps per batch of rollouts (``ppo_epochs`` x ``minibatches``): the split
keeps groups whole, the merged stats add up, and from the second step on the importance ratio
to the sampling log-probs leaves 1 so that the clipping acts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tapekit.training.rl import group_minibatches

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("datasets") is None,
    reason="needs torch and datasets (the train extra)",
)


def _rows(groups: list[str], per_group: int = 2) -> list[dict[str, Any]]:
    return [{"task_id": g, "tape_id": f"{g}.{i}"} for g in groups for i in range(per_group)]


def test_minibatches_keep_groups_whole_and_split_deterministically() -> None:
    rows = _rows(["a", "b", "c", "d", "e"])
    parts = group_minibatches(rows, "task_id", 2)
    assert [[r["tape_id"] for r in p] for p in parts] == [
        ["a.0", "a.1", "c.0", "c.1", "e.0", "e.1"],
        ["b.0", "b.1", "d.0", "d.1"],
    ]
    assert group_minibatches(rows, "task_id", 2) == parts
    assert len(group_minibatches(rows, "task_id", 9)) == 5  # never more parts than groups
    assert group_minibatches(rows, "task_id", 1) == [rows]


@needs_torch
def test_several_steps_per_batch_move_the_ratio_and_clip(tmp_path: Path) -> None:
    import torch

    from tapekit.training.rl import RLRunConfig, train_rl
    from tests.training.rl_toy import make_model, make_setup

    torch.set_num_threads(2)
    records = {}
    for epochs in (1, 3):
        model, tokenizer = make_model()
        config = RLRunConfig(
            output_dir=str(tmp_path / f"e{epochs}"),
            steps=2,
            rollouts={"tasks_per_step": 3, "group_size": 4, "max_tokens": 12, "max_loops": 2},
            learning_rate=3e-2,
            grpo={"clip_low": 0.05, "ppo_epochs": epochs, "minibatches": 2},
            seed=1,
            checkpoint=False,
        )
        records[epochs] = train_rl(make_setup(), model, tokenizer, config).history
    trained = [r for r in records[3] if r.tokens]
    assert trained, "no step had a group with signal"
    one = [r for r in records[1] if r.tokens]
    # 3 epochs train every live token three times; the ratio moved off 1 and some tokens clipped
    assert trained[0].tokens == 3 * (one[0].tokens or 0)
    assert any(r.clip_fraction > 0 for r in trained)
    assert any(abs(r.ratio_mean - 1.0) > 1e-4 for r in trained)


@needs_torch
def test_negative_scale_shrinks_only_the_negative_advantages() -> None:
    from tapekit.training.rl import RLConfig, make_rl_batch

    rows = [
        {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "tape_id": f"t{i}", "task_id": "q", "reward": r}
        for i, r in enumerate([1.0, 0.0, 0.0, 0.0])
    ]
    plain = make_rl_batch(rows, RLConfig(scale_rewards=False)).advantages.tolist()
    assert plain == pytest.approx([0.75, -0.25, -0.25, -0.25])
    half = make_rl_batch(rows, RLConfig(scale_rewards=False, negative_scale=0.5)).advantages.tolist()
    assert half == pytest.approx([0.75, -0.125, -0.125, -0.125])
    none = make_rl_batch(rows, RLConfig(scale_rewards=False, negative_scale=0.0))
    assert none.advantages.tolist() == pytest.approx([0.75, 0.0, 0.0, 0.0])
    assert none.groups.zero_groups == []  # the group still has a signal (and counts as such)
    with pytest.raises(ValueError, match="negative_scale"):
        RLConfig(negative_scale=1.5)
