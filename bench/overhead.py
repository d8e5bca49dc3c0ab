"""Framework overhead per step, with a zero-latency scripted LLM and a trivial environment.

Workloads:
  long    one agent, two nodes; the second loops via SetNextNode, one action per loop, each
          answered by one observation; K loops.
  nested  the same inner loop inside a root -> middle -> inner chain (Call/Respond).

Each (workload, K) runs in a fresh subprocess (after a small warm-up run) so that peak RSS is
its own; short runs are repeated and the median time is reported. The plain lines use the
async core; the ``-sync`` lines drive the same loop through the sync API; the ``-store`` lines
run the async loop with ``store=`` (every step and LLM call written to SQLite as it is made,
the time including the final flush). Per-step cost should not grow with K: compare
us_per_step across K.

    python bench/overhead.py [--ks 100,1000,10000] [--workloads long,nested] [--apis async,sync,store]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from tapekit import (
    Action,
    Agent,
    Call,
    Environment,
    FunctionLLM,
    LLMOutput,
    LLMStream,
    Node,
    Observation,
    Prompt,
    Respond,
    SetNextNode,
    Step,
    StopStep,
    Tape,
    Thought,
    amain_loop,
    main_loop,
)


class Task(Observation):
    kind: Literal["bench_task"] = "bench_task"
    loops: int


class Plan(Thought):
    kind: Literal["bench_plan"] = "bench_plan"
    text: str


class Work(Action):
    kind: Literal["bench_work"] = "bench_work"
    i: int


class Done(Observation):
    kind: Literal["bench_done"] = "bench_done"
    i: int


def _task(tape: Tape[Any, Any]) -> int:
    first = tape.steps[0]
    assert isinstance(first, Task)
    return first.loops


class PlanNode(Node):
    """First node: one LLM call, one thought."""

    name: str = "plan"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": "plan"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield Plan(text=llm_stream.get_text())


class LoopNode(Node):
    """Second node: one LLM call per loop; an action per loop, then Respond or Stop."""

    name: str = "loop"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        last = tape.steps[-1]
        return Prompt(messages=[{"role": "user", "content": f"after {last.kind}"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        llm_stream.get_output()
        last = tape.steps[-1]
        done = last.i + 1 if isinstance(last, Done) else 0
        if done >= _task(tape):
            yield Respond(content="finished") if agent.manager is not None else StopStep(reason="finished")
            return
        yield SetNextNode(next_node="loop")
        yield Work(i=done)


class DelegateNode(Node):
    """A middle agent's node: call the next agent down once, then pass its answer up."""

    name: str = "delegate"
    callee: str

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        view = agent.compute_view(tape).top
        if isinstance(view.steps[-1], Respond):
            yield Respond(content="done") if agent.manager is not None else StopStep(reason="finished")
        else:
            yield SetNextNode(next_node="delegate")
            yield Call(agent_name=self.callee, content="go")


class WorkEnvironment(Environment):
    """Answers each Work action with a Done observation."""

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        last = tape.steps[-1]
        assert isinstance(last, Work)
        return tape.with_new_steps([Done(i=last.i)], author=self.name)


def make_agent(workload: str) -> Agent:
    llm = FunctionLLM(fn=lambda prompt: LLMOutput(content="ok"), stream_chunks=False)
    inner = Agent.create(name="inner", llms=llm, nodes=[PlanNode(), LoopNode()], max_iterations=10**9)
    if workload == "long":
        return inner
    middle = Agent.create(name="middle", nodes=[DelegateNode(callee="inner")], subagents=[inner])
    return Agent.create(name="root", nodes=[DelegateNode(callee="middle")], subagents=[middle])


def run_once(workload: str, k: int, api: str) -> tuple[float, Tape[Any, Any]]:
    agent = make_agent(workload)
    start = Tape(steps=[Task(loops=k)])
    env = WorkEnvironment()
    t0 = time.perf_counter()
    if api == "async":
        tape = asyncio.run(amain_loop(agent, start, env).get_final_tape())
    elif api == "store":  # the async loop persisting every step and LLM call to SQLite as it runs
        from tapekit.store import SQLiteStore

        with tempfile.TemporaryDirectory() as tmp, SQLiteStore(Path(tmp) / "bench.db") as store:
            tape = asyncio.run(amain_loop(agent, start, env, store=store).get_final_tape())
            store.flush()
    else:
        tape = main_loop(agent, start, env).get_final_tape()
    seconds = time.perf_counter() - t0
    if tape.metadata.error or not isinstance(tape.steps[-1], StopStep):
        raise SystemExit(f"benchmark run failed: {tape.metadata.error or tape.steps[-1]}")
    return seconds, tape


def child(workload: str, k: int, api: str) -> None:
    run_once(workload, 50, api)  # warm-up: imports, caches, first-call costs
    repeats = max(1, min(15, 30_000 // (3 * k)))  # short runs are noisy: take the median
    times = []
    for _ in range(repeats):
        gc.collect()
        seconds, tape = run_once(workload, k, api)
        times.append(seconds)
    seconds = statistics.median(times)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "steps": len(tape), "peak_rss_mb": peak_mb}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ks", default="100,1000,10000")
    parser.add_argument("--workloads", default="long,nested")
    parser.add_argument("--apis", default="async,sync,store")
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "K", "API"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()} python {platform.python_version()}"
    )
    results: dict[tuple[str, str], dict[int, float]] = {}
    for api in args.apis.split(","):
        for workload in args.workloads.split(","):
            for k in (int(x) for x in args.ks.split(",")):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", workload, str(k), api],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                r = json.loads(out.strip().splitlines()[-1])
                us = r["seconds"] / r["steps"] * 1e6
                results.setdefault((workload, api), {})[k] = us
                name = workload if api == "async" else f"{workload}-{api}"
                print(
                    f"workload={name} k={k} seconds={r['seconds']:.2f} steps={r['steps']} "
                    f"us_per_step={us:.0f} peak_rss_mb={r['peak_rss_mb']:.0f}",
                    flush=True,
                )
    for (workload, api), by_k in results.items():
        lo, hi = min(by_k), max(by_k)
        print(f"# {workload} ({api}): us_per_step at k={hi} / k={lo} = {by_k[hi] / by_k[lo]:.2f}")


if __name__ == "__main__":
    main()
