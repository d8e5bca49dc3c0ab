"""What GRPO learnt on click-tab, goal by goal (docs/experiments/web-training.md).

    # once per run, from its tapes: each pool seed's goal, to OUT/goals.json
    python docs/experiments/web-training/quick_goals.py extract RUN_DIR OUT_DIR
    # the table: per run and goal, the pool seeds' success before and after GRPO
    python docs/experiments/web-training/quick_goals.py table docs/experiments/web-training/quick-steps/*

``extract`` reads the first observation of every tape in ``RUN_DIR/tapes.db`` (not committed:
4 MB a run) and writes ``{task id: goal}`` for the seeds it finds. ``table`` groups the pool
seeds of each run by goal ("Click on Tab #2.") and prints, per group, the greedy success after
SFT and after GRPO and the sampled success in GRPO's step-0 rollouts (the SFT student) and in
its last two steps' rollouts: a policy that reads the goal improves every group; one that
learnt a single answer solves one group and fails the others.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

from tapekit import open_store


def extract(run: Path, out: Path) -> None:
    import tapekit.web  # noqa: F401  (registers the web steps, to read the tapes back)

    store = open_store(str(run / "tapes.db"))
    goals: dict[str, str] = {}
    for tape_id in store.list_tapes():
        tape = store.get_tape(tape_id)
        first = next((s for s in tape.steps if getattr(s, "goal", None)), None)
        if first is not None:
            task = str(first.task).removeprefix("miniwob.")  # type: ignore[attr-defined]
            goals[f"{task}/{first.seed}"] = first.goal  # type: ignore[attr-defined]
    store.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / "goals.json").write_text(json.dumps(dict(sorted(goals.items())), indent=1) + "\n")
    print(f"{out / 'goals.json'}: {len(goals)} seeds")


def table(runs: list[Path]) -> None:
    print("| run | goal | pool seeds | greedy: SFT → GRPO | sampled, GRPO step 0 → last 2 steps |")
    print("|---|---|---|---|---|")
    for run in runs:
        results = json.loads((run / "results.json").read_text())
        goals = json.loads((run / "goals.json").read_text())
        points = {c["label"]: c for c in results["checkpoints"]}
        sft, rl = points["sft0"]["pool"]["per_task"], points["rl0"]["pool"]["per_task"]
        first, last = results["rl_sampled"]["first"], results["rl_sampled"]["last"]
        groups: dict[str, list[str]] = defaultdict(list)
        for task in sft:
            groups[goals[task]].append(task)
        for goal, tasks in sorted(groups.items()):
            n = len(tasks)

            def mean(values: dict[str, float], tasks: list[str] = tasks) -> float:
                return sum(values[t] for t in tasks) / len(tasks)

            print(
                f"| {run.name} | {goal} | {n} | {round(mean(sft) * n)}/{n} → {round(mean(rl) * n)}/{n} "
                f"| {mean(first):.2f} → {mean(last):.2f} |"
            )


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "extract" and len(sys.argv) == 4:
        extract(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "table":
        table([Path(p) for p in sys.argv[2:]])
    else:
        sys.exit(__doc__)
