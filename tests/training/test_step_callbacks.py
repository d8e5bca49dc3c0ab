"""The run protocol's callbacks without a model: typed step records, the time and step budgets
of ``StopAfter``, ``EarlyStopping``'s patience, and the split of tapekit and transformers
callbacks. The trainers' use of them is tested in test_rl_loop.py and test_train_sft.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tapekit.training.callbacks import (
    EarlyStopping,
    StepCallback,
    StepRecord,
    StopAfter,
    notify,
    split_callbacks,
)


def rec(step: int, step_seconds: float = 1.0, **kw: object) -> StepRecord:
    return StepRecord(trainer="rl", step=step, seconds=step * step_seconds, step_seconds=step_seconds, **kw)  # type: ignore[arg-type]


def test_a_step_record_gives_its_numbers_by_name_and_refuses_unknown_fields() -> None:
    record = rec(
        2, loss=0.5, reward=0.25, metrics={"score_strict": 0.75, "sampler_probs": {"a": 0.4}, "ok": True}
    )
    assert record.value("loss") == 0.5 and record.value("reward") == 0.25
    assert record.value("score_strict") == 0.75
    assert (
        record.value("ok") is None and record.value("sampler_probs") is None and record.value("nope") is None
    )
    scalars = record.scalars()
    assert scalars["loss"] == 0.5 and scalars["sampler_probs/a"] == 0.4 and "ok" not in scalars
    with pytest.raises(ValueError, match="rewrd"):
        StepRecord(trainer="rl", step=1, seconds=0.0, rewrd=1.0)  # type: ignore[call-arg]


def test_stop_after_counts_steps_or_step_time_whichever_comes_first() -> None:
    by_steps = StopAfter(steps=3)
    assert [bool(by_steps.on_step(rec(s))) for s in (1, 2, 3)] == [False, False, True]
    assert "3 steps" in by_steps.reason
    by_time = StopAfter(seconds=2.5, steps=100)
    assert [bool(by_time.on_step(rec(s))) for s in (1, 2, 3)] == [False, False, True]
    assert "3.0 s" in by_time.reason
    by_time.on_begin("rl")  # a new run: a new budget
    assert not by_time.on_step(rec(1, step_seconds=2.0))
    for bad in ({}, {"seconds": 0}, {"steps": -1}):
        with pytest.raises(ValueError, match="StopAfter"):
            StopAfter(**bad)  # type: ignore[arg-type]


def test_early_stopping_waits_patience_records_without_improvement() -> None:
    stop = EarlyStopping("reward", patience=2)
    rewards = [0.1, 0.3, 0.2, 0.35, 0.3, 0.3]
    answers = [bool(stop.on_step(rec(i + 1, reward=r))) for i, r in enumerate(rewards)]
    assert answers == [False, False, False, False, False, True]
    assert stop.best == 0.35 and "reward" in stop.reason
    loss = EarlyStopping("loss", patience=1, min_delta=0.1)
    assert loss.mode == "min"
    assert not loss.on_step(rec(1, loss=1.0))
    assert not loss.on_step(rec(2))  # no loss on this record: not counted
    assert loss.on_step(rec(3, loss=0.95))  # better, but by less than min_delta


def test_every_callback_sees_the_record_and_the_first_reason_wins() -> None:
    seen: list[int] = []

    class Watch(StepCallback):
        def on_step(self, record: StepRecord) -> bool | None:
            seen.append(record.step)
            return None

    callbacks = [StopAfter(steps=1), Watch()]
    assert notify(callbacks, rec(1)) == "StopAfter: 1 steps done (budget 1)"
    assert seen == [1]
    assert notify([Watch()], rec(2)) is None
    other = object()
    assert split_callbacks([callbacks[0], other, callbacks[1]]) == ([callbacks[0], callbacks[1]], [other])


def test_the_callbacks_module_is_light() -> None:
    code = (
        "import sys, tapekit.training.callbacks; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
