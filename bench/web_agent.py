"""Where a web agent's step goes: the agent's own overhead next to the browser's and the model's time.

Two measurements:

1. **The agent's overhead** (no browser, no model): one turn of the web agent (its prompt from the
   tape, the page grammar, the answer parsed, the loop's bookkeeping) with a model that answers at
   once, on a MiniWob++ observation behind 0, 100 and 1,000 earlier episodes on the same tape. The
   per-step cost must not grow with the tape.
2. **A real run's steps** (``--db``, a store written by ``examples/web_agent/run.py --store``):
   per agent step, the model's latency (the stored LLM calls), prompt and output tokens, and the
   browser's seconds (what the environment measured on each observation).

    python bench/web_agent.py [--db /tmp/webrun/store.db] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

from tapekit import FunctionLLM, Prompt, Tape, main_loop, open_store
from tapekit.core import StepSequence
from tapekit.web import Click, OpenTask, WebObservation, web_agent

TREE = "\n".join(
    [
        '[3] text "Select Kasey, Vella from the list and click Submit."',
        '[7] LabelText "Name"',
        *[f'[{10 + i}] option "Person {i}"' for i in range(30)],
        '[45] button "Submit"',
    ]
)


def observation(step: int) -> WebObservation:
    return WebObservation(
        task="miniwob.choose-list",
        seed=1,
        episode_id="e",
        goal="Select Kasey, Vella and click Submit.",
        axtree=TREE,
        step=step,
    )


def tape_with(history: int) -> Tape[Any, Any]:
    steps: list[Any] = []
    for episode in range(history):
        steps += [
            OpenTask(task="miniwob.choose-list", seed=episode),
            observation(0),
            Click(bid="45"),
            observation(1),
        ]
    steps += [
        OpenTask(task="miniwob.choose-list", seed=history),
        observation(0),
        Click(bid="12"),
        observation(1),
    ]
    return Tape(steps=StepSequence(steps))


def overhead(repeats: int) -> list[tuple[int, float, float]]:
    answer = json.dumps({"thought": "pick the person", "action": "click('45')"})
    agent = web_agent(FunctionLLM(fn=lambda p: answer, stream_chunks=False))
    out = []
    for history in (0, 100, 1000):
        tape = tape_with(history)
        main_loop(agent, tape).get_final_tape()  # warm up
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            main_loop(agent, tape).get_final_tape()
            times.append(time.perf_counter() - started)
        prompt: Prompt | None = agent.nodes[0].make_prompt(agent, tape)
        size = sum(len(m["content"]) for m in prompt.messages) if prompt else 0
        out.append((history, statistics.median(times) * 1000, size))
    return out


def real_steps(db: str) -> dict[str, dict[str, float]]:
    """Per evaluation name prefix: median model latency, tokens and browser seconds per step."""
    rows: dict[str, dict[str, list[float]]] = {}
    with open_store(db) as store:
        for info in store.list_tape_infos():
            group = next(
                (t.split(":")[1] for t in info.tags if t.startswith("eval:") and t.count(":") == 1), None
            )
            if group is None:
                continue
            tape = store.get_tape(info.id)
            agg = rows.setdefault(
                group, {"model_s": [], "prompt_tokens": [], "output_tokens": [], "browser_s": []}
            )
            for step in tape.steps:
                if isinstance(step, WebObservation) and "browser_s" in step.metadata.other:
                    agg["browser_s"].append(float(step.metadata.other["browser_s"]))
            seen = set()
            for step in tape.steps:
                pid = step.metadata.prompt_id
                if not pid or pid in seen:
                    continue
                seen.add(pid)
                call = store.get_llm_call(pid)
                if call is not None:
                    agg["model_s"].append(call.latency_s)
                    agg["prompt_tokens"].append(call.prompt_tokens)
                    agg["output_tokens"].append(call.output_tokens)
    return {
        group: {k: statistics.median(v) if v else 0.0 for k, v in agg.items()}
        | {"calls": len(agg["model_s"])}
        for group, agg in sorted(rows.items())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None, help="a store written by examples/web_agent/run.py --store")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    print(
        f"{platform.node()} {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print("\nThe agent's own time per step (instant model, no browser):\n")
    print("| earlier episodes on the tape | ms per step (median) | prompt characters |")
    print("|---|---|---|")
    for history, ms, size in overhead(args.repeats):
        print(f"| {history:,} | {ms:.2f} | {size:,} |")
    if args.db:
        print(f"\nA real run's steps ({args.db}; medians per agent step):\n")
        print(
            "| evaluation | LLM calls | model s | prompt tokens | output tokens | browser s per observation |"
        )
        print("|---|---|---|---|---|---|")
        for group, r in real_steps(args.db).items():
            print(
                f"| {group} | {int(r['calls'])} | {r['model_s']:.2f} | {r['prompt_tokens']:.0f} | "
                f"{r['output_tokens']:.0f} | {r['browser_s']:.2f} |"
            )
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
