"""The paper's financial analyst and its web-search helper (Figure 3), fully offline.

The analyst plans, looks up a ticker and prices with tools, then Calls ``search_agent``, which
loops with SetNextNode over search and page tools and Responds; the analyst then answers.
The tools read a bundled mini corpus. Until a real model is wired in, the LLM is
``scripted_brain``: a deterministic function of the prompt that plays the model's part, so the
whole framework path (prompts, streaming, steps, views, environment) runs for real.

Run: ``python examples/analyst.py "Tell me about Vulcan in 3 sentences"``
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tapekit import (
    Agent,
    AssistantStep,
    AssistantThought,
    Call,
    FunctionLLM,
    LLMOutput,
    LLMStream,
    Node,
    PartialStep,
    Prompt,
    Respond,
    SetNextNode,
    Step,
    StepMetadata,
    Tape,
    ToolCall,
    ToolCallRequest,
    ToolEnvironment,
    UserStep,
    main_loop,
    tool_calls_from_output,
    view_to_messages,
)
from tapekit.rendering import render_tape

TODAY = "2024-09-17"
CORPUS: list[dict[str, str]] = json.loads((Path(__file__).parent / "data" / "corpus.json").read_text())
TICKERS = {"vulcan": "VMC", "vulcan materials": "VMC", "acme": "ACME", "acme robotics": "ACME"}
PRICES = {
    "VMC": [("2023-09-18", 211.69), ("2024-01-02", 223.21), ("2024-05-01", 257.02), ("2024-09-16", 239.10)],
    "ACME": [("2023-09-18", 12.40), ("2024-01-02", 14.05), ("2024-05-01", 13.10), ("2024-09-16", 15.75)],
}

# ----------------------------------------------------------------------------- tools


def get_stock_ticker(company_name: str) -> str:
    """Find the stock ticker symbol of a company.

    Args:
        company_name: the company's name, e.g. "Vulcan".
    """
    key = company_name.lower().strip()
    if key not in TICKERS:
        raise ValueError(f"no ticker known for {company_name!r}")
    return TICKERS[key]


def get_stock_data(symbol: str, start_date: str, end_date: str) -> list[tuple[str, float]]:
    """Daily closing prices of a stock between two dates (inclusive, YYYY-MM-DD).

    Args:
        symbol: the ticker symbol.
        start_date: first day.
        end_date: last day.
    """
    if symbol not in PRICES:
        raise ValueError(f"unknown symbol {symbol!r}")
    return [(d, p) for d, p in PRICES[symbol] if start_date <= d <= end_date]


def search(query: str, max_results: int = 2) -> list[dict[str, str]]:
    """Search the web (a bundled mini corpus) and return titles and URLs.

    Args:
        query: what to look for.
        max_results: how many results to return.
    """
    words = set(re.findall(r"\w+", query.lower()))
    scored = [
        (len(words & set(re.findall(r"\w+", (d["title"] + " " + d["text"]).lower()))), d) for d in CORPUS
    ]
    ranked = [d for score, d in sorted(scored, key=lambda x: -x[0]) if score > 0]
    return [{"title": d["title"], "url": d["url"]} for d in ranked[:max_results]]


def get_page(url: str) -> str:
    """The text of a web page.

    Args:
        url: the page's URL, from search results.
    """
    for doc in CORPUS:
        if doc["url"] == url:
            return doc["text"]
    raise ValueError(f"page not found: {url}")


def call_search_agent(query: str) -> None:
    """Ask a fellow AI agent to search the web for information.

    Args:
        query: what to find out.
    """


ANALYST_TOOLS = ToolEnvironment([get_stock_ticker, get_stock_data, call_search_agent])
SEARCH_TOOLS = ToolEnvironment([search, get_page])
ENVIRONMENT = ToolEnvironment([get_stock_ticker, get_stock_data, search, get_page])

SYSTEM = (
    "You help the user learn about the financials of companies. For general questions, include "
    f"the stock price change over the last year and some general facts. Today is {TODAY}."
)

# ----------------------------------------------------------------------------- nodes


def _view_messages(agent: Agent, tape: Tape[Any, Any]) -> list[dict[str, Any]]:
    return view_to_messages(agent.compute_view(tape).top.steps, agent.full_name)


class PlanNode(Node):
    """Writes a numbered plan as a thought."""

    name: str = "plan"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        guidance = "Write a numbered plan of how to use the tools to help the user."
        return Prompt(
            messages=[
                {"role": "system", "content": SYSTEM},
                *_view_messages(agent, tape),
                {"role": "user", "content": guidance},
            ],
            tools=ANALYST_TOOLS.tool_schemas(),
        )

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield AssistantThought(content=llm_stream.get_text())

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        step = tape.steps[index]
        assert isinstance(step, AssistantThought)
        return LLMOutput(content=step.content)


class ActNode(Node):
    """Follows the plan: calls tools, delegates web search, or answers the user."""

    name: str = "act"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        guidance = "Follow the plan you made. When you are done, answer the user."
        return Prompt(
            messages=[
                {"role": "system", "content": SYSTEM},
                *_view_messages(agent, tape),
                {"role": "user", "content": guidance},
            ],
            tools=ANALYST_TOOLS.tool_schemas(),
        )

    def generate_steps(
        self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream
    ) -> Iterator[Step | PartialStep]:
        output = llm_stream.get_output()
        if output.tool_calls:
            yield SetNextNode(next_node="act")
            calls = tool_calls_from_output(output)
            delegate = next((c for c in calls if c.name == "call_search_agent"), None)
            if delegate is not None:  # the tool call's id rides along so make_llm_output is exact
                yield Call(
                    agent_name="search_agent",
                    content=str(delegate.arguments.get("query", "")),
                    metadata=StepMetadata(other={"tool_call_id": delegate.call_id}),
                )
            else:
                yield from calls
        else:
            yield SetNextNode(next_node="plan")
            yield AssistantStep(content=output.content or "")

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        steps = list(tape.steps[index:])
        body = steps[1]
        if isinstance(body, AssistantStep):
            return LLMOutput(content=body.content)
        if isinstance(body, Call):
            args = json.dumps({"query": body.content})
            call_id = body.metadata.other.get("tool_call_id", "")
            return LLMOutput(
                tool_calls=[ToolCallRequest(id=call_id, name="call_search_agent", arguments=args)]
            )
        calls = [s for s in _same_run(steps) if isinstance(s, ToolCall)]
        return LLMOutput(tool_calls=[c.to_request() for c in calls])


class SearchNode(Node):
    """The search helper's only node: search and read pages until it can respond."""

    name: str = "search"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        system = {"role": "system", "content": "Use at most 4 tool calls to find the requested information."}
        return Prompt(messages=[system, *_view_messages(agent, tape)], tools=SEARCH_TOOLS.tool_schemas())

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        output = llm_stream.get_output()
        if output.tool_calls:
            yield from tool_calls_from_output(output)
            yield SetNextNode(next_node="search")
        else:
            yield Respond(content=output.content or "")

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        steps = list(_same_run(tape.steps[index:]))
        if isinstance(steps[0], Respond):
            return LLMOutput(content=steps[0].content)
        return LLMOutput(tool_calls=[s.to_request() for s in steps if isinstance(s, ToolCall)])


