"""What a ``once`` tool's journal costs per call, against the same tool declared ``read``.

A stored session (``main_loop`` with ``store=``) calls one no-op tool ``--calls`` times, one
call per turn (a scripted LLM answers at once), and then stops. The tool is declared
``effect="read"`` (nothing journalled: the call and its result go through the store's batched
writer) or ``effect="once"`` (before the tool runs the tape up to the call and an intent record
are committed, synchronously; its outcome is committed before the result step: docs/durability.md).
Both run on each store (SQLite on a file, and the in-memory store), in alternation, ``--rounds``
times; reported per store and effect: the median milliseconds per tool call (the whole turn:
LLM call, tool call, tool result, saves), and the difference, which is what a ``once`` tool
adds to a turn.

    python bench/effects.py                   # ~1 minute on 2 cores
    python bench/effects.py --calls 200 --rounds 7 --out bench/results/effects.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tapekit import (
    Agent,
    FunctionLLM,
    LLMOutput,
    Prompt,
    Tape,
    ToolCallRequest,
    ToolEnvironment,
    UserStep,
    main_loop,
    tool,
)
from tapekit.store import MemoryStore, open_store
from tapekit.testing.react import ReactNode


def session(effect: str, calls: int, store: Any) -> float:
    """Seconds for one stored session of ``calls`` turns, each calling a no-op tool of ``effect``."""

    @tool(effect=effect)  # type: ignore[arg-type]
    def note(n: int) -> str:
        """Note ``n`` (does nothing)."""
        return f"noted {n}"

    def model(prompt: Prompt) -> LLMOutput:
        done = sum(1 for m in prompt.messages if m["role"] == "tool")
        if done >= calls:
            return LLMOutput(content="done")
        request = ToolCallRequest(id=f"c{done}", name="note", arguments=json.dumps({"n": done}))
        return LLMOutput(tool_calls=[request])

    env = ToolEnvironment([note])
    agent = Agent.create(
        name="noter", llms=FunctionLLM(fn=model), nodes=[ReactNode(tools=env.tool_schemas())]
    )
    start: Tape[Any, Any] = Tape(steps=[UserStep(content=f"note {calls} numbers")])
    began = time.perf_counter()
    final = main_loop(agent, start, env, store=store, max_loops=4 * calls).get_final_tape()
    seconds = time.perf_counter() - began
    results = sum(1 for s in final.steps if type(s).__name__ == "ToolResult")
    if results != calls:
        raise SystemExit(f"bench/effects.py: the session made {results} tool results, not {calls}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="tool calls per session")
    parser.add_argument("--rounds", type=int, default=5, help="alternations of read and once")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="tapekit-bench-effects-"))
    stores = {"sqlite": lambda i: open_store(str(folder / f"s{i}.db")), "memory": lambda i: MemoryStore()}
    times: dict[str, dict[str, list[float]]] = {s: {"read": [], "once": []} for s in stores}
    load_before = list(os.getloadavg())
    n = 0
    for make in stores.values():  # one warm-up each: imports, first table creation
        store = make(n)
        session("once", 5, store)
        store.close()
        n += 1
    for r in range(args.rounds):
        order = ["read", "once"] if r % 2 == 0 else ["once", "read"]
        for name, make in stores.items():
            for effect in order:
                store = make(n)
                n += 1
                seconds = session(effect, args.calls, store)
                store.close()
                times[name][effect].append(1000 * seconds / args.calls)
    rows = []
    for name, by_effect in times.items():
        read, once = statistics.median(by_effect["read"]), statistics.median(by_effect["once"])
        rows.append(
            {
                "store": name,
                "read_ms_per_call": round(read, 3),
                "once_ms_per_call": round(once, 3),
                "once_adds_ms": round(once - read, 3),
                "runs_ms": {e: [round(x, 3) for x in v] for e, v in by_effect.items()},
            }
        )
        print(
            f"{name:7s} read {read:7.3f} ms/call  once {once:7.3f} ms/call  once adds {once - read:6.3f} ms"
        )
    results = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": list(os.getloadavg()),
        },
        "settings": {"calls": args.calls, "rounds": args.rounds},
        "stores": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
