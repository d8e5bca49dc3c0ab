"""Summarise the teacherless RL study (examples/web_agent/teacherless.py): tables and a picture.

Reads ``screen.json``, ``test.json``, ``probe.jsonl``, ``ledger.jsonl`` and each ``rl-*seed*/`` folder's
``rl_log.jsonl`` and ``val.jsonl`` under the study's ``--out`` folder, and writes into ``--to``:

- ``summary.json`` and ``table.md``: the screening (every candidate's validation success and
  the choice); each policy's decoding chosen on validation (greedy or one sample at T = 1,
  from ``val.jsonl``, ``screen.json`` and ``probe.jsonl``: the higher, greedy on a tie); the
  student's and each training seed's final success on the RL tasks' test seeds, per task,
  under the chosen decodings (the primary figure), greedy, and sampled; the gain after − before
  with the **training seed as the unit** (``tapekit.evaluate.seed_paired_difference``: the
  mean over seeds of each seed's mean per-episode difference, an item-bootstrap interval with
  items resampled within tasks and the seeds held fixed, and a seed-level Student-t interval);
  the same on the 14 teacher tasks' test seeds (forgetting), per task; and every run's steps
  and seconds;
- ``curves.png``: validation success on the RL tasks along GRPO (one line per seed, from its
  own student's), and the rollouts' mean reward per step.

A run that records the student it started from (``student.json``: a rebuilt student) is
compared with that student: its greedy and T = 1 validation figures come from ``probe.jsonl``
lines carrying its id; runs without the record started from the first student.

Needs matplotlib (``pip install 'tapekit[plots]'``).

    python scripts/plot_teacherless.py runs/teacherless --to docs/experiments/web-teacherless
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tapekit.evaluate import clopper_pearson, seed_paired_difference
from tapekit.web.miniwob import SPLIT, TEACHERLESS_TASKS


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none when it is missing)."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def arm_of(run: str) -> str:
    """A run folder's arm: ``rl-seed0`` → ``""`` (the study's first setting), ``rl-t07-seed1``
    → ``"t07"`` (as examples/web_agent/teacherless.py names them)."""
    return run.removeprefix("rl-").rsplit("seed", 1)[0].removesuffix("-")


def success(table: dict[str, dict[str, float]], tasks: list[str]) -> dict[str, Any]:
    """Per task and overall: passes, episodes, success with its exact interval."""
    out: dict[str, Any] = {}
    total = passed = 0
    for task in tasks:
        values = list(table.get(task, {}).values())
        k, n = int(sum(values)), len(values)
        total, passed = total + n, passed + k
        if n:
            e = clopper_pearson(k, n)
            out[task] = {"passed": k, "n": n, "success": k / n, "low": e.low, "high": e.high}
    if total:
        e = clopper_pearson(passed, total)
        out["all"] = {"passed": passed, "n": total, "success": passed / total, "low": e.low, "high": e.high}
    return out


def key_of(key: str | dict[str, str], policy: str) -> str:
    """The test entry of ``policy`` that ``key`` names: ``"per_task"`` (greedy), ``"sampled"``
    (one sample at T = 1), or per policy (a policy → key mapping: each under its chosen decoding)."""
    return key if isinstance(key, str) else key[policy]


def gain(
    test: dict[str, Any], runs: list[str], tasks: list[str], key: str | dict[str, str] = "per_task"
) -> Any:
    """After − before on ``tasks``' test episodes, the training seed as the unit (None: no run).
    ``key`` says which episodes of a policy (see :func:`key_of`)."""
    before = test["student"][key_of(key, "student")]
    pairs: dict[str, dict[str, tuple[float, float]]] = {}
    for run in runs:
        if key_of(key, run) not in test[run]:
            continue
        after = test[run][key_of(key, run)]
        pairs[run] = {
            f"{t}/{s}": (after[t][s], before[t][s])
            for t in tasks
            for s in after.get(t, {})
            if s in before.get(t, {})
        }
    pairs = {r: p for r, p in pairs.items() if p}
    if not pairs:
        return None
    return seed_paired_difference(pairs, strata=lambda item: item.rsplit("/", 1)[0], n_resamples=10_000)


def run_student(root: Path, run: str) -> str | None:
    """The id of the student ``run`` started from (its ``student.json``; None: the first
    student, from before runs recorded it)."""
    path = root / run / "student.json"
    return json.loads(path.read_text())["student"] if path.exists() else None


def tested_student(root: Path, runs: list[str]) -> str | None:
    """The student the test's runs started from (the test stage scores ``sft/final``, the one
    they share); a ``SystemExit`` when they started from different students."""
    students = {run_student(root, r) for r in runs}
    if len(students) > 1:
        raise SystemExit(f"the tested runs started from different students: {sorted(map(str, students))}")
    return students.pop() if students else None


def student_figures(root: Path, student: str | None) -> tuple[float | None, float | None]:
    """A student's validation success on the RL tasks, greedy and sampled once at T = 1. The
    first student (None): greedy from the screening (the same seeds), sampled from its
    ``probe.jsonl`` line (one without a ``student`` field); a rebuilt student: its own probe
    lines at temperatures 0 and 1 (the last of each)."""
    found: dict[float, float] = {}
    for p in lines(root / "probe.jsonl"):
        if p["policy"] == "student" and p.get("student") == student:
            found[p["temperature"]] = p["success"]
    greedy = student_validation(root) if student is None else found.get(0)
    return greedy, found.get(1)


def decodings(root: Path, policies: list[str], student: str | None = None) -> dict[str, dict[str, Any]]:
    """Each policy's validation success on the RL tasks greedy (the student's screening or probe,
    a seed's last validation point) and sampled once at T = 1 (its last ``probe.jsonl`` line at
    temperature 1), and its chosen decoding: the test key of the higher (``"sampled"`` or
    ``"per_task"``, greedy on a tie; None while either figure is missing). ``"student"`` is the
    student ``student`` names (see :func:`student_figures`)."""
    probes = {p["policy"]: p["success"] for p in lines(root / "probe.jsonl") if p.get("temperature") == 1}
    out: dict[str, dict[str, Any]] = {}
    for policy in policies:
        if policy == "student":
            greedy, sampled = student_figures(root, student)
        else:
            points = lines(root / policy / "val.jsonl")
            greedy, sampled = (points[-1]["success"] if points else None), probes.get(policy)
        chosen = None
        if greedy is not None and sampled is not None:
            chosen = "sampled" if sampled > greedy else "per_task"
        out[policy] = {"greedy": greedy, "sampled": sampled, "chosen": chosen}
    return out


def main(argv: list[str] | None = None) -> None:
    """Write ``summary.json``, ``table.md`` and ``curves.png`` for the study in ``argv``."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("folder", type=Path, help="the study's --out folder")
    p.add_argument("--to", type=Path, required=True)
    args = p.parse_args(argv)
    args.to.mkdir(parents=True, exist_ok=True)
    root: Path = args.folder
    screen = json.loads((root / "screen.json").read_text()) if (root / "screen.json").exists() else None
    test = json.loads((root / "test.json").read_text()) if (root / "test.json").exists() else {}
    runs = sorted(r for r in test if r.startswith("rl-"))
    rl_tasks, teacher_tasks = list(TEACHERLESS_TASKS), list(SPLIT.train_tasks)
    summary: dict[str, Any] = {"screen": screen, "ledger": lines(root / "ledger.jsonl"), "runs": {}}
    md = ["# Teacherless RL: the tables", ""]
    if screen:
        md += ["## Screening (validation seeds, greedy)", "", "| task | success | chosen |", "|---|---|---|"]
        for task, value in screen["success"].items():
            shown = "—" if value is None else f"{value:.2f}"
            md.append(f"| {task} | {shown} | {'yes' if task in screen['chosen'] else ''} |")
        md.append("")
    student = tested_student(root, runs)
    recorded = test.get("student", {}).get("student")  # the test stage records the id it scored
    if recorded is not None and student is not None and recorded != student:
        raise SystemExit(f"the test scored student {recorded}; the tested runs started from {student}")
    choice = decodings(root, ["student", *runs], student)
    summary["decodings"] = choice
    sampled = "sampled" in test.get("student", {})  # each policy sampled once at T = 1
    sections: list[tuple[str, list[str], str | dict[str, str], list[str]]] = []
    for arm in dict.fromkeys(arm_of(r) for r in runs):  # the first arm (""), then changed settings
        arm_runs = [r for r in runs if arm_of(r) == arm]
        tag = f" [arm {arm}]" if arm else ""
        picks = {p: choice[p]["chosen"] for p in ["student", *arm_runs]}
        # the primary figure waits for every policy's two validation figures
        chosen = picks if "student" in test and all(picks.values()) else None
        if chosen is not None:
            name = f"RL tasks{tag}, each policy under its chosen decoding (primary)"
            sections.append((name, rl_tasks, chosen, arm_runs))
        sections.append((f"RL tasks{tag}", rl_tasks, "per_task", arm_runs))
        if sampled:
            sections.append((f"RL tasks{tag}, sampled at T = 1", rl_tasks, "sampled", arm_runs))
        if chosen is not None:
            name = f"teacher tasks (forgetting){tag}, chosen decoding"
            sections.append((name, teacher_tasks, chosen, arm_runs))
        sections.append((f"teacher tasks (forgetting){tag}", teacher_tasks, "per_task", arm_runs))
        if sampled:
            name = f"teacher tasks (forgetting){tag}, sampled at T = 1"
            sections.append((name, teacher_tasks, "sampled", arm_runs))
    if choice:
        md += ["## Decoding chosen on validation (RL tasks' validation seeds)", ""]
        md += ["| policy | greedy | sampled at T = 1 | chosen |", "|---|---|---|---|"]
        for policy, c in choice.items():
            cells = [("—" if v is None else f"{v:.3f}") for v in (c["greedy"], c["sampled"])]
            label = {"per_task": "greedy", "sampled": "T = 1", None: "—"}[c["chosen"]]
            md.append(f"| {policy} | {cells[0]} | {cells[1]} | {label} |")
        md.append("")
    for name, tasks, key, arm_runs in sections:
        if "student" not in test:
            break
        policies = ["student", *(r for r in arm_runs if key_of(key, r) in test[r])]
        if not all(key_of(key, x) in test[x] for x in policies):
            continue
        table = {policy: success(test[policy][key_of(key, policy)], tasks) for policy in policies}
        summary["runs"][name] = table
        header = [
            p if isinstance(key, str) else f"{p} ({'T = 1' if key[p] == 'sampled' else 'greedy'})"
            for p in policies
        ]
        md += [
            f"## Test seeds: {name}",
            "",
            "| task | " + " | ".join(header) + " |",
            "|---" * (len(policies) + 1) + "|",
        ]
        for task in [*tasks, "all"]:
            cells = []
            for policy in policies:
                row = table[policy].get(task)
                cells.append("—" if row is None else f"{row['success']:.2f} ({row['passed']}/{row['n']})")
            md.append(f"| {task} | " + " | ".join(cells) + " |")
        difference = gain(test, arm_runs, tasks, key)
        if difference is not None:
            summary[f"gain {name}"] = difference.model_dump()
            md += ["", f"After − before, the training seed as the unit: {difference}", ""]
            per_task_lines = []
            for task in tasks:
                d = gain(test, arm_runs, [task], key)
                if d is not None:
                    per_task_lines.append(f"- {task}: {d}")
            md += [*per_task_lines, ""]
    for run_dir in sorted(root.glob("rl-*seed*")):
        steps = lines(run_dir / "rl_log.jsonl")
        summary.setdefault("rl", {})[run_dir.name] = {
            "steps": len(steps),
            "seconds": round(sum(s.get("step_seconds", 0.0) for s in steps), 1),
            "validation": lines(run_dir / "val.jsonl"),
        }
    (args.to / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (args.to / "table.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    plot(root, args.to / "curves.png")


def student_validation(root: Path) -> float | None:
    """The student's validation success on the RL tasks (the screening: the same seeds,
    greedy), the curves' point at 0 updates."""
    screen = json.loads((root / "screen.json").read_text()) if (root / "screen.json").exists() else {}
    values = [v for t in TEACHERLESS_TASKS for v in screen.get("per_task", {}).get(t, {}).values()]
    return sum(values) / len(values) if values else None


def moving_mean(values: list[float], width: int) -> list[float]:
    """The mean of each value and the ``width - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= width:
            total -= values[i - width]
        out.append(total / min(i + 1, width))
    return out


def plot(root: Path, path: Path, smooth: int = 10) -> None:
    """Validation success along GRPO (from the student's, at 0 updates) and the rollouts' mean
    reward per step (thin) with its ``smooth``-step moving mean (thick), one colour per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, run_dir in enumerate(sorted(root.glob("rl-*seed*"))):
        colour = f"C{i}"
        start = student_figures(root, run_student(root, run_dir.name))[0]  # its own student's
        val = lines(run_dir / "val.jsonl")
        points = ([(0, start)] if start is not None else []) + [(v["step"], v["success"]) for v in val]
        if val:
            left.plot(*zip(*points, strict=True), marker="o", color=colour, label=run_dir.name)
        steps = lines(run_dir / "rl_log.jsonl")
        if steps:
            x = [s["step"] + 1 for s in steps]  # updates done after the step
            y = [s.get("reward_mean") or 0.0 for s in steps]
            right.plot(x, y, color=colour, alpha=0.25, linewidth=0.8)
            right.plot(x, moving_mean(y, smooth), color=colour, label=run_dir.name)
    left.set(xlabel="GRPO updates", ylabel="validation success (RL tasks, greedy)", ylim=(0, 1))
    right.set(xlabel="GRPO updates", ylabel=f"rollouts' mean reward ({smooth}-step mean)", ylim=(0, 1))
    for ax in (left, right):
        if ax.lines and ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