def _same_run(steps: Any) -> Iterator[Step]:
    steps = list(steps)
    pid = steps[0].metadata.prompt_id
    for s in steps:
        if s.metadata.prompt_id != pid:
            return
        yield s


# ----------------------------------------------------------------------------- the stand-in model


def _tool_results(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Results of the tool calls in the conversation, by tool name (latest wins)."""
    names = {}
    results: dict[str, Any] = {}
    for m in messages:
        for call in m.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
        if m["role"] == "tool":
            results[names.get(m["tool_call_id"], "?")] = m["content"]
    return results


def scripted_brain(prompt: Prompt) -> LLMOutput:
    """A deterministic stand-in for the model: what a good LLM would answer to each prompt."""
    msgs = prompt.messages
    text = " ".join(str(m.get("content") or "") for m in msgs)
    request = next((m["content"] for m in msgs if m["role"] == "user"), "")
    tools = {t["function"]["name"] for t in prompt.tools or []}
    results = _tool_results(msgs)
    if "search" in tools:  # the search helper
        if "search" not in results:
            return _call("search", query=request)
        if "get_page" not in results:
            hits = json.loads(results["search"])
            if hits:
                return _call("get_page", url=hits[0]["url"])
            return LLMOutput(content="I found nothing about this.")
        sentences = re.split(r"(?<=\.)\s+", results["get_page"])
        return LLMOutput(content=" ".join(sentences[:2]))
    company = re.search(r"about (\w+(?: \w+)?)", request) or re.search(r"(\w+)", request or "it")
    name = company.group(1).split(" in ")[0] if company else "the company"
    name = re.sub(r"\s+in$", "", name)
    if msgs[-1]["content"].startswith("Write a numbered plan"):
        return LLMOutput(
            content=f"1. Find the ticker of {name}. 2. Get its prices over the last year. "
            f"3. Ask the search agent for an overview of {name}. 4. Answer in 3 sentences."
        )
    if "get_stock_ticker" not in results:
        return _call("get_stock_ticker", company_name=name.split()[0])
    if "get_stock_data" not in results:
        return _call(
            "get_stock_data", symbol=results["get_stock_ticker"], start_date="2023-09-17", end_date=TODAY
        )
    if "answers)" not in text:
        return _call("call_search_agent", query=f"{name} company overview")
    prices = json.loads(results["get_stock_data"])
    change = (prices[-1][1] / prices[0][1] - 1) * 100 if prices else 0.0
    overview = next(m["content"] for m in reversed(msgs) if "answers)" in str(m.get("content")))
    overview = overview.split(") ", 1)[-1]
    return LLMOutput(
        content=f"{overview} Over the last year its stock ({results['get_stock_ticker']}) moved "
        f"{change:+.1f}%, from {prices[0][1]} to {prices[-1][1]}."
    )


def _call(name: str, **arguments: Any) -> LLMOutput:
    digest = hashlib.sha1(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:8]
    call_id = f"call_{digest}"
    return LLMOutput(tool_calls=[ToolCallRequest(id=call_id, name=name, arguments=json.dumps(arguments))])


# ----------------------------------------------------------------------------- the team


def make_analyst(llm: Any = None) -> Agent:
    """The analyst team of Figure 3: ``analyst`` (plan, act) with subagent ``search_agent``."""
    llm = llm or FunctionLLM(fn=scripted_brain, model_name="scripted-brain")
    search_agent = Agent.create(name="search_agent", llms=llm, nodes=[SearchNode()])
    return Agent.create(name="analyst", llms=llm, nodes=[PlanNode(), ActNode()], subagents=[search_agent])


def start_tape(question: str = "Tell me about Vulcan in 3 sentences") -> Tape[Any, Any]:
    """A tape holding just the user's question."""
    return Tape(steps=[UserStep(content=question)])


def run(question: str = "Tell me about Vulcan in 3 sentences") -> Tape[Any, Any]:
    """Run the team until it answers the user; return the final tape."""
    return main_loop(make_analyst(), start_tape(question), ENVIRONMENT).get_final_tape()


if __name__ == "__main__":
    question = " ".join(sys.argv[1:]) or "Tell me about Vulcan in 3 sentences"
    print(render_tape(run(question)))
