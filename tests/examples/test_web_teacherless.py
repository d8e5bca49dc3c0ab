"""``examples/web_agent/teacherless.py``: the candidates are tasks with no teacher and not held
out, the RL pool never touches validation or test seeds, the screening rule, and a resumed RL
run neither repeats nor skips a validation point. The stages themselves run real Chromium and
SmolLM2 for hours: docs/experiments/web-teacherless.md is their record."""

from __future__ import annotations

import argparse
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


def test_the_tables_and_the_picture_from_a_study_with_a_known_gain(tmp_path: Path) -> None:
    # scripts/plot_teacherless.py on a made-up study folder: the student fails every RL-task test
    # episode; seed 0 then solves 8 of 32, seed 1 4, seed 2 none (+0.25, +0.125, 0: mean +0.125);
    # on the teacher tasks nothing changes (forgetting 0)
    from tapekit.web import SPLIT, TEACHERLESS_TASKS
    from tests.examples._commands import load_script

    root, to = tmp_path / "run", tmp_path / "out"
    rl_tasks, teacher = list(TEACHERLESS_TASKS), list(SPLIT.train_tasks)
    seeds = ["200000", "200001", "200002", "200003"]
    screen = {
        "success": {t: 0.25 for t in rl_tasks},
        "chosen": rl_tasks,
        "per_task": {t: {str(100_000 + i): float(i < 5) for i in range(20)} for t in rl_tasks},
    }
    items = [(t, s) for t in rl_tasks for s in seeds]

    def policy(solved: int) -> dict[str, object]:
        per_task = {t: dict.fromkeys(seeds, 0.0) for t in rl_tasks}
        for t, s in items[:solved]:
            per_task[t][s] = 1.0
        per_task.update({t: {"200000": 1.0, "200001": 1.0} for t in teacher})
        return {"per_task": per_task, "environment_failures": 0}

    test = {"student": policy(0), "rl-seed0": policy(8), "rl-seed1": policy(4), "rl-seed2": policy(0)}
    for name, solved in (
        ("student", 4),
        ("rl-seed0", 4),
        ("rl-seed1", 8),
        ("rl-seed2", 12),
    ):  # sampled at T = 1 (on the teacher tasks too: there 1 of 2 seeds passes)
        test[name]["sampled"] = policy(solved)["per_task"]
        test[name]["sampled"].update({t: {"200000": 1.0, "200001": 0.0} for t in teacher})
    root.mkdir()
    (root / "screen.json").write_text(json.dumps(screen))
    (root / "test.json").write_text(json.dumps(test))
    for k in range(3):
        run = root / f"rl-seed{k}"
        run.mkdir()
        steps = [{"step": i, "reward_mean": 0.2 + 0.01 * i, "step_seconds": 100.0} for i in range(12)]
        (run / "rl_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in steps))
        (run / "val.jsonl").write_text(json.dumps({"step": 12, "success": 0.3 + 0.1 * k}) + "\n")
    pytest.importorskip("matplotlib")  # in the dev extra
    script = load_script("plot_teacherless")
    script.main([str(root), "--to", str(to)])
    assert "chosen decoding" not in (to / "table.md").read_text()  # no probe yet: no primary figure
    # validation at T = 1: the student 0.20 (< its greedy 0.25: greedy), seed 0 0.30 (= greedy:
    # greedy on a tie), seed 1 0.50 and seed 2 0.60 (above 0.40 and 0.50: sampled)
    probes = [("student", 0.2), ("rl-seed0", 0.3), ("rl-seed1", 0.5), ("rl-seed2", 0.6), ("rl-seed2", 0.0)]
    (root / "probe.jsonl").write_text(
        "".join(
            json.dumps({"policy": n, "temperature": 1.0 if v else 0.7, "success": v}) + "\n"
            for n, v in probes
        )
    )  # the last line is a probe at another temperature: not the T = 1 figure
    script.main([str(root), "--to", str(to)])
    summary = json.loads((to / "summary.json").read_text())
    chosen = {p: c["chosen"] for p, c in summary["decodings"].items()}
    assert chosen == {
        "student": "per_task",
        "rl-seed0": "per_task",
        "rl-seed1": "sampled",
        "rl-seed2": "sampled",
    }
    primary = summary["gain RL tasks, each policy under its chosen decoding (primary)"]
    # greedy student 0/32; seed 0 greedy 8/32, seeds 1 and 2 sampled 8/32 and 12/32
    assert primary["per_seed"] == {"rl-seed0": 0.25, "rl-seed1": 0.25, "rl-seed2": 0.375}
    # forgetting under the chosen decodings: seeds 1 and 2 sampled (1 of 2) against greedy (2 of 2)
    assert summary["gain teacher tasks (forgetting), chosen decoding"]["per_seed"] == {
        "rl-seed0": 0.0,
        "rl-seed1": -0.5,
        "rl-seed2": -0.5,
    }
    assert summary["gain teacher tasks (forgetting), sampled at T = 1"]["value"] == 0.0
    # a second arm (a changed setting, rl-t07-seedS): its own tables and gains, the first arm's unchanged
    for k, solved in enumerate((16, 12)):
        name = f"rl-t07-seed{k}"
        test[name] = policy(solved)
        (root / name).mkdir()
        (root / name / "val.jsonl").write_text(json.dumps({"step": 12, "success": 0.5}) + "\n")
    (root / "test.json").write_text(json.dumps(test))
    script.main([str(root), "--to", str(to)])
    summary = json.loads((to / "summary.json").read_text())
    assert summary["gain RL tasks [arm t07]"]["per_seed"] == {"rl-t07-seed0": 0.5, "rl-t07-seed1": 0.375}
    assert summary["gain RL tasks"]["per_seed"] == {"rl-seed0": 0.25, "rl-seed1": 0.125, "rl-seed2": 0.0}
    assert (
        "gain RL tasks [arm t07], each policy under its chosen decoding (primary)" not in summary
    )  # no probe
    assert [script.arm_of(r) for r in ("rl-seed2", "rl-t07-seed10")] == ["", "t07"]
    gain = summary["gain RL tasks"]
    assert gain["value"] == pytest.approx(0.125)
    assert gain["per_seed"] == {"rl-seed0": 0.25, "rl-seed1": 0.125, "rl-seed2": 0.0}
    assert gain["n_seeds"] == 3 and gain["n_items"] == 32
    assert gain["seed_low"] < 0 < gain["seed_high"]  # three seeds this far apart: not above 0
    assert summary["gain teacher tasks (forgetting)"]["value"] == 0.0
    sampled = summary["gain RL tasks, sampled at T = 1"]  # 0, +0.125, +0.25 over the student's 4/32
    assert sampled["per_seed"] == {"rl-seed0": 0.0, "rl-seed1": 0.125, "rl-seed2": 0.25}
    assert summary["rl"]["rl-seed1"] == {
        "steps": 12,
        "seconds": 1200.0,
        "validation": [{"step": 12, "success": 0.4}],
    }
    table = (to / "table.md").read_text()
    assert "| all | 0.00 (0/32) | 0.25 (8/32) | 0.12 (4/32) | 0.00 (0/32) |" in table
    assert script.student_validation(root) == pytest.approx(0.25)
    assert script.moving_mean([1.0, 0.0, 1.0, 1.0], 2) == [1.0, 0.5, 0.5, 1.0]
    assert (to / "curves.png").stat().st_size > 20_000

    # a rebuilt student "b2": the t07 runs record it; only they are tested against it, and its
    # figures come from its own probe lines (greedy 0.30, T = 1 0.40: sampled), not the first's
    for k in range(2):
        (root / f"rl-t07-seed{k}" / "student.json").write_text(json.dumps({"student": "b2"}))
    with pytest.raises(SystemExit, match="different students"):
        script.main([str(root), "--to", str(to)])
    test = {name: entry for name, entry in test.items() if not name.startswith("rl-seed")}
    (root / "test.json").write_text(json.dumps(test))
    with (root / "probe.jsonl").open("a") as f:
        for temperature, value in ((0.0, 0.3), (1.0, 0.4)):
            f.write(
                json.dumps(
                    {"policy": "student", "student": "b2", "temperature": temperature, "success": value}
                )
            )
            f.write("\n")
    script.main([str(root), "--to", str(to)])
    summary = json.loads((to / "summary.json").read_text())
    assert summary["decodings"]["student"] == {"greedy": 0.3, "sampled": 0.4, "chosen": "sampled"}
    assert script.student_figures(root, None) == (pytest.approx(0.25), 0.2)  # the first student's
    assert script.student_figures(root, "other") == (None, None)
    test["student"]["student"] = "c3"  # the test stage scored another student than the runs'
    (root / "test.json").write_text(json.dumps(test))
    with pytest.raises(SystemExit, match="the test scored student c3; the tested runs started from b2"):
        script.main([str(root), "--to", str(to)])


def test_each_training_seed_has_its_own_rl_pool_of_training_seeds_only(tmp_path: Path) -> None:
    from examples.web_agent.teacherless import rl_config, rl_setup, sft_config
    from tapekit.web.miniwob import SPLIT, TEACHERLESS_TASKS, split_of

    tasks = list(TEACHERLESS_TASKS[:2])
    pools = [rl_setup(object(), tasks, seed, 10).tasks for seed in (0, 1, 2)]  # type: ignore[arg-type]
    ids = [{t.id for t in pool} for pool in pools]
    assert all(len(x) == 20 for x in ids) and not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    teacher_seeds = set(SPLIT.train_seeds[:500])
    for pool in pools:
        for task in pool:
            name, seed = task.id.rsplit("/", 1)
            assert task.category == name and int(seed) not in teacher_seeds
            assert split_of(name, int(seed)) == "train"  # never a validation or test seed
    assert int(pools[1][0].id.rsplit("/", 1)[1]) in SPLIT.train_seeds
    config = rl_config(
        tmp_path / "rl-seed1", seed=1, steps=3, lr=1e-5, temperature=0.7, kl_coef=0.0,
        group_key="category", tasks_per_step=2, group_size=4,
    )  # fmt: skip
    assert config.run_name == "rl-seed1" and config.rollouts.temperature == 0.7 and config.resume
    assert config.journal  # the study's runs are rebuilt from their committed journal on a new machine
    assert not sft_config(tmp_path / "sft", seed=0, max_steps=3, save_steps=1).resume
    (tmp_path / "sft" / "checkpoint-1").mkdir(parents=True)
    assert sft_config(tmp_path / "sft", seed=0, max_steps=3, save_steps=1).resume  # picks up its checkpoint


def test_a_changed_setting_runs_in_folders_of_its_own() -> None:
    from examples.web_agent.teacherless import run_name
    from tests.examples._commands import load_script

    arm_of = load_script("plot_teacherless").arm_of  # the plot reads the arm back from the folder
    assert run_name("", 1) == "rl-seed1" and run_name("t07", 0) == "rl-t07-seed0"
    assert arm_of(run_name("t07", 12)) == "t07" and arm_of(run_name("", 3)) == ""
    with pytest.raises(SystemExit, match="letters, digits"):
        run_name("t0.7", 0)  # a dot or a slash would make other folders


def test_a_fresh_checkout_runs_the_teacher_again_and_holds_it_to_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """teacher.json is committed and tapes.db is not: the SFT stage must not look up tapes that
    are gone, it runs the teacher again, and a teacher that solves a different number of
    episodes than the record stops the stage (the student would not be the study's)."""
    import argparse
    from types import SimpleNamespace

    from examples.web_agent import teacherless

    solved_now: list[int] = [3]
    trained: list[int] = []

    opened: list[object] = []

    class _Env:
        def __init__(self, **kw: object) -> None:
            opened.append(kw.get("max_concurrent"))

        def __enter__(self) -> _Env:
            return self

        def __exit__(self, *_: object) -> None: ...

    def evaluate(*_: object, **__: object) -> object:
        samples = [SimpleNamespace(tape_id=f"new{i}") for i in range(solved_now[0])]
        return SimpleNamespace(samples=samples, tapes={s.tape_id for s in samples})

    monkeypatch.setattr(teacherless, "load_student", lambda: (None, None))
    monkeypatch.setattr(teacherless, "WebEnvironment", _Env)
    monkeypatch.setattr(teacherless, "evaluate", evaluate)
    monkeypatch.setattr(teacherless, "sample_reward", lambda _s: 1.0)
    monkeypatch.setattr(teacherless, "student_sft_data", lambda _st, ids, *_: (ids, []))
    monkeypatch.setattr(teacherless, "train_sft", lambda data, *_, **__: trained.append(len(data)))
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "teacher.json").write_text(json.dumps({"episodes": 4, "solved": ["a", "b", "c"]}))
    args = argparse.Namespace(teacher_seeds=1, teacher_concurrency=2, sft_steps=1, new_student=False)

    teacherless.stage_sft(args, tmp_path)
    assert json.loads((tmp_path / "sft" / "teacher.json").read_text())["solved"] == ["new0", "new1", "new2"]
    assert trained == [3]
    assert opened == [2]  # the teacher drives --teacher-concurrency pages at once
    teacherless.stage_sft(args, tmp_path)  # the stub stores no tape: again a fresh checkout, same count
    assert trained == [3, 3]
    solved_now[0] = 2
    (tmp_path / "sft" / "teacher.json").write_text(json.dumps({"episodes": 4, "solved": ["gone"]}))
    with pytest.raises(SystemExit, match=r"solved 2 of \d+ episodes again, the record says 3.*--new-student"):
        teacherless.stage_sft(args, tmp_path)
    assert trained == [3, 3]
    (tmp_path / "sft" / "teacher.json").write_text(json.dumps({"episodes": 4, "solved": ["gone"]}))
    teacherless.stage_sft(argparse.Namespace(**{**vars(args), "new_student": True}), tmp_path)
    assert trained == [3, 3, 2]  # a new student, on the episodes solved now
    assert json.loads((tmp_path / "sft" / "teacher.recorded.json").read_text())["solved"] == ["a", "b", "c"]


