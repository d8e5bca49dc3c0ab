"""A small RL setup for the RL tests: the math student on a few problems, a tiny model, and a
dense reward (the share of digits in what the student writes) so that every step has signal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from examples.math_study.agents import STUDENT_SYSTEM
from examples.math_study.problems import make_problems
from examples.math_study.rl_stage import math_setup
from examples.math_study.scoring import _written

PROBLEMS = make_problems(12, seed=3)


def digit_share(tape: Any, task: Any) -> float:
    """The share of digits in the agent's writing (0.0 when it wrote nothing)."""
    text = _written(tape)
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def make_setup() -> Any:
    """The :class:`RLSetup` of the tests (``tapekit train rl`` loads it as ``tests.rl_toy:make_setup``)."""
    setup = math_setup(PROBLEMS)
    setup.scorers = {**setup.scorers, "digits": digit_share}
    setup.reward = "digits"
    return setup


def make_model(path: Path | None = None) -> tuple[Any, Any]:
    """A tiny random model whose tokenizer knows the problems' words (saved to ``path``)."""
    from tapekit.training.tiny import TinyConfig, make_tiny

    texts = ["system", "user", "assistant", STUDENT_SYSTEM, *(p.question for p in PROBLEMS)]
    texts += ["Plan: (12+7)*3", "calculator: 12+7", "[tool result] 19", "Answer: 57"]
    config = TinyConfig(
        vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0
    )
    return make_tiny(texts, config, path)  # type: ignore[no-any-return]
