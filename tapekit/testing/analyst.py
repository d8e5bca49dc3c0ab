"""The paper's financial analyst and its web-search helper (Figure 3), fully offline.

The analyst plans, looks up a ticker and prices with tools, then Calls ``search_agent``, which
loops with SetNextNode over search and page tools and Responds; the analyst then answers.
The tools read a bundled mini corpus. Until a real model is wired in, the LLM is
``scripted_brain``: a deterministic function of the prompt that plays the model's part, so the
whole framework path (prompts, streaming, steps, views, environment) runs for real.

It is both the project's demo (``python examples/analyst.py`` runs it on the embedded model,
``--model scripted`` on the stand-in) and a realistic fixture for tests: a session with a
subagent Call/Respond, native tool calls, SetNextNode loops and eight LLM calls, deterministic
with :func:`scripted_brain`. ``tapekit run tapekit.testing.analyst:team QUESTION`` runs it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import (
    Call,
    LLMOutput,
    PartialStep,
    Prompt,
    Respond,
    SetNextNode,
    Step,
    StepMetadata,
    Tape,
    ToolCallRequest,
)
from tapekit.dialog import (
    AssistantStep,
    AssistantThought,
    ToolCall,
    ToolResult,
    UserStep,
    tool_calls_from_output,
    view_to_messages,
)
from tapekit.environment import ToolEnvironment
from tapekit.evaluate import Task
from tapekit.llm import FunctionLLM, LLMStream
from tapekit.llm.base import LLMEvent
from tapekit.orchestrator import main_loop

TODAY = "2024-09-17"
CORPUS: list[dict[str, str]] = json.loads((Path(__file__).parent / "data" / "corpus.json").read_text())
"""The bundled mini corpus the search tools read (``tapekit/testing/data/corpus.json``)."""
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
    max_tool_results: int = 3  # then the JSON mode only lets the model answer

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        guidance = "Follow the plan you made. When you are done, answer the user."
        messages = [
            {"role": "system", "content": SYSTEM},
            *_view_messages(agent, tape),
            {"role": "user", "content": guidance},
        ]
        return _tool_prompt(agent, tape, messages, ANALYST_TOOLS, self.max_tool_results)

    def generate_steps(
        self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream
    ) -> Iterator[Step | PartialStep]:
        output = as_native(llm_stream.get_output(), f"call_{len(tape)}")
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
        steps = node_run_steps(tape, index)
        body = next(s for s in steps if not isinstance(s, SetNextNode))
        if isinstance(body, AssistantStep):
            output = LLMOutput(content=body.content)
        elif isinstance(body, Call):
            args = json.dumps({"query": body.content})
            call_id = body.metadata.other.get("tool_call_id", "")
            output = LLMOutput(
                tool_calls=[ToolCallRequest(id=call_id, name="call_search_agent", arguments=args)]
            )
        else:
            output = LLMOutput(tool_calls=[c.to_request() for c in steps if isinstance(c, ToolCall)])
        return as_json(output) if agent.templates.get("json_tools") else output


class SearchNode(Node):
    """The search helper's only node: search and read pages until it can respond."""

    name: str = "search"
    max_tool_results: int = 2  # then the JSON mode only lets the model respond

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        system = {"role": "system", "content": "Use at most 4 tool calls to find the requested information."}
        messages = [system, *_view_messages(agent, tape)]
        return _tool_prompt(agent, tape, messages, SEARCH_TOOLS, self.max_tool_results)

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        output = as_native(llm_stream.get_output(), f"call_{len(tape)}")
        if output.tool_calls:
            yield from tool_calls_from_output(output)
            yield SetNextNode(next_node="search")
        else:
            yield Respond(content=output.content or "")

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        steps = node_run_steps(tape, index)
        if isinstance(steps[0], Respond):
            output = LLMOutput(content=steps[0].content)
        else:
            output = LLMOutput(tool_calls=[s.to_request() for s in steps if isinstance(s, ToolCall)])
        return as_json(output) if agent.templates.get("json_tools") else output


def _tool_prompt(
    agent: Agent,
    tape: Tape[Any, Any],
    messages: list[dict[str, Any]],
    tools: ToolEnvironment,
    max_results: int,
) -> Prompt:
    """A prompt offering ``tools``: natively, or in JSON tool mode as a response schema that
    makes the model look something up first and answer after at most ``max_results`` results."""
    schemas = tools.tool_schemas()
    if not agent.templates.get("json_tools"):
        return Prompt(messages=messages, tools=schemas)
    seen = agent.compute_view(tape).top.steps  # tool results and subagent answers since the call
    n = sum(isinstance(s, ToolResult | Respond) for s in seen)
    schema = json_tool_schema(schemas, allow_tools=n < max_results, allow_answer=n > 0)
    return Prompt(messages=messages, response_schema=schema)


