"""The math case study's RL stage (``examples/math_study/rl_stage.py``): its setup refuses a
reward that is not a scorer, grades the curriculum's arms by level or by size, and keeps the
fixed curriculum's order easy to hard on a pool with a hard tail. The RL loop itself is tested
on a toy setup (``tests/training/rl_toy.py``) in ``tests/training/test_rl_loop.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from examples.math_study.problems import make_problems

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("datasets") is None,
    reason="needs torch and datasets (the train extra)",
)

PROBLEMS = make_problems(12, seed=3)  # 12 problems, the three levels in turn


def test_the_math_setup_refuses_a_reward_that_is_not_a_scorer() -> None:
    from examples.math_study.rl_stage import math_setup

    assert math_setup(PROBLEMS, reward="steps").reward == "steps"
    with pytest.raises(ValueError, match="reward 'exact' is not one of the scorers"):
        math_setup(PROBLEMS, reward="exact")


def test_the_math_setup_grades_its_arms_by_level_or_by_size() -> None:
    from examples.math_study.problems import difficulty
    from examples.math_study.rl_stage import math_setup
    from tapekit.training.rl import RLRunConfig, make_sampler

    by_size = math_setup(PROBLEMS, arms="sizes")
    assert [t.category for t in by_size.tasks] == [difficulty(p) for p in PROBLEMS]
    assert [t.category for t in math_setup(PROBLEMS).tasks] == [p.category for p in PROBLEMS]
    sampler = make_sampler(RLRunConfig(curriculum={"kind": "sec"}), by_size.tasks)
    assert sampler.categories == sorted({difficulty(p) for p in PROBLEMS})
    with pytest.raises(ValueError, match="arms must be one of"):
        math_setup(PROBLEMS, arms="digits")


def test_a_pool_with_a_hard_tail_keeps_the_fixed_order_easy_to_hard() -> None:
    from examples.math_study.problems import split_problems
    from examples.math_study.rl_stage import easy_to_hard, math_setup, pool_levels

    assert pool_levels(3) == ["level1", "level2", "level3"]
    assert pool_levels(5) == ["level1", "level2", "level3", "level4", "level5"]
    for n in (2, 6):
        with pytest.raises(ValueError, match="3 to 5 levels"):
            pool_levels(n)
    train = split_problems(60, 10, categories=pool_levels(5)).train
    assert easy_to_hard("levels", math_setup(train).tasks) == pool_levels(5)
    assert easy_to_hard("levels", math_setup(train[:2]).tasks) == ["level1", "level2"]
    by_size = easy_to_hard("sizes", math_setup(train, arms="sizes").tasks)
    assert by_size[0] == "level1" and by_size[-2:] == ["level4", "level5"]
    assert {"level2-small", "level3-small"} <= set(by_size)


def test_the_rl_stage_stops_on_its_time_budget_and_evaluates_every_eval_every_steps(tmp_path: Path) -> None:
    import torch

    from examples.math_study.agents import STUDENT_SYSTEM
    from examples.math_study.rl_stage import RLStageSettings, rl_stage
    from examples.math_study.scoring import tasks_for
    from tapekit.testing.tiny import TinyConfig, make_tiny

    torch.set_num_threads(2)
    texts = [STUDENT_SYSTEM, *(p.question for p in PROBLEMS), "calculator: 12+7 Answer: 19"]
    model, tokenizer = make_tiny(texts, TinyConfig(vocab_size=300, hidden_size=32, intermediate_size=64))
    settings = RLStageSettings(
        seconds=1e-6, max_steps=5, tasks_per_step=2, group_size=2, max_tokens=8, eval_every=1, out=tmp_path
    )
    lines: list[str] = []
    result = rl_stage(
        model,
        tokenizer,
        PROBLEMS[:6],
        tasks_for(PROBLEMS[6:9]),
        settings,
        echo=lambda s, **_: lines.append(s),
    )
    assert len(result.history) == 1  # the first step spent the budget: no exception, a normal end
    assert [step for step, _, _ in result.evals] == [1]
    assert any(line.startswith("rl step=0 ") for line in lines)
    assert lines[-1].startswith("stage=rl ") and " step=1 " in lines[-1]
