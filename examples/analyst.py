"""The demo: the paper's financial analyst team (Figure 3) on the embedded model, offline.

The team itself (tools, nodes, the scripted stand-in brain) is :mod:`tapekit.testing.analyst`;
this script picks the model, runs the team, stores the tape and its LLM calls, and prints it.

    python examples/analyst.py                                   # the embedded SmolLM2, offline
    python examples/analyst.py --model scripted                  # the deterministic stand-in
    python examples/analyst.py --model http://127.0.0.1:8000/v1 --model-name NAME
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tapekit import main_loop, render_tape
from tapekit.llm import LLMError
from tapekit.store import SQLiteStore
from tapekit.testing.analyst import ENVIRONMENT, MeteredBrain, make_analyst, start_tape, team

__all__ = ["choose_llm", "main", "team"]


def choose_llm(model: str, model_name: str) -> tuple[Any, bool]:
    """The LLM for ``--model``, and whether it needs the JSON tool mode."""
    if model == "scripted":  # words count as tokens, so the printed tape shows usage
        return MeteredBrain(), False
    if model == "embedded":
        from tapekit.llm import LlamaCppLLM

        return LlamaCppLLM(parameters={"temperature": 0.0, "max_tokens": 96, "repeat_penalty": 1.3}), True
    if model.startswith(("http://", "https://")):
        from tapekit.llm import OpenAICompatibleLLM

        return OpenAICompatibleLLM(model_name=model_name, base_url=model), False
    if "/" in model:  # a LiteLLM provider string, e.g. anthropic/claude-3-5-haiku-latest
        from tapekit.llm import LiteLLM

        return LiteLLM(model_name=model), False
    raise SystemExit(
        f"--model {model!r}: use 'embedded', 'scripted', an OpenAI-compatible URL such as "
        "http://127.0.0.1:8000/v1, or a LiteLLM provider string such as anthropic/claude-3-5-haiku-latest"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the team, store its tape and LLM calls, print the tape."""
    parser = argparse.ArgumentParser(description="Run the analyst team of the TapeAgents paper (Figure 3).")
    parser.add_argument("question", nargs="*", help="what to ask (default: about Vulcan)")
    parser.add_argument(
        "--model", default="embedded", help="embedded (default), scripted, or an OpenAI-compatible URL"
    )
    parser.add_argument("--model-name", default="default", help="the model name to send to a URL endpoint")
    parser.add_argument("--db", default="tapekit.db", help="SQLite file for tapes and LLM calls")
    args = parser.parse_args(argv)
    question = " ".join(args.question) or "Tell me about Vulcan in 3 sentences"
    llm, json_tools = choose_llm(args.model, args.model_name)
    start = start_tape(question)
    calls = {}
    final = start
    with SQLiteStore(args.db) as store:
        try:
            agent = make_analyst(llm, json_tools)
            for event in main_loop(agent, start, ENVIRONMENT, max_loops=20, store=store):
                if event.llm_call is not None:
                    calls[event.llm_call.prompt.id] = event.llm_call
                if event.tape is not None:
                    final = event.tape
        except LLMError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    print(render_tape(final, llm_calls=calls))
    print(
        f"\nstored as tape {start.metadata.id} in {args.db} ({len(calls)} LLM calls, model {llm.model_name})"
    )
    return 1 if final.metadata.error else 0


if __name__ == "__main__":
    sys.exit(main())
