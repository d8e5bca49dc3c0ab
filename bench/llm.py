"""The embedded model's speed, and tapekit's own overhead per LLM call.

Tokens/s: raw llama_cpp streaming generation, nothing else. Overhead: for each call through
tapekit, the time spent inside llama.cpp's generator (measured in the worker thread) is
subtracted from the call's wall time; what is left is tapekit's own cost per call, for
  llm      LlamaCppLLM.astream (worker thread, event conversion, token counting)
  agent    a one-node agent run (prompt, LLM stream, step, tape, events)
Needs scripts/install-local.sh.

    python bench/llm.py [--calls 20] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time
from collections.abc import Iterator
from typing import Any, Literal

from tapekit import Action, Agent, LLMStream, Node, Prompt, Step, Tape, UserStep
from tapekit.llm.llamacpp import LlamaCppLLM

QUESTIONS = [
    "What is a tape in an agent framework?",
    "Name three uses of a log file.",
    "Explain recursion to a child.",
    "Why is the sky blue?",
    "Give a tip for writing tests.",
]


class Answer(Action):
    kind: Literal["bench_llm_answer"] = "bench_llm_answer"
    text: str


class TimedLlamaCppLLM(LlamaCppLLM):
    """Adds up the time spent inside llama.cpp's generator (the model's own work)."""

    model_seconds: float = 0.0

    def _generate(self, prompt: Prompt) -> Iterator[Any]:
        inner = super()._generate(prompt)
        while True:
            t0 = time.perf_counter()
            try:
                chunk = next(inner)
            except StopIteration:
                self.model_seconds += time.perf_counter() - t0
                return
            self.model_seconds += time.perf_counter() - t0
            yield chunk


class AskNode(Node):
    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": tape.steps[-1].content}])  # type: ignore[attr-defined]

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield Answer(text=llm_stream.get_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    llm = TimedLlamaCppLLM(parameters={"temperature": 0.0, "max_tokens": args.max_tokens})
    llama = llm.load()
    agent = Agent.create(name="bench", llms=llm, nodes=[AskNode()], max_iterations=1)

    def raw(question: str) -> int:
        llama.reset()
        n = 0
        for chunk in llama.create_chat_completion(
            messages=[{"role": "user", "content": question}],
            temperature=0.0,
            max_tokens=args.max_tokens,
            stream=True,
        ):
            n += bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
        return n

    async def via_llm(question: str) -> int:
        final = None
        async for event in llm.astream(Prompt(messages=[{"role": "user", "content": question}])):
            final = event
        assert final is not None
        return final.output_tokens or 0

    async def via_agent(question: str) -> int:
        tokens = 0
        async for event in agent.arun(Tape(steps=[UserStep(content=question)])):
            if event.llm_call is not None:
                tokens = event.llm_call.output_tokens
        return tokens

    raw(QUESTIONS[0])  # warm-up
    asyncio.run(via_agent(QUESTIONS[0]))
    raw_s, tokens = 0.0, 0
    overhead: dict[str, list[float]] = {"llm": [], "agent": []}
    for i in range(args.calls):
        question = QUESTIONS[i % len(QUESTIONS)]
        t0 = time.perf_counter()
        raw(question)
        raw_s += time.perf_counter() - t0
        for path, run in (("llm", via_llm), ("agent", via_agent)):
            llm.model_seconds = 0.0
            t0 = time.perf_counter()
            n = asyncio.run(run(question))
            overhead[path].append(time.perf_counter() - t0 - llm.model_seconds)
            tokens += n if path == "llm" else 0
    print(
        f"# {platform.node()} {platform.machine()} python {platform.python_version()}, model {llm.model_name}"
    )
    print(
        f"backend=llamacpp calls={args.calls} output_tokens={tokens} "
        f"tokens_per_s={tokens / raw_s:.1f} ms_per_call={1000 * raw_s / args.calls:.1f}"
    )
    for path, values in overhead.items():
        print(
            f"path={path} overhead_ms_per_call_median={1000 * statistics.median(values):.2f} "
            f"overhead_ms_per_call_p90={1000 * sorted(values)[int(0.9 * (len(values) - 1))]:.2f}"
        )


if __name__ == "__main__":
    main()