def test_the_command_line_takes_the_sft_stage_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The sft stage's options reach it from the command line (a Namespace built by hand in the
    test above once hid that --new-student was not on the parser)."""
    from examples.web_agent import teacherless

    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(teacherless, "stage_sft", lambda args, out: seen.append(args))
    teacherless.main(["sft", "--out", str(tmp_path)])
    teacherless.main(["sft", "--out", str(tmp_path), "--new-student", "--teacher-concurrency", "3"])
    assert [(a.new_student, a.teacher_concurrency) for a in seen] == [(False, 8), (True, 3)]


def test_a_run_records_its_student_and_refuses_another(tmp_path: Path) -> None:
    """An RL run resumed after the student was rebuilt would continue checkpoints of the first
    student under the second one's name: the run records the student it started from (a hash
    of the weights) and stops on another."""
    from examples.web_agent import teacherless

    weights = tmp_path / "sft" / "final" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"first student")
    first = teacherless.student_id(tmp_path)
    run = tmp_path / "rl-t07-seed0"
    run.mkdir()
    teacherless.check_student(run, first)
    teacherless.check_student(run, first)  # resumed on the same student: fine
    assert json.loads((run / "student.json").read_text()) == {"student": first}
    assert teacherless.started_from(run) == first and teacherless.started_from(tmp_path / "rl-seed0") is None
    weights.write_bytes(b"second student")
    second = teacherless.student_id(tmp_path)
    assert second != first and len(second) == 16
    with pytest.raises(SystemExit, match=f"started from student {first}; sft/final is now {second}"):
        teacherless.check_student(run, second)
