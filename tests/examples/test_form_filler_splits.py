"""The form-filling study's method (issue 29): fixed, disjoint splits with the test companies
touched only by ``--split test`` and the fresh ones (issue 44: made-up companies no run had
scored) only by ``--split fresh``, the GREADTH filter over the teacher's tapes, and the paired
statistics over the same turns (hand-made labels with known answers). Fast: no student."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from examples.form_filler import run
from examples.form_filler.agents import make_teacher
from examples.form_filler.greadth import GreadthReport, TurnLabels, label_turns
from examples.form_filler.greadth_rules import CRITERIA
from examples.form_filler.oracle import OracleLLM
from examples.form_filler.schema import load_form_set
from examples.form_filler.tree import TreeSettings, grow_tree

FORMS = load_form_set()


def _names(companies: list[Any]) -> tuple[set[str], set[str]]:
    return {c.name for c in companies}, {f.name for c in companies for f in c.forms}


FRESH = run.make_splits(FORMS, 0).fresh


@pytest.mark.parametrize("synthetic", [0, 15, 40, 150, run.FRESH_AVOIDS])
def test_splits_are_fixed_and_disjoint(synthetic: int) -> None:
    splits = run.make_splits(FORMS, synthetic)
    assert len(splits.made_up) == synthetic and len(splits.val) == run.VALIDATION_COMPANIES
    assert len(splits.fresh) == run.FRESH_COMPANIES
    assert [c.name for c in splits.train] == [c.name for c in [*FORMS.train, *splits.made_up]]
    assert [c.name for c in splits.test] == [c.name for c in FORMS.test]
    names = {s: _names(splits.companies(s)) for s in ("train", "val", "test", "fresh")}
    for a in names:
        for b in names:
            if a < b:
                assert not names[a][0] & names[b][0], (a, b)  # companies
                assert not names[a][1] & names[b][1], (a, b)  # forms
    # neither the validation nor the fresh companies depend on how many made-up training ones there are
    assert [c.model_dump() for c in splits.val] == [c.model_dump() for c in run.make_splits(FORMS, 0).val]
    assert [c.model_dump() for c in splits.fresh] == [c.model_dump() for c in FRESH]
    catalog = splits.catalog()
    assert all(
        catalog.company(c.name) == c for c in [*splits.val, *splits.test, *splits.fresh, *splits.made_up[:2]]
    )


def test_the_fresh_companies_are_new() -> None:
    """Drawn with their own seed (no run before issue 44 drew it): no company, form or form
    description in common with any split, and valid like the others."""
    from examples.form_filler.schema import FormSet, check_form_set

    assert check_form_set(FormSet(train=FRESH, test=[]), forms_per_company=10, all_kinds=True) == []
    splits = run.make_splits(FORMS, 40)  # the study's training companies
    others = [*splits.train, *splits.val, *splits.test]
    fresh_forms = [f for c in FRESH for f in c.forms]
    assert not {f.name for f in fresh_forms} & {f.name for c in others for f in c.forms}
    assert not {f.description for f in fresh_forms} & {f.description for c in others for f in c.forms}
    assert run.FRESH_SEED not in (run.VALIDATION_SEED, 0)  # the made-up training companies' seed is 0


def test_overlapping_splits_are_refused() -> None:
    splits = run.make_splits(FORMS, 2)
    with pytest.raises(ValueError, match="share names"):
        run.check_disjoint(run.Splits(train=splits.train, val=[splits.made_up[0]], test=splits.test))
    with pytest.raises(ValueError, match="no split"):
        splits.companies("dev")


class _Stop(Exception):
    pass


@pytest.mark.parametrize("flag", [[], ["--split", "val"], ["--split", "test"], ["--split", "fresh"]])
def test_test_companies_are_touched_only_with_split_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str]
) -> None:
    """Every tree ``run`` grows before the students (the only use of companies' dialogues) is
    recorded: the bundled test companies appear only under ``--split test``, the fresh ones only
    under ``--split fresh``, the validation ones only under ``--split val``."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    grown: list[tuple[str, str]] = []

    def grow(
        teacher: Any, companies: list[Any], tree: Any, store: Any, name: str, users: Any = None
    ) -> list[Any]:
        grown.extend((name, c.name) for c in companies)
        return []

    def stop(*args: Any) -> Any:
        raise _Stop

    monkeypatch.setattr(run, "grow_trees", grow)
    monkeypatch.setattr(run, "students", stop)
    settings = run.parse_args(["--quick", "--synthetic", "2", "--out", str(tmp_path), *flag])
    with pytest.raises(_Stop):
        run.run(settings)
    scored = {
        "test": {c.name for c in FORMS.test},
        "val": {c.name for c in run.make_splits(FORMS, 0).val},
        "fresh": {c.name for c in FRESH},
    }
    touched = {company for _, company in grown}
    split = flag[1] if flag else "val"
    assert settings.split == split
    for name, companies in scored.items():
        if name == split:
            assert companies <= touched
            assert {tree for tree, c in grown if c in companies} == {f"{split}-tree"}
        else:
            assert not companies & touched, name
    assert {c.name for c in FORMS.train} <= touched


def test_split_and_filter_flags() -> None:
    settings = run.parse_args(["--filter-tapes", "both", "--error-rate", "0.2"])
    assert (settings.split, settings.filter_tapes, settings.error_rate) == ("val", "both", 0.2)
    assert settings.val_tree.seed not in (settings.test_tree.seed, settings.train_tree.seed)
    with pytest.raises(SystemExit):
        run.parse_args(["--split", "train"])


def _tree_tapes(error_rate: float) -> list[Any]:
    teacher = make_teacher(OracleLLM(error_rate=error_rate))
    tree = grow_tree(teacher, FORMS.train[0], TreeSettings(intents=4, beam_width=8))
    return [b.tape for b in tree.branches if b.error is None]


def test_filter_keeps_every_tape_of_a_careful_teacher() -> None:
    tapes = _tree_tapes(0.0)
    kept = run.filter_tapes(tapes)
    assert len(kept.kept) == len(tapes) > 20 and kept.dropped == []


def test_filter_drops_the_tapes_where_the_teacher_slipped() -> None:
    tapes = _tree_tapes(0.2)
    result = run.filter_tapes(tapes)
    assert len(result.kept) + len(result.dropped) == len(tapes)
    assert result.kept and len(result.dropped) >= 5, (len(result.kept), len(result.dropped))
    for tape in result.kept:
        assert all(t.valid and t.greadth and not t.failed_rules() for t in label_turns([tape]))
    for tape, rules in result.dropped:
        failed = {f.rule for t in label_turns([tape]) for f in t.failed_rules()}
        assert rules and set(rules) == failed
    # the oracle's slip in `generate` (values set, not acknowledged) is what the rules catch
    assert any("acknowledges_changes" in rules for _, rules in result.dropped)
    # a tape holding a dropped tape's dialogue (a longer branch of the same path) is dropped too
    kept_steps = [[s.llm_dict() for s in t.steps] for t in result.kept]
    for tape, _ in result.dropped:
        prefix = [s.llm_dict() for s in tape.steps]
        assert not any(steps[: len(prefix)] == prefix for steps in kept_steps)
    saved = json.loads(json.dumps(result.to_json()))
    assert saved["kept"] == len(result.kept) and len(saved["dropped_ids"]) == len(result.dropped)


# ----------------------------------------------------------------------------- paired statistics


def _turns(passes: list[bool], grounded: list[bool] | None = None) -> list[TurnLabels]:
    out = []
    for i, ok in enumerate(passes):
        labels = dict.fromkeys(CRITERIA, ok)
        if grounded is not None:
            labels["grounded"] = grounded[i]
        out.append(
            TurnLabels(
                tape_id=f"t{i}",
                turn=0,
                user_index=1,
                end_index=2,
                behavior=f"b{i % 3}",
                user_message=f"message {i}",
                labels=labels,
                greadth=all(labels.values()),
            )
        )
    return out


def _report() -> GreadthReport:
    n = 10
    return GreadthReport(
        turns={
            run.TEACHER: _turns([True] * n),
            run.ZERO_SHOT: _turns([False] * n),
            run.TUNED: _turns([i < 6 for i in range(n)], grounded=[True] * n),
            run.FILTERED: _turns([i < 8 for i in range(n)]),
        },
        split="val",
        n_bootstrap=500,
    )


def test_paired_differences_and_mcnemar_have_the_known_values() -> None:
    report = _report()
    up = report.paired(run.TUNED, run.ZERO_SHOT)
    assert (up.n, up.a_only, up.b_only) == (10, 6, 0)
    assert up.difference.value == pytest.approx(0.6) and up.difference.low <= 0.6 <= up.difference.high
    assert up.p_value == pytest.approx(2 / 2**6)  # six discordant turns, all one way
    down = report.paired(run.TUNED, run.TEACHER)
    assert (down.a_only, down.b_only, down.p_value) == (0, 4, pytest.approx(2 / 2**4))
    assert down.difference.value == pytest.approx(-0.4) and down.difference.excludes_zero()
    assert report.paired(run.TUNED, run.ZERO_SHOT, "grounded").difference.value == pytest.approx(1.0)
    filt = report.paired(run.FILTERED, run.TUNED)
    assert (filt.a_only, filt.b_only, filt.p_value) == (2, 0, pytest.approx(0.5))
    assert filt.difference.value == pytest.approx(0.2)


def test_gap_closed_and_its_interval() -> None:
    report = _report()
    gap = report.gap_closed(run.TUNED, run.ZERO_SHOT, run.TEACHER)
    assert gap.value == pytest.approx(0.6) and 0.0 <= gap.low <= 0.6 <= gap.high <= 1.0
    assert report.gap_closed(run.TUNED, run.ZERO_SHOT, run.TEACHER, "grounded").value == pytest.approx(1.0)
    tied = GreadthReport(turns={a: _turns([True, False]) for a in ("s", "z", "t")})
    assert math.isnan(tied.gap_closed("s", "z", "t").value)


def test_paired_statistics_of_the_run() -> None:
    report = _report()
    stats = json.loads(json.dumps(run.paired_statistics(report)))  # plain JSON
    assert stats["split"] == "val"
    assert [tuple(p) for p in stats["pairs"]] == [
        (run.TUNED, run.ZERO_SHOT),
        (run.TUNED, run.TEACHER),
        (run.FILTERED, run.ZERO_SHOT),
        (run.FILTERED, run.TEACHER),
        (run.FILTERED, run.TUNED),
    ]
    last = stats["comparisons"][-1]
    assert (last["a"], last["b"]) == (run.FILTERED, run.TUNED)
    assert set(last["metrics"]) == {*CRITERIA, "greadth"}
    assert last["metrics"]["greadth"]["difference"]["value"] == pytest.approx(0.2)
    assert stats["gap_closed"][run.FILTERED]["greadth"]["value"] == pytest.approx(0.8)
    text = _render(report.paired_table([tuple(p) for p in stats["pairs"]]))
    assert "+60.0" in text and "6 / 0" in text and "val split" in text
    only_zero = GreadthReport(turns={run.TEACHER: _turns([True]), run.ZERO_SHOT: _turns([False])})
    assert run.paired_statistics(only_zero)["pairs"] == []


def test_unpaired_turns_are_refused() -> None:
    report = _report()
    report.turns["other"] = _turns([True] * 9)
    with pytest.raises(ValueError, match="not paired"):
        report.paired("other", run.TEACHER)
    shuffled = _turns([True] * 10)
    shuffled.reverse()
    report.turns["shuffled"] = shuffled
    with pytest.raises(ValueError, match="different messages"):
        report.paired("shuffled", run.TEACHER)


def _render(table: Any) -> str:
    import io

    from rich.console import Console

    console = Console(width=300, record=True, color_system=None, file=io.StringIO())
    console.print(table)
    return console.export_text()
