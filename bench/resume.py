"""Resume cost: how long a crashed session takes to continue, against the session's length.

A session of K tool turns (the ReAct workload of bench/peers.py: a turn is the model's tool call
and the tool's result) is stored in SQLite and left unfinished, as a crash would leave it. A
resume is then timed from nothing, in the same process (imports done), each round on a fresh
copy of the stored session (a resume stores its new step: the next round would otherwise resume
a session cut inside that step's node run):

  tapekit   open      ``open_store(path)``
            load      ``store.get_tape(id)``: the tape, its steps left in the store until read
            view      ``agent.compute_view(tape)``: the agent's view rebuilt over the tape
            first     ``main_loop(agent, tape, env, store=store)`` until its first new step
            total     all four
  langgraph get_state ``graph.get_state(config)`` on a new ``SqliteSaver`` connection (the
                      checkpoint holding the K turns' messages)
            first     ``graph.invoke(None, config)`` until the model's next turn is checkpointed

Each line is the median of ``--rounds`` resumes. The load reads the tape's row, not its steps
(each is fetched and parsed when first read); the view reads the steps that call, respond or
fork (found by kind in an index) and the last node run; none of the framework's work grows with
K. The ReAct prompt holds the whole conversation, so the first step of ``tapekit``
(``--workloads react``) reads, converts and stores all K turns' messages: that part is the
workload's, and ``tapekit-w6`` (``--workloads window``: the same agent with a prompt of its
view's last 6 steps) shows the resume without it.

    python bench/resume.py [--ks 100,1000,10000] [--rounds 5] [--frameworks tapekit,langgraph]
                           [--workloads react,window]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tapekit import amain_loop, main_loop
from tapekit.store import SQLiteStore, open_store
from tapekit.testing.react import react_agent, react_start

SYSTEM = "You are a calculator agent. Use the add tool, then answer."


def stored_session(k: int, path: Path) -> str:
    """A session of ``k`` tool turns stored in ``path``, not finished (the model would go on)."""
    agent, env, _ = react_agent(k + 10)
    start = react_start(SYSTEM)
    with SQLiteStore(path) as store:
        asyncio.run(amain_loop(agent, start, env, max_loops=k, store=store).get_final_tape())
    return start.metadata.id


WINDOW = 6  # the steps of the view in the prompt of the "window" workload


def resume_tapekit(k: int, stored: Path, tape_id: str, window: int = 0) -> dict[str, float]:
    path = stored.with_name(f"resumed-{stored.name}")
    shutil.copyfile(stored, path)  # the stored session as the crash left it, for every round
    # (no window argument for the plain workload: the script also runs on versions without it)
    agent, env, model = react_agent(k + 10, window=window) if window else react_agent(k + 10)
    model.calls = k  # the scripted model carries on from turn k
    t0 = time.perf_counter()
    store = open_store(path)
    t1 = time.perf_counter()
    tape = store.get_tape(tape_id)
    t2 = time.perf_counter()
    agent.compute_view(tape)
    t3 = time.perf_counter()
    for event in main_loop(agent, tape, env, max_loops=1, store=store):
        if event.agent_event is not None and event.agent_event.step is not None:
            break
    t4 = time.perf_counter()
    store.close()
    assert len(tape) >= 2 * k, (len(tape), k)
    return {"open": t1 - t0, "load": t2 - t1, "view": t3 - t2, "first": t4 - t3, "total": t4 - t0}


def langgraph_session(k: int, path: Path) -> Any:
    """The same session in LangGraph with ``SqliteSaver``: K tool turns, then interrupted."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from tapekit.testing.react import add

    counter = {"n": 0}

    def model(state: MessagesState) -> dict[str, Any]:
        _prompt = [("system", SYSTEM), *state["messages"]]
        counter["n"] += 1
        call = {"name": "add", "args": {"a": 1, "b": 2}, "id": f"call_{counter['n']}", "type": "tool_call"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def build(conn: sqlite3.Connection) -> Any:
        builder = StateGraph(MessagesState)
        builder.add_node("model", model)
        builder.add_node("tools", ToolNode([tool(add)]))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition)
        builder.add_edge("tools", "model")
        return builder.compile(checkpointer=SqliteSaver(conn))

    conn = sqlite3.connect(str(path), check_same_thread=False)
    graph = build(conn)
    config = {"recursion_limit": 2 * k, "configurable": {"thread_id": "bench"}}
    try:
        graph.invoke({"messages": [("user", "Add 1 and 2, many times.")]}, config)
    except Exception as e:  # the recursion limit stops it mid-session, as a crash would
        if "recursion" not in str(e).lower():
            raise
    conn.commit()
    conn.close()
    return build, counter


def resume_langgraph(k: int, path: Path, build: Any, counter: dict[str, int]) -> dict[str, float]:
    t0 = time.perf_counter()
    conn = sqlite3.connect(str(path), check_same_thread=False)
    graph = build(conn)
    config = {"recursion_limit": 3, "configurable": {"thread_id": "bench"}}
    state = graph.get_state(config)
    t1 = time.perf_counter()
    n = len(state.values["messages"])
    try:
        graph.invoke(None, {**config, "recursion_limit": 1})
    except Exception as e:
        if "recursion" not in str(e).lower():
            raise
    t2 = time.perf_counter()
    conn.rollback()
    conn.close()
    assert n >= 2 * k - 2, (n, k)
    return {"get_state": t1 - t0, "first": t2 - t1, "total": t2 - t0}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ks", default="100,1000,10000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frameworks", default="tapekit,langgraph")
    parser.add_argument("--workloads", default="react,window", help="tapekit's: react, window")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    frameworks = args.frameworks.split(",")
    windows = {"react": 0, "window": WINDOW}
    runs = [
        ("tapekit" if w == "react" else f"tapekit-w{WINDOW}", windows[w]) for w in args.workloads.split(",")
    ]
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    print(f"# {machine}, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="tapekit-resume-") as tmp:
        for k in ks:
            names = [name for name, _ in runs] if "tapekit" in frameworks else []
            results: dict[str, list[dict[str, float]]] = {
                f: [] for f in [*names, *(f for f in frameworks if f != "tapekit")]
            }
            tapekit_path, lg_path = Path(tmp) / f"t{k}.db", Path(tmp) / f"l{k}.db"
            tape_id = stored_session(k, tapekit_path) if "tapekit" in frameworks else ""
            lg = langgraph_session(k, lg_path) if "langgraph" in frameworks else None
            for _ in range(args.rounds):
                if "tapekit" in frameworks:
                    for name, window in runs:
                        results[name].append(resume_tapekit(k, tapekit_path, tape_id, window))
                if lg is not None:
                    results["langgraph"].append(resume_langgraph(k, lg_path, *lg))
            for framework, rounds in results.items():
                medians = {key: statistics.median(r[key] for r in rounds) * 1000 for key in rounds[0]}
                parts = " ".join(f"{key}_ms={value:.1f}" for key, value in medians.items())
                print(f"{framework:10s} K={k:6d} {parts}", flush=True)
    print(f"# load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
