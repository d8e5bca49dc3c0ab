"""A data-science team on one tape (the TapeAgents paper, section 4.3), built with TeamAgent.

A requestor asks for a plot; a manager gives the floor to an engineer (writes Python), an
executor (runs it in the sandbox: no network, one working directory, CPU/memory/time limits)
and a reviewer (approves when the plot exists), until the reviewer says APPROVED. The prices
come from ``examples/data/ds_team/prices.csv``; the plot is an SVG written by plain Python, so
no plotting library is needed.

    python examples/data_science_team.py                       # scripted stand-in model, offline
    python examples/data_science_team.py --model http://127.0.0.1:8000/v1 --model-name NAME

The executor is not an LLM: its first node turns the engineer's code block into a
``run_python`` tool call (the environment runs it in the sandbox), its second responds with the
result. Every step is derived from the tape, so the session resumes from any step.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tapekit import (
    Agent,
    FunctionLLM,
    LLMStream,
    MaxTurns,
    Node,
    Prompt,
    Respond,
    SetNextNode,
    Step,
    Tape,
    TeamAgent,
    TextMention,
    ToolCall,
    ToolEnvironment,
    ToolResult,
    main_loop,
)
from tapekit.frameworks import TeamMessage, conversation
from tapekit.sandbox import Sandbox

DATA = Path(__file__).resolve().parent / "data" / "ds_team" / "prices.csv"
REQUEST = "Make a plot comparing the NVDA and TSLA prices in prices.csv, normalised to 100 at the start."
ENGINEER = (
    "You are the software engineer. Write one complete Python program in a ```python block. "
    "Use only the standard library; read prices.csv and save the plot as plot.svg."
)
REVIEWER = "You are the reviewer. Check the executor's output; say APPROVED when plot.svg was made."

PLOT_CODE = """import csv

rows = list(csv.DictReader(open("prices.csv")))
names = ["NVDA", "TSLA"]
series = {n: [100 * float(r[n]) / float(rows[0][n]) for r in rows] for n in names}
top = max(max(v) for v in series.values())
width, height = 480, 240
lines = []
for name, colour in zip(names, ["#76b900", "#cc0000"]):
    points = " ".join(
        f"{20 + i * (width - 40) / (len(rows) - 1):.1f},{height - 20 - v * (height - 40) / top:.1f}"
        for i, v in enumerate(series[name])
    )
    lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
    lines.append(f'<text x="{width - 60}" y="{20 + 16 * len(lines) // 2}" fill="{colour}">{name}</text>')
head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
svg = head + "".join(lines) + "</svg>"
open("plot.svg", "w").write(svg)
for name in names:
    print(f"{name}: {series[name][-1] - 100:+.1f}% over {len(rows)} months")
"""


def scripted_model(prompt: Prompt) -> str:
    """Plays the engineer and the reviewer: writes the plotting program, approves the plot."""
    system = prompt.messages[0]["content"] if prompt.messages else ""
    last = prompt.messages[-1]["content"]
    if system.startswith("You are the software engineer"):
        return f"Here is the program.\n```python\n{PLOT_CODE}```"
    if "plot.svg" in last and "exit code: 0" in last:
        return "The plot compares both stocks from the same start. APPROVED"
    return "There is no plot.svg yet; please fix the program."


def next_speaker(messages: list[TeamMessage], names: list[str]) -> str:
    """engineer -> executor -> reviewer (or back to the engineer when the run failed)."""
    last = messages[-1]
    if not last.from_member or last.speaker == "reviewer":
        return "engineer"
    if last.speaker == "engineer":
        return "executor"
    return "reviewer" if "exit code: 0" in last.content else "engineer"


def code_block(text: str) -> str | None:
    """The last ```python block of ``text``."""
    blocks = re.findall(r"```(?:python)?\n(.*?)```", text, re.S)
    return blocks[-1] if blocks else None


class RunCode(Node):
    """Turns the last message's code block into a ``run_python`` call (or says there is none)."""

    name: str = "run"

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """SetNextNode('report') and the tool call, or a Respond when there is no code."""
        code = code_block(conversation(agent, tape)[-1].content)
        if code is None:
            yield Respond(content="There is no ```python block to run.")
            return
        yield SetNextNode(next_node="report")
        yield ToolCall(name="run_python", arguments={"code": code}, call_id=f"run_{len(tape)}")


class Report(Node):
    """Responds with what the sandbox run printed and made."""

    name: str = "report"

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The last tool result as the executor's message."""
        result = next(s for s in reversed(agent.compute_view(tape).top.steps) if isinstance(s, ToolResult))
        yield Respond(content=f"Error: {result.error}" if result.error else str(result.content))


def make_team(llm: Any = None) -> TeamAgent:
    """The requestor, the manager and its three workers."""
    llm = llm or FunctionLLM(fn=scripted_model, model_name="scripted")
    workers = [
        TeamAgent.create_worker("engineer", llm, system=ENGINEER),
        TeamAgent.create_worker("executor", nodes=[RunCode(), Report()], description="runs Python code"),
        TeamAgent.create_worker("reviewer", llm, system=REVIEWER),
    ]
    manager = TeamAgent.create_manager(
        "manager",
        workers,
        selection=next_speaker,
        termination=TextMention(text="APPROVED") | MaxTurns(turns=12),
    )
    return TeamAgent.create_initiator("requestor", manager, message=REQUEST)


def run(team: TeamAgent, sandbox: Sandbox, tape: Tape[Any, Any] | None = None) -> Tape[Any, Any]:
    """Run (or resume) the session with the sandbox's Python as the only tool."""
    shutil.copy(DATA, sandbox.workdir / "prices.csv")
    environment = ToolEnvironment([sandbox.python_tool()])
    return main_loop(team, tape or Tape(steps=[]), environment).get_final_tape()


def main(argv: list[str] | None = None) -> int:
    """Run the team and print the tape; the plot is copied to --out."""
    import argparse

    parser = argparse.ArgumentParser(description="A data-science team (TeamAgent) that makes a plot.")
    parser.add_argument("--model", default="scripted", help="scripted (default) or an OpenAI-compatible URL")
    parser.add_argument("--model-name", default="default", help="the model name to send to a URL endpoint")
    parser.add_argument("--out", default=".", help="where to copy plot.svg")
    args = parser.parse_args(argv)
    llm = None
    if args.model != "scripted":
        from tapekit.llm import OpenAICompatibleLLM

        llm = OpenAICompatibleLLM(model_name=args.model_name, base_url=args.model)
    reason = Sandbox.available()
    if reason:
        print(f"cannot run code in a sandbox here: {reason}", file=sys.stderr)
        return 2
    with Sandbox() as sandbox:
        tape = run(make_team(llm), sandbox)
        for i, step in enumerate(tape.steps):
            text = (
                getattr(step, "content", None)
                or getattr(step, "agent_name", "")
                or getattr(step, "reason", "")
            )
            where = f"{step.metadata.agent}.{step.metadata.node}" if step.metadata.agent else "environment"
            print(f"[{i:3}] {where:32} {step.kind:16} {' '.join(str(text).split())[:70]}")
        if tape.metadata.error:
            print(f"error: {tape.metadata.error}", file=sys.stderr)
            return 1
        if (sandbox.workdir / "plot.svg").exists():
            shutil.copy(sandbox.workdir / "plot.svg", Path(args.out) / "plot.svg")
            print(f"plot saved to {Path(args.out) / 'plot.svg'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
