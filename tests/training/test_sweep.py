"""The sweep runner (tapekit.training: config_grid, sample_configs, run_sweep, read_sweep): the
configurations it makes, a results file that resumes after a kill, failed runs recorded and
retried on request, and a ValueError naming each kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tapekit.training import SweepRow, config_grid, read_sweep, run_sweep, sample_configs

SPACE = {"lr": [1e-4, 2e-4, 5e-4], "temperature": [0.5, 1.0], "group": [4, 8]}


class Recorder:
    """A run that records its calls and returns a metric made from its arguments; it raises
    for the configurations and seeds in ``fail``."""

    def __init__(self, fail: set[tuple[float, int]] | None = None) -> None:
        self.calls: list[tuple[dict[str, Any], int]] = []
        self.fail = fail or set()

    def __call__(self, config: dict[str, Any], seed: int) -> dict[str, float]:
        self.calls.append((config, seed))
        if (config["lr"], seed) in self.fail:
            raise RuntimeError(f"diverged at lr {config['lr']}")
        return {"score": 1000 * config["lr"] + seed, "steps": 3}


def test_the_grid_is_the_full_factorial_last_hyperparameter_fastest() -> None:
    grid = config_grid(SPACE)
    assert len(grid) == 12
    assert grid[:3] == [
        {"lr": 1e-4, "temperature": 0.5, "group": 4},
        {"lr": 1e-4, "temperature": 0.5, "group": 8},
        {"lr": 1e-4, "temperature": 1.0, "group": 4},
    ]
    assert grid[-1] == {"lr": 5e-4, "temperature": 1.0, "group": 8}
    assert len({json.dumps(c, sort_keys=True) for c in grid}) == 12
    assert config_grid({"flag": [True, False], "name": ["a", None]}) == [
        {"flag": True, "name": "a"},
        {"flag": True, "name": None},
        {"flag": False, "name": "a"},
        {"flag": False, "name": None},
    ]


def test_a_sample_is_seeded_distinct_and_in_grid_order() -> None:
    grid = config_grid(SPACE)
    sample = sample_configs(SPACE, 5, seed=3)
    assert sample == sample_configs(SPACE, 5, seed=3)
    assert sample != sample_configs(SPACE, 5, seed=4)
    positions = [grid.index(c) for c in sample]
    assert positions == sorted(set(positions)) and len(positions) == 5
    assert sample_configs(SPACE, 12) == grid  # the whole grid, in order
    # every configuration is drawn about equally often over many seeds (the draw is uniform)
    counts = [0] * 12
    for seed in range(600):
        for c in sample_configs(SPACE, 3, seed=seed):
            counts[grid.index(c)] += 1
    # each count ~ Binomial(600, 1/4): mean 150, sd 10.6; 4.5 sd either side
    assert all(102 < k < 198 for k in counts), counts
    for bad in (0, 13, 2.5):
        with pytest.raises(ValueError, match="n must be an int from 1 to the grid's 12"):
            sample_configs(SPACE, bad)  # type: ignore[arg-type]


def test_a_balanced_sample_holds_every_value_evenly() -> None:
    space = {"lr": [1e-4, 2e-4, 5e-4], "temperature": [0.5, 1.0], "group": [4, 8, 16], "kl": [0.0, 0.05]}
    grid = config_grid(space)
    for seed in range(20):
        sample = sample_configs(space, 12, seed=seed, balanced=True)
        assert sample == sample_configs(space, 12, seed=seed, balanced=True)
        positions = [grid.index(c) for c in sample]
        assert positions == sorted(set(positions)) and len(positions) == 12
        for name, values in space.items():
            counts = [sum(c[name] == v for c in sample) for v in values]
            assert counts == [12 // len(values)] * len(values), (seed, name, counts)
    # 5 of a 2 x 3 grid: the values as even as 5 allows (3 and 2; 2, 2 and 1)
    sample = sample_configs({"a": [0, 1], "b": [0, 1, 2]}, 5, seed=1, balanced=True)
    assert sorted(sum(c["a"] == v for c in sample) for v in (0, 1)) == [2, 3]
    assert sorted(sum(c["b"] == v for c in sample) for v in (0, 1, 2)) == [1, 2, 2]
    # the plain draw leaves values short at times; the balanced one never does
    short = [sample_configs(space, 12, seed=s) for s in range(20)]
    assert any(sum(c["temperature"] == 1.0 for c in sample) != 6 for sample in short)


def test_run_sweep_runs_each_config_and_seed_once_seed_major(tmp_path: Path) -> None:
    path = tmp_path / "sweep" / "results.jsonl"
    run = Recorder()
    configs = config_grid({"lr": [1e-4, 2e-4], "temperature": [0.5]})
    seen: list[SweepRow] = []
    rows = run_sweep(run, configs, [0, 1], path, on_row=seen.append)
    assert [(c["lr"], s) for c, s in run.calls] == [(1e-4, 0), (2e-4, 0), (1e-4, 1), (2e-4, 1)]
    assert rows == seen and [r.metrics["score"] for r in rows] == pytest.approx([0.1, 0.2, 1.1, 1.2])
    assert all(r.error is None and r.seconds >= 0 for r in rows)
    assert read_sweep(path) == rows  # the file holds exactly what was returned
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["config"] == {"lr": 1e-4, "temperature": 0.5}
    # the same call again runs nothing; one more seed runs only that seed
    assert run_sweep(run, configs, [0, 1], path) == rows and len(run.calls) == 4
    more = run_sweep(run, configs, [0, 1, 2], path)
    assert [(c["lr"], s) for c, s in run.calls[4:]] == [(1e-4, 2), (2e-4, 2)]
    assert more[:4] == rows and len(read_sweep(path)) == 6


def test_a_killed_sweep_resumes_after_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    configs = config_grid({"lr": [1e-4, 2e-4, 5e-4], "temperature": [0.5]})
    run_sweep(Recorder(), configs[:2], [0], path)
    whole = path.read_bytes()
    # a kill in the middle of writing the third row: half a line, no newline
    third = json.dumps(SweepRow(config=configs[2], seed=0, metrics={"score": 0.5}).model_dump())
    path.write_bytes(whole + third[: len(third) // 2].encode())
    assert len(read_sweep(path)) == 2  # the reader ignores the torn line
    run = Recorder()
    rows = run_sweep(run, configs, [0], path)
    assert [c["lr"] for c, _ in run.calls] == [5e-4]  # only the torn run is done again
    assert path.read_bytes().startswith(whole) and path.read_bytes().endswith(b"\n")
    assert [r.config["lr"] for r in rows] == [1e-4, 2e-4, 5e-4]
    assert read_sweep(path) == rows  # the torn half is gone from the file, not glued to the new row
    # a malformed line that is not the last is an error, not silently dropped
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="line 2 is not a sweep row"):
        run_sweep(run, configs, [0], path)
    with pytest.raises(ValueError, match="line 2 is not a sweep row"):
        read_sweep(path)


def test_a_failed_run_is_recorded_skipped_and_retried_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    configs = config_grid({"lr": [1e-4, 2e-4], "temperature": [0.5]})
    rows = run_sweep(Recorder(fail={(1e-4, 1)}), configs, [0, 1], path)
    failed = [r for r in rows if r.error is not None]
    assert len(failed) == 1 and failed[0].seed == 1 and failed[0].metrics == {}
    assert failed[0].error == "RuntimeError: diverged at lr 0.0001"
    assert len(rows) == 4  # the sweep went on after the failure
    run = Recorder()
    assert run_sweep(run, configs, [0, 1], path) == rows and run.calls == []  # skipped
    retried = run_sweep(run, configs, [0, 1], path, retry_failed=True)
    assert [(c["lr"], s) for c, s in run.calls] == [(1e-4, 1)]
    assert all(r.error is None for r in retried)
    # the file keeps the history; the reader keeps each run's last row
    assert len(read_sweep(path, history=True)) == 5
    latest = read_sweep(path)
    assert len(latest) == 4 and all(r.error is None for r in latest)
    # a run that returns something that is not metrics is a failed run too
    bad = run_sweep(lambda c, s: [1.0], configs, [7], path)  # type: ignore[arg-type, return-value]
    assert all(r.error is not None and r.error.startswith("TypeError: run returned a list") for r in bad)


def test_values_read_back_with_their_types(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    configs = [{"a": 1, "b": True, "c": "x", "d": None, "e": 1.0}]
    run_sweep(lambda c, s: {"m": 0.5}, configs, [0], path)
    (row,) = read_sweep(path)
    assert row.config == configs[0]
    assert [type(v) for v in row.config.values()] == [int, bool, str, type(None), float]


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({}, "space is empty"),
        ({"lr": []}, r"space\['lr'\] is empty"),
        ({"lr": "0.1"}, r"space\['lr'\] must be a list of values"),
        ({"lr": [0.1, 0.1]}, r"space\['lr'\] lists 0.1 twice"),
        (
            {"layers": [[64, 64]]},
            r"layers=\[64, 64\] is a list; a hyperparameter's value must be a JSON scalar",
        ),
        ({"lr": [float("nan")]}, "lr=nan is not finite"),
    ],
)
def test_a_bad_space_is_refused_by_name(space: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_grid(space)
    with pytest.raises(ValueError, match=message):
        sample_configs(space, 1)


@pytest.mark.parametrize(
    ("configs", "seeds", "message"),
    [
        ([], [0], "configs is empty"),
        (
            [{"lr": 1}, {"lr": 2, "t": 1}],
            [0],
            r"configs\[1\] sets \['lr', 't'\].*only in configs\[1\]: \['t'\]",
        ),
        ([{"lr": 1}, {"lr": 1}], [0], r"configs\[1\] repeats configs\[0\]"),
        ([{"lr": object()}], [0], r"configs\[0\]: lr=<object.*is a object"),
        ([{"lr": 1}], [0, 1, 0], "seeds lists 0 twice"),
        ([{"lr": 1}], [], "seeds is empty"),
        ([{"lr": 1}], ["0"], "a seed must be an int"),
    ],
)
def test_bad_configs_or_seeds_are_refused_by_name(
    tmp_path: Path, configs: list[dict[str, Any]], seeds: list[Any], message: str
) -> None:
    run = Recorder()
    with pytest.raises(ValueError, match=message):
        run_sweep(run, configs, seeds, tmp_path / "results.jsonl")
    assert run.calls == [] and not (tmp_path / "results.jsonl").exists()


def test_a_results_file_of_another_space_is_refused_naming_the_keys(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    run_sweep(Recorder(), config_grid({"lr": [1e-4], "temperature": [0.5]}), [0], path)
    before = path.read_bytes()
    with pytest.raises(
        ValueError,
        match=r"different space.*only in the file: \['temperature'\]; only in the configs: \['kl'\]",
    ):
        run_sweep(Recorder(), config_grid({"lr": [1e-4], "kl": [0.0]}), [0], path)
    assert path.read_bytes() == before
