"""Forks: wall time of N concurrent branches, and tapekit's own cost per branch.

Each branch is a one-node subagent whose node makes one LLM call (a deterministic function
model with a fixed latency) and Responds. The root forks N branches, then merges.

  latency lines   N branches of one ``--latency`` call each: the fork's wall time should stay
                  close to one call, whatever N (the root's own two calls take no time here).
  overhead lines  the same with zero latency: microseconds of tapekit work per branch.
  research line   examples/research.py end to end (8 calls of ``--latency``, 3 branches with a
                  tool call each); sequential would take 5 call times, the fork makes it 4.

    python bench/fork.py [--latency 0.2] [--widths 3,10,100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tapekit import (
    Agent,
    AssistantStep,
    Fork,
    FunctionLLM,
    LLMStream,
    Node,
    Prompt,
    Respond,
    SetNextNode,
    Step,
    Tape,
    UserStep,
)
from tapekit.testing import research


class Split(Node):
    """Forks ``width`` answerer branches (no LLM call)."""

    width: int

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield SetNextNode(next_node="Join")
        yield Fork.of(*(("answerer", f"part {i}") for i in range(self.width)))


class Answer(Node):
    """One LLM call, then Respond."""

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": agent.compute_view(tape).top.steps[0].content}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield Respond(content=llm_stream.get_text())


class Join(Node):
    """Counts the responses (no LLM call) and answers."""

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        n = sum(isinstance(s, Respond) for s in agent.compute_view(tape).top.steps)
        yield AssistantStep(content=json.dumps({"responses": n}))


def team(width: int, latency_s: float) -> Agent:
    llm = FunctionLLM(
        fn=lambda p: "ok " + p.messages[-1]["content"], latency_s=latency_s, stream_chunks=False
    )
    answerer = Agent.create("answerer", llms=llm, nodes=[Answer()])
    return Agent.create("root", nodes=[Split(width=width), Join()], subagents=[answerer])


async def one_run(width: int, latency_s: float) -> float:
    agent = team(width, latency_s)
    t0 = time.perf_counter()
    tape = await agent.arun(Tape(steps=[UserStep(content="go")])).get_final_tape()
    wall = time.perf_counter() - t0
    assert tape.metadata.error is None, tape.metadata.error
    assert json.loads(tape.steps[-1].content) == {"responses": width}
    return wall


def median_of(repeats: int, width: int, latency_s: float) -> float:
    return statistics.median(asyncio.run(one_run(width, latency_s)) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--widths", default="3,10,100")
    parser.add_argument("--overhead-widths", default="10,100,1000")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, python {platform.python_version()}")
    for width in (int(w) for w in args.widths.split(",")):
        wall = median_of(5, width, args.latency)
        print(
            f"latency  branches={width} call_s={args.latency:.3f} wall_s={wall:.3f} "
            f"sequential_s={width * args.latency:.3f} speedup={width * args.latency / wall:.1f}x"
        )
    for width in (int(w) for w in args.overhead_widths.split(",")):
        wall = median_of(5, width, 0.0)
        print(f"overhead branches={width} wall_s={wall:.4f} us_per_branch={wall / width * 1e6:.0f}")
    t0 = time.perf_counter()
    tape = asyncio.run(research.arun(research.make_lead(latency_s=args.latency), research.start_tape()))
    wall = time.perf_counter() - t0
    assert tape.metadata.error is None
    print(
        f"research calls=8 call_s={args.latency:.3f} wall_s={wall:.3f} without_fork_s={8 * args.latency:.3f}"
    )


if __name__ == "__main__":
    main()
