"""What live OpenTelemetry tracing costs the main loop, and how fast stored tapes export.

A scripted agent calls a Python tool ``--rounds`` times (one node run, one LLM call and one tool
call per round), with no tracer, and with an ``OtelTracer`` whose spans go to the SDK's
in-memory exporter (no network, so the figure is tapekit's own cost). Reported: the loop's wall
time both ways (median of ``--repeats`` runs), the callback's own time per event, and how long
the tracer takes to finish after the loop (worker thread and batch processor draining). Then
the export of the finished tape: spans per second for ``tapes_to_otlp_json`` and the OTLP JSON
read back.

    python bench/otel.py [--rounds 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tapekit import (
    Agent,
    AssistantThought,
    FunctionLLM,
    LLMOutput,
    Node,
    Prompt,
    SetNextNode,
    StopStep,
    Tape,
    ToolCallRequest,
    ToolEnvironment,
    UserStep,
    main_loop,
    tool_calls_from_output,
)
from tapekit.otel import OtelTracer, tapes_from_otlp_json, tapes_to_otlp_json


def echo(text: str) -> str:
    """Returns its argument."""
    return text


ENV = ToolEnvironment([echo])


class Act(Node):
    """One tool call per run until the script says stop."""

    name: str = "act"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": str(len(tape))}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: Any) -> Any:
        output = llm_stream.get_output()
        if output.tool_calls:
            yield SetNextNode(next_node="act")
            yield from tool_calls_from_output(output)
        else:
            yield AssistantThought(content=output.content or "")
            yield StopStep(reason="done")


def make_agent(rounds: int) -> Agent:
    def script(prompt: Prompt) -> LLMOutput:
        n = int(prompt.messages[-1]["content"])
        if n < 3 * rounds:
            request = ToolCallRequest(id=str(n), name="echo", arguments=json.dumps({"text": f"round {n}"}))
            return LLMOutput(tool_calls=[request])
        return LLMOutput(content="done")

    return Agent.create(
        "bench", llms=FunctionLLM(fn=script, stream_chunks=False), nodes=[Act()], max_iterations=10**6
    )


def run(rounds: int, traced: bool) -> dict[str, float]:
    gc.collect()  # the previous run's garbage is not this run's cost
    start: Tape[Any, Any] = Tape(steps=[UserStep(content="go")])
    agent = make_agent(rounds)
    tracer = OtelTracer(start, exporter=InMemorySpanExporter()) if traced else None
    callback_s, events = 0.0, 0
    t0 = time.perf_counter()
    for event in main_loop(agent, start, ENV):
        events += 1
        if tracer is not None:
            c0 = time.perf_counter()
            tracer(event)
            callback_s += time.perf_counter() - c0
    loop_s = time.perf_counter() - t0
    close_s = 0.0
    if tracer is not None:
        c0 = time.perf_counter()
        tracer.close()
        close_s = time.perf_counter() - c0
    return {
        "loop_s": loop_s,
        "events": events,
        "callback_us": 1e6 * callback_s / max(events, 1),
        "close_s": close_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"session: {args.rounds} rounds (node run + LLM call + tool call each)")
    run(args.rounds, True)  # warm up (imports, caches)
    plain, traced = [], []
    for _ in range(args.repeats):  # interleaved, so that load on the machine hits both alike
        plain.append(run(args.rounds, False))
        traced.append(run(args.rounds, True))
    plain_s = statistics.median(r["loop_s"] for r in plain)
    traced_s = statistics.median(r["loop_s"] for r in traced)
    print(f"main loop, no tracer:     {plain_s:.3f} s ({plain[0]['events']:.0f} events)")
    print(f"main loop, OtelTracer:    {traced_s:.3f} s ({100 * (traced_s / plain_s - 1):+.1f} %)")
    print(f"tracer callback:          {statistics.median(r['callback_us'] for r in traced):.1f} us per event")
    print(f"tracer close (drain):     {statistics.median(r['close_s'] for r in traced):.3f} s")

    start: Tape[Any, Any] = Tape(steps=[UserStep(content="go")])
    calls, final = [], start
    for event in main_loop(make_agent(args.rounds), start, ENV):
        if event.agent_event is not None and event.agent_event.llm_call is not None:
            calls.append(event.agent_event.llm_call)
        if event.tape is not None:
            final = event.tape
    t0 = time.perf_counter()
    data = tapes_to_otlp_json([final], calls)
    export_s = time.perf_counter() - t0
    n_spans = len(data["resourceSpans"][0]["scopeSpans"][0]["spans"])
    text = json.dumps(data)
    t0 = time.perf_counter()
    (back,) = tapes_from_otlp_json(text)
    read_s = time.perf_counter() - t0
    assert back.model_dump() == final.model_dump()
    rate = n_spans / export_s
    print(f"tape -> OTLP JSON:        {n_spans} spans, {len(final)} steps, {export_s:.3f} s ({rate:.0f}/s)")
    print(f"OTLP JSON -> tape:        {len(text) / 1e6:.1f} MB in {read_s:.3f} s")


if __name__ == "__main__":
    main()
