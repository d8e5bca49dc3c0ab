"""The math example's training / validation / test splits (``examples/math_study/problems.py``):
disjoint by question and by arithmetic (the start and the operations, which decide the answer),
of the sizes asked for, and what the pipeline trains on (the SFT teacher's problems, the RL
pool) never holds a test problem's arithmetic.

Arithmetic is recomputed here from ``start`` and ``operations`` directly, not through the
module's :func:`arithmetic`, so a broken key or a skipped exclusion fails these tests."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples.math_study.problems import (
    ALL_LEVELS,
    LEVELS,
    TEST_STREAM,
    Problem,
    make_problems,
    split_problems,
)

WEIGHTS = {"level1": 1, "level2": 2, "level3": 3}
# (n_train, n_val, n_test, train_weights, categories): math_distill --quick and its default
# run, the RL stage run alone (three levels, and five for a hard tail)
CONFIGS = [
    (1500, 45, 150, WEIGHTS, None),
    (6000, 150, 150, WEIGHTS, None),
    (1500, 150, 150, None, None),
    (1500, 150, 150, None, list(ALL_LEVELS)),
]


def key(p: Problem) -> tuple[int, tuple[tuple[str, int], ...]]:
    """The problem's arithmetic, recomputed: its start and its operations in order."""
    return p.start, tuple((o.op, o.operand) for o in p.operations)


def keys(problems: list[Problem]) -> set[tuple[int, tuple[tuple[str, int], ...]]]:
    return {key(p) for p in problems}


def expected_draw(candidates: list[Problem], quota: Counter[str], used: set[Any]) -> list[Problem]:
    """What a split must hold, recomputed: the candidates in order, as many per category as
    ``quota`` asks, skipping any whose arithmetic is in ``used`` or was picked before."""
    wanted, out, taken = Counter(quota), [], set(used)
    for p in candidates:
        if wanted[p.category] and key(p) not in taken:
            wanted[p.category] -= 1
            taken.add(key(p))
            out.append(p)
    assert not +wanted, f"recomputation ran out of candidates: {wanted}"
    return out


