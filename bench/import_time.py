"""How long ``import tapekit`` takes in a fresh interpreter, here and at another revision.

    python bench/import_time.py                      # this checkout, 30 fresh interpreters
    python bench/import_time.py --against HEAD~1     # and an anchor revision, runs interleaved
    python bench/import_time.py --first-use          # the import and then a first session

Each run starts a new ``python`` and times the import inside it (``perf_counter`` around the
statement, CPU time beside it), so interpreter start-up is not counted. ``--first-use`` times,
after the import, what a program does first: a one-node agent with a scripted model answers a
user in ``main_loop``, and the tape goes to JSON and back; it shows whether work taken out of the
import comes back at the first session. With ``--against`` the
revision is checked out into a temporary git worktree and the two are run in turn (A, B, A, B,
...), so that a change in the machine's load falls on both. The medians and quartiles are
printed with the machine's load average; nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TIMED = (
    "import json, time\n"
    "w, c = time.perf_counter(), time.process_time()\n"
    "import tapekit\n"
    "{then}"
    "print(json.dumps([time.perf_counter() - w, time.process_time() - c, tapekit.__file__]))"
)
PROBE = _TIMED.format(then="")
FIRST_USE = _TIMED.format(
    then=(
        "from tapekit import Agent, FunctionLLM, Tape, UserStep, main_loop\n"
        "from tapekit.nodes import ToolCallingNode\n"
        "llm = FunctionLLM(fn=lambda p: 'hi')\n"
        "agent = Agent.create(name='a', llms=llm, nodes=[ToolCallingNode(final='stop')])\n"
        "tape = main_loop(agent, Tape(steps=[UserStep(content='hello')])).get_final_tape()\n"
        "assert type(tape).model_validate_json(tape.model_dump_json()) == tape\n"
    )
)


def once(tree: Path, probe: str = PROBE) -> tuple[float, float]:
    """Wall and CPU seconds of ``probe`` (by default ``import tapekit``) from ``tree`` in a fresh
    interpreter."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # users' interpreters cache compiled modules; with this set, every run would compile the
    # whole package from source (about 80 ms of the import on the 2-core VM)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True, check=True
    ).stdout
    wall, cpu, where = json.loads(out)
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"import_time: tapekit came from {where}, not from {tree}")
    return wall, cpu


def summary(name: str, runs: list[tuple[float, float]]) -> str:
    walls = sorted(w for w, _ in runs)
    cpus = sorted(c for _, c in runs)
    q1, _, q3 = statistics.quantiles(walls, n=4)
    return (
        f"{name:<24} wall median {statistics.median(walls) * 1e3:6.1f} ms "
        f"(quartiles {q1 * 1e3:.1f}-{q3 * 1e3:.1f}), cpu median {statistics.median(cpus) * 1e3:6.1f} ms"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--against", help="a git revision to time beside this checkout (interleaved)")
    p.add_argument("--first-use", action="store_true", help="time the import and a first session (see above)")
    args = p.parse_args(argv)
    if args.runs < 4:
        p.error("--runs must be at least 4 (quartiles)")
    trees = {"this checkout": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            anchor = Path(tmp) / "anchor"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(anchor), args.against],
                check=True,
                capture_output=True,
            )
            trees[args.against] = anchor
        try:
            probe = FIRST_USE if args.first_use else PROBE
            for tree in trees.values():
                once(tree, probe)  # compile the .pyc files first
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
            for _ in range(args.runs):
                for name, tree in trees.items():
                    results[name].append(once(tree, probe))
        finally:
            if args.against:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(anchor)], check=True
                )
    what = "import tapekit + a first session" if args.first_use else "import tapekit"
    print(f"{what}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    for name, runs in results.items():
        print(summary(name, runs))


if __name__ == "__main__":
    main()