# ----------------------------------------------------------------------------- JSON tool mode
# Small local models do not do native tool calling. In JSON mode (templates["json_tools"]) the
# tools become a schema-constrained JSON answer, {"tool": name, ...arguments} or {"answer": text},
# which the nodes convert to and from the native form; everything downstream is the same.


def json_tool_schema(
    tools: list[dict[str, Any]], allow_tools: bool = True, allow_answer: bool = True
) -> dict[str, Any]:
    """A response schema offering each tool (when allowed) and a final answer (when allowed)."""
    variants: list[dict[str, Any]] = []
    for tool in tools if allow_tools else []:
        function = tool["function"]
        params = function["parameters"]
        variants.append(
            {
                "type": "object",
                "properties": {"tool": {"const": function["name"]}, **params.get("properties", {})},
                "required": ["tool", *params.get("required", [])],
                "additionalProperties": False,
            }
        )
    if allow_answer or not variants:
        answer = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        variants.append({**answer, "additionalProperties": False})
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def as_native(output: LLMOutput, call_id: str) -> LLMOutput:
    """A JSON-mode answer in native form (a tool call, or text); native outputs pass through."""
    if output.tool_calls or not output.content:
        return output
    try:
        data = json.loads(output.content)
    except json.JSONDecodeError:
        return output
    if isinstance(data, dict) and "tool" in data:
        arguments = json.dumps({k: v for k, v in data.items() if k != "tool"})
        return LLMOutput(
            tool_calls=[ToolCallRequest(id=call_id, name=str(data["tool"]), arguments=arguments)]
        )
    if isinstance(data, dict) and "answer" in data:
        return LLMOutput(content=str(data["answer"]))
    return output


def as_json(output: LLMOutput) -> LLMOutput:
    """The inverse of :func:`as_native`: a native output as the JSON the model would write."""
    if output.tool_calls:
        call = output.tool_calls[0]
        return LLMOutput(content=json.dumps({"tool": call.name, **json.loads(call.arguments)}))
    return LLMOutput(content=json.dumps({"answer": output.content or ""}))


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


