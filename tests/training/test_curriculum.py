"""Task samplers over categories: TD(0) and Boltzmann by hand, SEC moving toward the category
with the largest mean |advantage| on a synthetic stream, uniform and fixed-order baselines,
logging every step, and exact resume from a JSON round-trip of the state."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from tapekit.evaluate import Task
from tapekit.training.curriculum import (
    FixedOrderSampler,
    SECSampler,
    UniformSampler,
    boltzmann,
    td0_update,
)

LEVELS = ("easy", "medium", "hard")


def tasks(per_level: int = 4) -> list[Task]:
    """``per_level`` tasks in each of three difficulty levels."""
    return [
        Task(id=f"{lvl}-{i}", question=f"q {lvl} {i}", category=lvl)
        for lvl in LEVELS
        for i in range(per_level)
    ]


def test_td0_update_by_hand() -> None:
    q = 0.0
    q = td0_update(q, 1.0, 0.5)  # 0 + 0.5 (1 - 0) = 0.5
    assert q == 0.5
    q = td0_update(q, 0.0, 0.5)  # 0.5 + 0.5 (0 - 0.5) = 0.25
    assert q == 0.25
    q = td0_update(q, 1.0, 0.5)  # 0.25 + 0.5 (1 - 0.25) = 0.625
    assert q == 0.625
    assert td0_update(0.3, 0.9, 1.0) == pytest.approx(0.9)  # alpha 1: the last reward


def test_boltzmann_by_hand() -> None:
    # Q / tau = 0, ln 2, ln 3 -> weights 1, 2, 3
    tau = 0.5
    assert boltzmann([0.0, tau * math.log(2), tau * math.log(3)], tau) == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    assert boltzmann([5.0, 5.0], 0.1) == [0.5, 0.5]
    assert boltzmann([1000.0, 0.0], 1.0) == pytest.approx([1.0, 0.0])  # no overflow
    with pytest.raises(ValueError, match="temperature must be > 0"):
        boltzmann([1.0], 0.0)


def test_sec_update_and_probabilities_by_hand() -> None:
    sec = SECSampler(tasks(), alpha=0.5, temperature=0.5, seed=0)
    assert sec.probabilities() == pytest.approx({c: 1 / 3 for c in LEVELS})
    sec.sample(6)
    sec.update({"medium": 0.8, "hard": 0.2})  # easy not played this step: its value stays
    assert sec.values() == pytest.approx({"easy": 0.0, "medium": 0.4, "hard": 0.1})
    sec.sample(6)
    sec.update({"medium": 0.0})
    assert sec.values() == pytest.approx({"easy": 0.0, "medium": 0.2, "hard": 0.1})
    # exp(Q / 0.5): 1, e^0.4, e^0.2
    w = [1.0, math.exp(0.4), math.exp(0.2)]
    expected = {"easy": w[0] / sum(w), "medium": w[1] / sum(w), "hard": w[2] / sum(w)}
    assert sec.probabilities() == pytest.approx(expected)
    # logged every step: the values and probabilities used to draw, then the update
    assert [h["step"] for h in sec.history] == [0, 1]
    assert sec.history[1]["values"] == pytest.approx({"easy": 0.0, "medium": 0.4, "hard": 0.1})
    assert sec.history[1]["values_after"] == pytest.approx({"easy": 0.0, "medium": 0.2, "hard": 0.1})
    assert sec.history[1]["arm_rewards"] == {"medium": 0.0}
    assert sum(sec.history[0]["counts"].values()) == 6


def _synthetic_stream(sampler: Any, steps: int, seed: int) -> list[dict[str, float]]:
    """Feed the sampler noisy mean |A| per drawn category: medium teaches most (0.8), easy and
    hard little (0.1: mostly all-right or all-wrong groups). Returns the probabilities per step."""
    signal = {"easy": 0.1, "medium": 0.8, "hard": 0.1}
    noise = random.Random(seed)
    probs = []
    for _ in range(steps):
        drawn = sampler.sample(8)
        played = {t.category for t in drawn}
        sampler.update({c: max(0.0, signal[c] + noise.uniform(-0.1, 0.1)) for c in played})
        probs.append(sampler.probabilities())
    return probs


def test_sec_moves_probability_to_the_category_with_the_largest_mean_abs_advantage() -> None:
    logged: list[dict[str, Any]] = []
    sec = SECSampler(tasks(), alpha=0.3, temperature=0.2, seed=1, log_fn=logged.append)
    probs = _synthetic_stream(sec, 30, seed=2)
    assert probs[-1]["medium"] > 0.8
    assert probs[-1]["medium"] > 2 * max(probs[-1]["easy"], probs[-1]["hard"])
    assert len(logged) == 30 and logged[-1]["sampler"] == "sec"
    late = [h["counts"]["medium"] for h in sec.history[-10:]]
    assert sum(late) / (10 * 8) > 0.7  # most of the late draws are medium tasks
    # the uniform baseline does not move
    uni = UniformSampler(tasks(), seed=1)
    assert _synthetic_stream(uni, 10, seed=2)[-1] == pytest.approx({c: 1 / 3 for c in LEVELS})


def test_uniform_sampler_weights_categories_by_size() -> None:
    pool = tasks(2) + [Task(id=f"x{i}", question="q", category="hard") for i in range(4)]  # hard: 6 of 10
    assert UniformSampler(pool).probabilities() == pytest.approx({"easy": 0.2, "medium": 0.2, "hard": 0.6})
    assert UniformSampler(pool, over="categories").probabilities() == pytest.approx(
        {c: 1 / 3 for c in LEVELS}
    )
    # within a category every task comes once before any repeats
    sampler = FixedOrderSampler(pool, ["hard"], steps_per_category=1)
    assert sorted(t.id for t in sampler.sample(6)) == sorted(t.id for t in pool if t.category == "hard")


def test_a_round_that_starts_mid_step_does_not_repeat_the_steps_tasks() -> None:
    for seed in range(20):  # 3 tasks drawn 2 per step: every second step starts a new round
        sampler = FixedOrderSampler(tasks(3), ["easy"], steps_per_category=100, seed=seed)
        for _ in range(12):
            ids = [t.id for t in sampler.sample(2)]
            assert len(set(ids)) == 2, (seed, ids)
    # only a category with fewer tasks than the step's draws repeats one (each once first)
    drawn = [t.id for t in FixedOrderSampler(tasks(3), ["easy"], steps_per_category=1).sample(5)]
    assert sorted(set(drawn)) == ["easy-0", "easy-1", "easy-2"] and len(drawn) == 5


def test_fixed_order_sampler() -> None:
    sampler = FixedOrderSampler(tasks(), ["easy", "medium", "hard"], steps_per_category=2)
    cats = [{t.category for t in sampler.sample(3)} for _ in range(8)]
    assert cats == [{"easy"}] * 2 + [{"medium"}] * 2 + [{"hard"}] * 4  # stays on the last
    assert sampler.history[2]["probs"] == {"easy": 0.0, "medium": 1.0, "hard": 0.0}
    with pytest.raises(ValueError, match=r"unknown categories \['expert'\]"):
        FixedOrderSampler(tasks(), ["easy", "expert"], steps_per_category=1)


@pytest.mark.parametrize("kind", ["sec", "uniform"])
def test_state_round_trips_through_json_and_resumes_exactly(kind: str) -> None:
    def make() -> Any:
        if kind == "sec":
            return SECSampler(tasks(), alpha=0.4, temperature=0.3, seed=7)
        return UniformSampler(tasks(), seed=7)

    def run(sampler: Any, steps: int) -> list[list[str]]:
        out = []
        for _ in range(steps):
            drawn = sampler.sample(5)
            out.append([t.id for t in drawn])
            sampler.update({t.category: 0.1 * len(t.id) for t in drawn})
        return out

    unbroken = make()
    ids = run(unbroken, 10)
    first = make()
    head = run(first, 4)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert head + run(resumed, 6) == ids
    assert resumed.values() == unbroken.values() and resumed.probabilities() == unbroken.probabilities()
    assert resumed.history == unbroken.history


def test_bad_input_is_named() -> None:
    sec = SECSampler(tasks(), seed=0)
    with pytest.raises(KeyError, match="unknown categories \\['expert'\\]"):
        sec.update({"expert": 1.0})
    with pytest.raises(ValueError, match="alpha must be in"):
        SECSampler(tasks(), alpha=0.0)
    with pytest.raises(ValueError, match="from a 'uniform' sampler"):
        sec.load_state_dict(UniformSampler(tasks()).state_dict())
    with pytest.raises(ValueError, match="do not match"):
        sec.load_state_dict(SECSampler(tasks(2)).state_dict())
    with pytest.raises(ValueError, match="has no category"):
        SECSampler([{"id": 1}])
    by_fn = SECSampler(["a1", "b1", "b2"], category_of=lambda t: t[0])
    assert by_fn.categories == ["a", "b"]