@pytest.mark.parametrize(("n_train", "n_val", "n_test", "weights", "categories"), CONFIGS)
def test_the_splits_are_disjoint_by_question_and_by_arithmetic_and_of_the_sizes_asked(
    n_train: int, n_val: int, n_test: int, weights: Any, categories: Any
) -> None:
    train, val, test = split_problems(n_train, n_val, n_test, 0, weights, categories)
    assert (len(train), len(val), len(test)) == (n_train, n_val, n_test)
    for a, b in ((train, val), (train, test), (val, test)):
        assert not {p.question for p in a} & {p.question for p in b}
        assert not keys(a) & keys(b)
    assert len(keys(val)) == n_val and len(keys(test)) == n_test  # no arithmetic twice in a split
    ids = [p.id for p in train + val + test]
    assert len(set(ids)) == len(ids)
    assert all(p.id.startswith("val-") for p in val) and all(p.id.startswith("test-") for p in test)
    assert not any(p.id.startswith(("val-", "test-")) for p in train)
    levels = categories or list(LEVELS)
    # the test problems are spread evenly; the validation ones like the stream positions they replace
    assert Counter(p.category for p in test) == {c: n_test // len(levels) for c in levels}
    window = Counter(levels[(n_train + j) % len(levels)] for j in range(n_val))
    assert Counter(p.category for p in val) == window
    if weights:
        assert Counter(p.category for p in train) == {
            c: n_train * w // sum(WEIGHTS.values()) for c, w in WEIGHTS.items()
        }


@pytest.mark.parametrize(("n_train", "n_val", "n_test", "weights", "categories"), CONFIGS)
def test_each_split_is_its_stream_less_what_shares_a_used_arithmetic(
    n_train: int, n_val: int, n_test: int, weights: Any, categories: Any
) -> None:
    splits = split_problems(n_train, n_val, n_test, 0, weights, categories)
    levels = categories or list(LEVELS)
    stream = make_problems(n_train + 4 * n_val + 300, 0, levels)
    window = stream[n_train : n_train + n_val]  # the held-out problems of the tuning rounds
    want_val = expected_draw(stream[n_train:], Counter(p.category for p in window), keys(splits.train))
    assert [(p.id, p.question) for p in splits.val] == [(f"val-{p.id}", p.question) for p in want_val]
    used = keys(splits.train) | keys(want_val)
    even = Counter({c: n_test // len(levels) for c in levels})
    want_test = expected_draw(make_problems(4 * n_test + 600, TEST_STREAM, levels), even, used)
    assert [(p.id, p.question) for p in splits.test] == [(f"test-{p.id}", p.question) for p in want_test]
    # the exclusion does work here: level1's old held-out window repeats training arithmetic
    repeats = sum(key(p) in keys(splits.train) for p in window if p.category == "level1")
    assert repeats >= 0.2 * sum(p.category == "level1" for p in window)
    assert sum(splits.dropped["val"].values()) >= repeats > 0


def test_the_test_split_also_avoids_the_arithmetic_it_is_told_to() -> None:
    # the SEC study: its RL pool is a five-level split, its SFT student's problems another stream
    sft_train = split_problems(1500, 45, 0, 0, WEIGHTS).train
    plain = split_problems(1500, 150, 500, 0, categories=list(ALL_LEVELS))
    avoiding = split_problems(1500, 150, 500, 0, categories=list(ALL_LEVELS), test_avoids=sft_train)
    assert keys(plain.test) & keys(sft_train)  # without it the test split repeats SFT arithmetic
    assert not keys(avoiding.test) & keys(sft_train)
    assert (avoiding.train, avoiding.val) == (plain.train, plain.val)  # only the test split moves
    used = keys(plain.train) | keys(plain.val) | keys(sft_train)
    levels = list(ALL_LEVELS)
    want = expected_draw(
        make_problems(4 * 500 + 600, TEST_STREAM, levels), Counter({c: 100 for c in levels}), used
    )
    assert [p.question for p in avoiding.test] == [p.question for p in want]


def test_a_split_that_cannot_be_filled_says_so() -> None:
    with pytest.raises(ValueError, match=r"short of .*level1"):
        split_problems(2000, 200, 200, categories=["level1"])  # 1,276 level1 arithmetics in all
    with pytest.raises(ValueError, match=">= 0"):
        split_problems(10, -1)
    assert split_problems(60, 6).test == []


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers")),
    reason="math_distill.run imports transformers",
)
@pytest.mark.parametrize("argv", [["--quick"], []])
def test_the_pipeline_trains_only_on_training_problems(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``math_distill.run`` with its training stand-ins recording what they are given: the
    teacher's tapes for SFT and the RL pool come from ``train``, which shares no arithmetic
    with the test split of the same run."""
    import examples.math_distill as md
    import examples.math_study.rl_stage as rl
    from tapekit import FunctionLLM

    settings = md.parse_args([*argv, "--rl", "--split", "test", "--out", str(tmp_path)])
    seen: dict[str, list[Problem]] = {}

    class Stop(Exception):
        pass

    def teach(teacher: Any, problems: list[Problem], store: Any) -> list[Any]:
        seen["sft"] = problems
        return []

    def after_sft(model_dir: Any, train: list[Problem], heldout: Any, store: Any, s: Any) -> Any:
        seen["rl"] = train
        seen["rl_val"] = heldout
        raise Stop

    monkeypatch.setattr(md, "teach", teach)
    monkeypatch.setattr(md, "tiny_student", lambda settings, adapted: (None, None, tmp_path))
    monkeypatch.setattr(md, "student_llm", lambda *a, **k: FunctionLLM(fn=lambda p: "Answer: 0"))
    monkeypatch.setattr(md, "make_samples", lambda *a: [])
    monkeypatch.setattr(md, "train_student", lambda *a: (tmp_path, 0.0))
    monkeypatch.setattr(rl, "after_sft", after_sft)
    with pytest.raises(Stop):
        md.run(settings)
    train, val, test = md.problem_splits(settings)
    assert len(test) == settings.n_test and len(val) == settings.n_val
    assert seen["sft"] == train and seen["rl"] == train
    assert [t.id for t in seen["rl_val"]] == [p.id for p in val]
    for pool in (seen["sft"], seen["rl"]):
        assert not keys(pool) & keys(test)
        assert not keys(pool) & keys(val)
    # the training problems do not depend on whether a test split is drawn
    settings.split = "val"
    assert md.problem_splits(settings).train == train and md.problem_splits(settings).test == []


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers")),
    reason="math_distill.run imports transformers",
)
def test_split_test_evaluates_the_final_student_once_on_the_test_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--split test``: every stage on the validation split, then the tuned student (the one
    SFT saved) once on the test split; each line and ``results.json`` name the split."""
    import json

    import examples.math_distill as md
    from tapekit import FunctionLLM

    loaded: list[tuple[Any, Any]] = []

    def student_llm(settings: Any, model_path: Any, adapter_path: Any = None) -> Any:
        loaded.append((model_path, adapter_path))
        return FunctionLLM(fn=lambda p: "Answer: 0")

    monkeypatch.setattr(md, "teach", lambda teacher, problems, store: [])
    monkeypatch.setattr(md, "tiny_student", lambda settings, adapted: (None, None, tmp_path / "base"))
    monkeypatch.setattr(md, "student_llm", student_llm)
    monkeypatch.setattr(md, "make_samples", lambda *a: [])
    monkeypatch.setattr(md, "train_student", lambda *a: (tmp_path / "tuned", 0.0))
    settings = md.parse_args(["--quick", "--split", "test", "--test-size", "30", "--out", str(tmp_path)])
    results = md.run(settings)
    assert [(r.stage, r.split, r.report.n_tasks) for r in results] == [
        ("teacher", "val", 45),
        ("zero_shot", "val", 45),
        ("sft", "val", 45),
        ("sft", "test", 30),
    ]
    assert loaded[-1] == (str(tmp_path / "tuned"), None)  # the tuned student, not the base
    test_ids = set(results[-1].report.task_ids)
    assert test_ids == {p.id for p in md.problem_splits(settings).test}
    assert all(i.startswith("test-") for i in test_ids)
    out = capsys.readouterr().out
    # 0/30 passed: the exact (Clopper-Pearson) upper bound, not a zero-width interval
    assert "stage=sft student=tiny split=test n=30 exact=0.00 exact_95ci=[0.00,0.12]" in out
    assert [r["split"] for r in json.loads((tmp_path / "results.json").read_text())] == [
        "val",
        "val",
        "val",
        "test",
    ]
