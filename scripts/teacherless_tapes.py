"""What the teacherless study's tapes say beyond its logs: per task, how greedy evaluation
episodes ended (solved, aborted by the agent's loop guard) and how varied their first actions
were, and the sampled success of the GRPO rollouts in blocks of steps.

    python scripts/teacherless_tapes.py docs/experiments/web-teacherless/run --evals screen rl-seed0-val40
    python scripts/teacherless_tapes.py docs/experiments/web-teacherless/run --rollouts rl-seed0 --block 10

Reads ``RUN/tapes.db`` (kept on the machine that ran the study, not committed: the tapes are
large) read-only, and prints Markdown tables (docs/experiments/web-teacherless.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

NOT_ACTIONS = {"web_observation", "web_open_task"}


def connect(run: Path) -> sqlite3.Connection:
    """The run's tape store, opened read-only (a running study may be writing to it)."""
    path = run / "tapes.db"
    if not path.exists():
        raise SystemExit(f"{path}: no tape store (the tapes stay on the machine that ran the study)")
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)


def actions(db: sqlite3.Connection, tape_id: str) -> list[tuple[str, Any]]:
    """The web actions of a tape in order: (kind without ``web_``, its element's bid)."""
    rows = db.execute("SELECT kind, data FROM steps WHERE tape_id = ? ORDER BY idx", (tape_id,))
    return [
        (k.removeprefix("web_"), json.loads(d).get("bid"))
        for k, d in rows
        if k.startswith("web_") and k not in NOT_ACTIONS
    ]


def evaluation_table(db: sqlite3.Connection, name: str) -> dict[str, dict[str, int]]:
    """Per task of evaluation ``name``: episodes, solved, aborted, distinct first actions, and
    how many episodes began with the most common one."""
    table: dict[str, dict[str, int]] = defaultdict(lambda: {"episodes": 0, "solved": 0, "aborted": 0})
    firsts: dict[str, Counter[Any]] = defaultdict(Counter)
    rows = db.execute("SELECT tag, tape_id FROM tape_tags WHERE tag LIKE ?", (f"eval:{name}:task:%",))
    for tag, tape_id in rows.fetchall():
        task = tag.split(":task:", 1)[1].rsplit("/", 1)[0]
        tags = {t for (t,) in db.execute("SELECT tag FROM tape_tags WHERE tape_id = ?", (tape_id,))}
        done = actions(db, tape_id)
        row = table[task]
        row["episodes"] += 1
        row["solved"] += f"eval:{name}:passed" in tags
        row["aborted"] += any(kind == "abort" for kind, _ in done)
        if done:
            firsts[task][done[0]] += 1
    for task, row in table.items():
        row["first_actions"] = len(firsts[task])
        row["commonest_first"] = firsts[task].most_common(1)[0][1] if firsts[task] else 0
    return dict(table)


def rollout_blocks(db: sqlite3.Connection, run: str, block: int) -> dict[str, dict[int, tuple[float, int]]]:
    """Per task, per block of ``block`` GRPO steps: the rollouts' mean reward and their number."""
    found: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    query = "SELECT result FROM tapes WHERE id IN (SELECT tape_id FROM tape_tags WHERE tag = ?)"
    for (result,) in db.execute(query, (f"rl:{run}",)):
        r = json.loads(result or "{}")
        if r.get("rl_step") is None or r.get("category") is None:
            continue
        found[r["category"]][int(r["rl_step"]) // block].append(float(r["reward"]))
    return {
        task: {b: (sum(v) / len(v), len(v)) for b, v in sorted(blocks.items())}
        for task, blocks in sorted(found.items())
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("run", type=Path, help="the study's --out directory")
    p.add_argument("--evals", nargs="*", default=[], help="evaluation names (screen, rl-seed0-val40, ...)")
    p.add_argument("--rollouts", help="a GRPO run's name (rl-seed0)")
    p.add_argument("--block", type=int, default=10, help="--rollouts: steps per block")
    p.add_argument("--tasks", nargs="*", help="only these tasks")
    args = p.parse_args(argv)
    db = connect(args.run)
    for name in args.evals:
        table = evaluation_table(db, name)
        head = "| task | episodes | solved | loop-guard ends | distinct first actions | commonest first |"
        print(f"\n{name}\n\n{head}")
        print("|---|---|---|---|---|---|")
        for task in sorted(table):
            if args.tasks and task not in args.tasks:
                continue
            r = table[task]
            print(
                f"| {task} | {r['episodes']} | {r['solved']} | {r['aborted']} | {r['first_actions']} | "
                f"{r['commonest_first']} |"
            )
    if args.rollouts:
        blocks = rollout_blocks(db, args.rollouts, args.block)
        width = max((max(b) for b in blocks.values() if b), default=-1) + 1
        head = " | ".join(f"steps {i * args.block}-{(i + 1) * args.block - 1}" for i in range(width))
        print(f"\n{args.rollouts}: sampled success (rollouts)\n\n| task | {head} |\n|---|" + "---|" * width)
        for task, by in blocks.items():
            if args.tasks and task not in args.tasks:
                continue
            cells = " | ".join(f"{by[i][0]:.2f} ({by[i][1]})" if i in by else "" for i in range(width))
            print(f"| {task} | {cells} |")


if __name__ == "__main__":
    main()