def _json(text: Any, default: Any) -> Any:
    """A tool result parsed as JSON, or ``default`` (a tool error, or text that is not JSON)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default


def _company(request: str) -> str | None:
    """The company the user asks about: the words after "about" when they start with a known
    company, else a known company named anywhere, else the words after "about", else None."""
    about = re.search(r"about (\w+(?: \w+)?)", request)
    name = re.sub(r"\s+in$", "", about.group(1).split(" in ")[0]) if about else None
    if name is not None and name.split()[0].lower() in TICKERS:
        return name
    lowered = request.lower()
    known = next((k for k in TICKERS if re.search(rf"\b{re.escape(k)}\b", lowered)), None)
    return known.title() if known else name


def scripted_brain(prompt: Prompt) -> LLMOutput:
    """A deterministic stand-in for the model: what a good LLM would answer to each prompt.

    Any question gets an answer: a known company (Vulcan, Acme) gets its ticker, prices and an
    overview from the search agent; a question about anything else gets what the search agent
    finds, and says plainly what the tools could not find."""
    msgs = prompt.messages
    text = " ".join(str(m.get("content") or "") for m in msgs)
    request = str(next((m["content"] for m in msgs if m["role"] == "user"), "") or "")
    tools = {t["function"]["name"] for t in prompt.tools or []}
    results = _tool_results(msgs)
    if "search" in tools:  # the search helper
        if "search" not in results:
            return _call("search", query=request)
        if "get_page" not in results:
            hits = _json(results["search"], [])
            if hits and isinstance(hits, list) and isinstance(hits[0], dict) and "url" in hits[0]:
                return _call("get_page", url=hits[0]["url"])
            return LLMOutput(content="I found nothing about this.")
        sentences = re.split(r"(?<=\.)\s+", str(results["get_page"]))
        return LLMOutput(content=" ".join(sentences[:2]))
    name = _company(request)
    if msgs[-1]["content"].startswith("Write a numbered plan"):
        if name is None:
            return LLMOutput(content="1. Ask the search agent about the question. 2. Answer briefly.")
        return LLMOutput(
            content=f"1. Find the ticker of {name}. 2. Get its prices over the last year. "
            f"3. Ask the search agent for an overview of {name}. 4. Answer in 3 sentences."
        )
    if name is not None and "get_stock_ticker" not in results:
        return _call("get_stock_ticker", company_name=name.split()[0])
    ticker = results.get("get_stock_ticker")
    known_ticker = ticker in PRICES
    if known_ticker and "ticker" in request.lower():
        return LLMOutput(content=f"The stock ticker of {name} is {ticker}.")
    if known_ticker and "get_stock_data" not in results:
        return _call("get_stock_data", symbol=ticker, start_date="2023-09-17", end_date=TODAY)
    if "answers)" not in text:
        query = f"{name} company overview" if name is not None else request
        return _call("call_search_agent", query=query)
    overview = next(m["content"] for m in reversed(msgs) if "answers)" in str(m.get("content")))
    overview = overview.split(") ", 1)[-1]
    if not known_ticker:
        missing = f" I could not find a stock ticker for {name}." if name is not None else ""
        return LLMOutput(content=f"{overview}{missing}".strip() or "I could not find an answer.")
    prices = _json(results.get("get_stock_data"), [])
    if not prices:
        return LLMOutput(content=f"{overview} Its stock ({ticker}) has no prices for the last year.")
    change = (prices[-1][1] / prices[0][1] - 1) * 100
    return LLMOutput(
        content=f"{overview} Over the last year its stock ({ticker}) moved "
        f"{change:+.1f}%, from {prices[0][1]} to {prices[-1][1]}."
    )


def _call(name: str, **arguments: Any) -> LLMOutput:
    digest = hashlib.sha1(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:8]
    call_id = f"call_{digest}"
    return LLMOutput(tool_calls=[ToolCallRequest(id=call_id, name=name, arguments=json.dumps(arguments))])


class MeteredBrain(FunctionLLM):
    """:func:`scripted_brain` reporting usage like a paid API (words counted as tokens, a price
    per token), so that tools such as the Studio have token and cost figures to show."""

    model_name: str = "scripted-brain"
    fn: Any = scripted_brain
    cost_per_prompt_token: float = 1e-6
    cost_per_output_token: float = 4e-6

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return _metered(super()._astream(prompt), prompt)


async def _metered(events: AsyncIterator[LLMEvent], prompt: Prompt) -> AsyncIterator[LLMEvent]:
    n_prompt = sum(len(str(m.get("content") or "").split()) for m in prompt.messages)
    async for event in events:
        if event.output is not None:
            out = event.output
            n_out = len((out.content or "").split()) + sum(
                len(c.arguments.split()) for c in out.tool_calls or []
            )
            event = event.model_copy(update={"prompt_tokens": n_prompt, "output_tokens": n_out})
        yield event


# ----------------------------------------------------------------------------- the team


def make_analyst(llm: Any = None, json_tools: bool = False) -> Agent:
    """The analyst team of Figure 3: ``analyst`` (plan, act) with subagent ``search_agent``.

    ``json_tools`` switches the nodes to schema-constrained JSON instead of native tool calls
    (for small local models such as the embedded SmolLM2).
    """
    llm = llm or FunctionLLM(fn=scripted_brain, model_name="scripted-brain")
    templates = {"json_tools": json_tools}
    search_agent = Agent.create(name="search_agent", llms=llm, nodes=[SearchNode()], templates=templates)
    return Agent.create(
        name="analyst", llms=llm, nodes=[PlanNode(), ActNode()], subagents=[search_agent], templates=templates
    )


def team() -> tuple[Agent, ToolEnvironment]:
    """The scripted team and its tools, e.g. for ``tapekit studio --agent tapekit.testing.analyst:team``."""
    return make_analyst(), ENVIRONMENT


def start_tape(question: str = "Tell me about Vulcan in 3 sentences") -> Tape[Any, Any]:
    """A tape holding just the user's question."""
    return Tape(steps=[UserStep(content=question)])


def run(question: str = "Tell me about Vulcan in 3 sentences") -> Tape[Any, Any]:
    """Run the scripted team until it answers the user; return the final tape."""
    return main_loop(make_analyst(), start_tape(question), ENVIRONMENT).get_final_tape()


TASKS = [
    Task(id="ticker-vulcan", question="What is Vulcan's ticker?", expected="VMC", category="ticker"),
    Task(id="ticker-acme", question="What is Acme's ticker?", expected="ACME", category="ticker"),
    Task(
        id="about-vulcan", question="Tell me about Vulcan in 3 sentences", expected="Vulcan", category="about"
    ),
    Task(
        id="about-acme", question="Tell me about Acme in 2 sentences", expected="robotics", category="about"
    ),
]
"""Four questions with expected answers for ``tapekit eval`` and evaluation tests. The scripted
brain answers the first three; on the fourth it finds Acme's prices but describes Vulcan (its
search corpus knows no Acme), so ``contains`` fails it: a report with a failure to look at."""
