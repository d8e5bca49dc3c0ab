"""The SEC study's mechanics (``examples/math_study/sec_study.py``) on an untrained tiny model
and tiny sizes: the probe's reachable levels become the ``reachable`` arm's pool (and a probe
that finds none is refused), the ``resample`` arm redraws its groups without a signal, each run
is scored on exactly the test split, and the summary pairs SEC with each control by problem."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.examples._commands import load_script

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "datasets")),
    reason="the study trains (the train extra)",
)


def test_the_study_runs_each_arm_on_its_pool_and_pairs_sec_with_the_controls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from examples.math_study import sec_study
    from examples.math_study.agents import SHORT_SYSTEM
    from tapekit.testing.tiny import TinyConfig, make_tiny

    torch.set_num_threads(2)
    monkeypatch.setattr(sec_study, "N_TRAIN", 50)
    monkeypatch.setattr(sec_study, "N_VAL", 10)
    monkeypatch.setattr(sec_study, "N_TEST", 10)
    monkeypatch.setattr(sec_study, "SECONDS", 1e-6)  # one step per run
    monkeypatch.setattr(sec_study, "PROBE_PER_LEVEL", 2)
    monkeypatch.setattr(sec_study, "PROBE_SAMPLES", 2)
    small = {"tasks_per_step": 2, "group_size": 2, "max_tokens": 8}
    arms = {arm: {**settings, **small} for arm, settings in sec_study.ARM_SETTINGS.items()}
    monkeypatch.setattr(sec_study, "ARM_SETTINGS", arms)
    train, _, test = sec_study.splits(tmp_path)
    texts = [SHORT_SYSTEM, *(p.question for p in train), "calculator: 12+7", "Answer: 19"]
    make_tiny(
        texts, TinyConfig(vocab_size=300, hidden_size=32, intermediate_size=64), sec_study.sft_model(tmp_path)
    )

    probe = sec_study.cmd_probe(tmp_path)
    assert set(probe["success"]) == set(sec_study.LEVELS5) and probe["reachable"] == []  # an untrained model
    with pytest.raises(SystemExit, match="no level"):
        sec_study.cmd_run(tmp_path, "reachable", 0)
    (tmp_path / "probe.json").write_text(json.dumps({**probe, "reachable": ["level1", "level2"]}))

    records = {arm: sec_study.cmd_run(tmp_path, arm, 0) for arm in ("sec", "reachable", "resample")}
    for arm, record in records.items():
        assert record["steps"] == 1 and set(record["test_strict"]) == {p.id for p in test}, arm
        assert json.loads((sec_study.run_dir(tmp_path, arm, 0) / "result.json").read_text())["arm"] == arm
    assert records["reachable"]["pool_levels"] == ["level1", "level2"]
    assert records["sec"]["pool_levels"] == sec_study.LEVELS5
    # every group of an untrained model is all wrong: both resample rounds redraw both tasks
    assert records["sec"]["rollouts"] == 4 and records["resample"]["rollouts"] == 12

    baseline = sec_study.cmd_baseline(tmp_path)
    assert baseline["steps"] == 0 and set(baseline["test_strict"]) == {p.id for p in test}

    summary = sec_study.cmd_summary(tmp_path)
    assert set(summary["arms"]) == {"sft", "sec", "reachable", "resample"}
    assert set(summary["comparisons"]) == {
        "sec-reachable",
        "sec-resample",
        "sec-sft",
        "reachable-sft",
        "resample-sft",
    }
    for comparison in summary["comparisons"].values():
        assert comparison["seeds"] == [0] and set(comparison["per_seed"]) == {"0"}
        d = comparison["difference"]
        assert d["low"] <= d["value"] <= d["high"]

    plot = load_script("plot_math_sec")  # scripts/plot_math_sec.py draws the docs' pictures from these logs
    data = plot.load(tmp_path)
    text = plot.table(data)
    assert (
        sum(
            line.startswith(("| sec | 0 |", "| reachable | 0 |", "| resample | 0 |"))
            for line in text.splitlines()
        )
        == 3
    )
    assert "| reachable | 0 | 1,2 | 1 | 4 |" in text and "| sec − resample | 1 |" in text
    assert "| sft | 0 | – | 0 | 0 | – |" in text and "| resample − sft | 1 |" in text
    pytest.importorskip("matplotlib")  # in the dev extra
    plot.plot(data, tmp_path)
    assert (tmp_path / "draws.png").stat().st_size > 10_000 and (
        tmp_path / "zero_adv.png"
    ).stat().st_size > 10_000
