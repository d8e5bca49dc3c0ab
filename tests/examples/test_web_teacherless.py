"""``examples/web_agent/teacherless.py``: the candidates are tasks with no teacher and not held
out, the RL pool never touches validation or test seeds, the screening rule, and a resumed RL
run neither repeats nor skips a validation point. The stages themselves run real Chromium and
SmolLM2 for hours: docs/experiments/web-teacherless.md is their record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.examples._commands import missing_for_web

MISSING = missing_for_web(("trl", "trl"), ("llguidance", "llguidance"))
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}")


def test_the_candidates_have_no_teacher_are_not_held_out_and_exist() -> None:
    from examples.web_agent import teacherless
    from tapekit.web.miniwob import SPLIT, TEACHERLESS_TASKS, all_tasks
    from tapekit.web.teacher import teacher_agent

    candidates = set(teacherless.CANDIDATES)
    assert len(candidates) == len(teacherless.CANDIDATES) >= 4
    assert not candidates & set(SPLIT.train_tasks) and not candidates & set(SPLIT.held_out_tasks)
    assert candidates <= set(all_tasks())
    assert set(TEACHERLESS_TASKS) <= candidates  # the split's RL tasks came out of the screening
    assert teacher_agent() is not None  # the teacher module imports (it covers the train tasks only)


def test_rl_tasks_split_by_seed_as_the_teacher_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    from tapekit.web import miniwob

    monkeypatch.setattr(miniwob, "TEACHERLESS_TASKS", ("click-test-2",))
    assert miniwob.split_of("click-test-2", 5) == "train"
    assert miniwob.split_of("click-test-2", 100_003) == "validation"
    assert miniwob.split_of("click-test-2", 200_039) == "test"
    assert miniwob.split_of("click-widget", 200_039) is None  # not in the split


class _Record:
    def __init__(self, step: int) -> None:
        self.step = step


def test_a_resumed_run_neither_repeats_nor_skips_a_validation_point(tmp_path: Path) -> None:
    from examples.web_agent.teacherless import Validation

    scored: list[int] = []

    def score(step: int) -> dict[str, float]:
        scored.append(step)
        return {"success": step / 100}

    first = Validation(tmp_path, every=30, last=100, score=score)
    for step in range(1, 65):  # killed after step 64
        assert first.on_step(_Record(step)) is None  # type: ignore[arg-type]
    assert scored == [30, 60]
    again = Validation(tmp_path, every=30, last=100, score=score)  # the same command, resumed
    for step in range(61, 101):  # the checkpoint was step 60: steps 61-64 run again
        again.on_step(_Record(step))  # type: ignore[arg-type]
    assert scored == [30, 60, 90, 100]  # 60 not repeated, the last step always scored
    lines = [json.loads(x) for x in (tmp_path / "val.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [30, 60, 90, 100]
