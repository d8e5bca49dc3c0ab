"""tapekit against LangGraph on the loop most users write: a ReAct agent over the whole conversation.

Workload (the same on both sides): a ReAct agent whose prompt is the system message plus the
whole conversation so far, with one tool (``add``). The model is an instant scripted one that
never reads its input: it asks for the tool K times, then answers. A "step" is one model turn or
one tool result, so a run of K tool turns has 2K + 1 steps. Per-step cost should not grow with
K: compare ms_per_step across K (the ``# growth`` lines give K_max / K_min).

Configurations:
  tapekit   async        ``amain_loop`` with no store
  tapekit   memory       ``amain_loop(store=MemoryStore())``
  tapekit   sqlite       ``amain_loop(store=SQLiteStore(file))``, flushed; file_mb is the file
  tapekit   make_prompt  only the user's ``make_prompt`` over the finished tape, once per model
                         turn (what the user's own prompt building costs; not framework work)
  langgraph async        ``StateGraph(MessagesState)`` + prebuilt ``ToolNode`` +
                         ``tools_condition``, ``ainvoke`` with no checkpointer
  langgraph memory       the same with ``InMemorySaver``
  langgraph sqlite       the same with ``SqliteSaver`` (sync ``invoke``: the async saver needs
                         aiosqlite); file_mb is the file

All runs happen in one process, interleaved (for each K, each configuration in turn, ``--rounds``
times; the median is printed), because the machine this runs on is shared: read the ratios.
peak_rss_mb is the process's peak so far (monotone: it includes earlier runs).

LangGraph is a bench-only dependency (``pip install -e '.[bench]'``, i.e. ``langgraph`` and
``langgraph-checkpoint-sqlite``); without it only the tapekit lines are printed.

    python bench/peers.py [--ks 100,1000] [--frameworks tapekit,langgraph]
                          [--configs async,memory,sqlite,make_prompt] [--rounds 1]
                          [--max-sqlite-k 1000] [--max-langgraph-sqlite-k 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tapekit import StopStep, Tape, amain_loop
from tapekit.dialog import ToolCall, ToolResult, UserStep
from tapekit.testing.react import add, react_agent, react_start

SYSTEM = "You are a calculator agent. Use the add tool, then answer."


def start_tape() -> Tape[Any, Any]:
    return react_start(SYSTEM)


def run_tapekit(k: int, config: str, tmp: Path) -> tuple[float, int, float | None]:
    """One tapekit run: (seconds, steps, file MB or None)."""
    agent, env, _ = react_agent(k)
    if config == "make_prompt":  # the user's prompt building alone, over a finished session
        tape, _, _ = _finished_tape(k)
        node = agent.nodes[0]
        steps = tape.steps
        cuts = [i for i in range(1, len(steps)) if isinstance(steps[i - 1], UserStep | ToolResult)]
        t0 = time.perf_counter()
        for cut in cuts:
            node.make_prompt(agent, tape[:cut])
        return time.perf_counter() - t0, 2 * k + 1, None
    file_mb = None
    t0 = time.perf_counter()
    if config == "async":
        tape = asyncio.run(amain_loop(agent, start_tape(), env).get_final_tape())
    elif config == "memory":
        from tapekit.store import MemoryStore

        tape = asyncio.run(amain_loop(agent, start_tape(), env, store=MemoryStore()).get_final_tape())
    elif config == "sqlite":
        from tapekit.store import SQLiteStore

        path = tmp / f"tapekit-{k}-{time.monotonic_ns()}.db"
        with SQLiteStore(path) as store:
            tape = asyncio.run(amain_loop(agent, start_tape(), env, store=store).get_final_tape())
            store.flush()
        file_mb = _file_mb(path)
    else:
        raise SystemExit(f"unknown tapekit config {config!r}")
    seconds = time.perf_counter() - t0
    _check_tapekit(tape, k)
    return seconds, len(tape) - 2, file_mb


_FINISHED: dict[int, Tape[Any, Any]] = {}


def _finished_tape(k: int) -> tuple[Tape[Any, Any], None, None]:
    if k not in _FINISHED:
        agent, env, _ = react_agent(k)
        _FINISHED.clear()
        _FINISHED[k] = asyncio.run(amain_loop(agent, start_tape(), env).get_final_tape())
    return _FINISHED[k], None, None


def _check_tapekit(tape: Tape[Any, Any], k: int) -> None:
    if tape.metadata.error or not isinstance(tape.steps[-1], StopStep):
        raise SystemExit(f"tapekit run failed: {tape.metadata.error or tape.steps[-1]}")
    n_calls = sum(isinstance(s, ToolCall) for s in tape.steps)
    if n_calls != k:
        raise SystemExit(f"tapekit run made {n_calls} tool calls, expected {k}")


def _file_mb(path: Path) -> float:
    total = 0
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(path) + suffix)
        if p.exists():
            total += p.stat().st_size
    return total / 1e6


# --------------------------------------------------------------------------- LangGraph side


def langgraph_available() -> bool:
    try:
        import langgraph  # noqa: F401
    except ImportError:
        return False
    return True


def _langgraph_graph(k: int, checkpointer: Any) -> Any:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    add_tool = tool(add)
    counter = {"n": 0}

    def model(state: MessagesState) -> dict[str, Any]:
        # The user's ReAct model node: system message plus the whole conversation so far.
        _prompt = [("system", SYSTEM), *state["messages"]]
        counter["n"] += 1
        n = counter["n"]
        if n <= k:
            call = {"name": "add", "args": {"a": 1, "b": 2}, "id": f"call_{n}", "type": "tool_call"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content="done")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([add_tool]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def run_langgraph(k: int, config: str, tmp: Path) -> tuple[float, int, float | None]:
    """One LangGraph run: (seconds, steps, file MB or None)."""
    inputs = {"messages": [("user", "Add 1 and 2, many times.")]}
    run_config = {"recursion_limit": 2 * k + 10, "configurable": {"thread_id": "bench"}}
    file_mb = None
    if config == "async":
        graph = _langgraph_graph(k, None)
        t0 = time.perf_counter()
        out = asyncio.run(graph.ainvoke(inputs, run_config))
    elif config == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        graph = _langgraph_graph(k, InMemorySaver())
        t0 = time.perf_counter()
        out = asyncio.run(graph.ainvoke(inputs, run_config))
    elif config == "sqlite":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        path = tmp / f"langgraph-{k}-{time.monotonic_ns()}.db"
        conn = sqlite3.connect(str(path), check_same_thread=False)
        try:
            graph = _langgraph_graph(k, SqliteSaver(conn))
            t0 = time.perf_counter()
            out = graph.invoke(inputs, run_config)
            conn.commit()
        finally:
            conn.close()
        file_mb = _file_mb(path)
    else:
        raise SystemExit(f"unknown langgraph config {config!r}")
    seconds = time.perf_counter() - t0
    messages = out["messages"]
    if len(messages) != 2 * k + 2:
        raise SystemExit(f"langgraph run ended with {len(messages)} messages, expected {2 * k + 2}")
    return seconds, 2 * k + 1, file_mb


# --------------------------------------------------------------------------- driver

RUNNERS: dict[str, Callable[[int, str, Path], tuple[float, int, float | None]]] = {
    "tapekit": run_tapekit,
    "langgraph": run_langgraph,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ks", default="100,1000", help="comma-separated K (tool turns); e.g. 100,1000,3000,10000"
    )
    parser.add_argument("--frameworks", default="tapekit,langgraph")
    parser.add_argument("--configs", default="async,memory,sqlite,make_prompt")
    parser.add_argument(
        "--rounds", type=int, default=1, help="interleaved repetitions; the median is printed"
    )
    parser.add_argument("--max-sqlite-k", type=int, default=3000, help="skip tapekit sqlite above this K")
    parser.add_argument(
        "--max-langgraph-sqlite-k", type=int, default=1000, help="skip LangGraph's SqliteSaver above this K"
    )
    parser.add_argument(
        "--max-langgraph-memory-k", type=int, default=3000, help="skip LangGraph's InMemorySaver above this K"
    )
    args = parser.parse_args()
    frameworks = args.frameworks.split(",")
    if "langgraph" in frameworks and not langgraph_available():
        print("# langgraph not installed (pip install -e '.[bench]'): tapekit only")
        frameworks.remove("langgraph")
    configs = args.configs.split(",")
    print(
        f"# {platform.node()} {platform.machine()} python {platform.python_version()} "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    per_step: dict[tuple[str, str], dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for fw in frameworks:  # warm-up: imports and first-call costs
            for config in configs:
                if fw == "langgraph" and config == "make_prompt":
                    continue
                RUNNERS[fw](5, config, tmp)
        for k in (int(x) for x in args.ks.split(",")):
            samples: dict[tuple[str, str], list[tuple[float, int, float | None]]] = {}
            for _ in range(args.rounds):
                for config in configs:
                    for fw in frameworks:
                        if fw == "langgraph" and config == "make_prompt":
                            continue
                        if config == "sqlite" and k > (
                            args.max_langgraph_sqlite_k if fw == "langgraph" else args.max_sqlite_k
                        ):
                            continue
                        if fw == "langgraph" and config == "memory" and k > args.max_langgraph_memory_k:
                            continue
                        gc.collect()
                        samples.setdefault((fw, config), []).append(RUNNERS[fw](k, config, tmp))
            for (fw, config), runs in samples.items():
                ms = statistics.median(s / n for s, n, _ in runs) * 1e3
                per_step.setdefault((fw, config), {})[k] = ms
                file_mb = runs[-1][2]
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(
                    f"framework={fw} config={config} k={k} ms_per_step={ms:.3f} "
                    f"file_mb={'-' if file_mb is None else f'{file_mb:.1f}'} peak_rss_mb={peak:.0f}",
                    flush=True,
                )
    for (fw, config), by_k in per_step.items():
        lo, hi = min(by_k), max(by_k)
        if hi != lo:
            print(f"# growth {fw} {config}: ms_per_step k={hi} / k={lo} = {by_k[hi] / by_k[lo]:.2f}")
    print(f"# load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
