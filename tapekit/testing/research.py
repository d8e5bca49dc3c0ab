"""A research lead that asks three search helpers at once, then merges what they found.

The lead's first node turns the question into three search queries and makes a ``Fork``: one
branch per query, each a Call of the ``searcher`` subagent. The branches run concurrently, each
with its own LLM calls and tool calls, and each sees the tape as it was at the fork plus its own
steps. On the tape they appear one after another (Call ... Respond), so the lead's ``merge``
node sees the three answers exactly as if it had asked in turn.

``python examples/research.py`` runs it (offline, a deterministic stand-in model with 200 ms per
LLM call): the three searches take about the time of one. The fork tests use it as a fixture.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import Any

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import Call, Fork, LLMOutput, Prompt, Respond, SetNextNode, Step, Tape
from tapekit.dialog import AssistantStep, ToolCall, ToolResult, UserStep
from tapekit.environment import ToolEnvironment
from tapekit.llm import FunctionLLM, LLMStream
from tapekit.orchestrator import async_main_loop

FACTS = {
    "vulcan materials products": "Vulcan Materials is the largest US producer of crushed stone and gravel.",
    "vulcan materials stock": "Vulcan Materials (VMC) rose about 20% over the last year.",
    "vulcan materials history": "Vulcan Materials was founded in 1909 in Birmingham, Alabama.",
}


def search(query: str) -> str:
    """Search a small offline encyclopedia.

    Args:
        query: what to look up.
    """
    return FACTS.get(query.lower(), f"nothing found for {query!r}")


def _question(tape: Tape[Any, Any]) -> str:
    return next(s.content for s in tape.steps if isinstance(s, UserStep))


class FanOutNode(Node):
    """Writes three search queries (JSON) and forks one searcher per query."""

    name: str = "fan_out"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(
            messages=[
                {"role": "system", "content": 'Answer with JSON: {"queries": [three search queries]}.'},
                {"role": "user", "content": _question(tape)},
            ]
        )

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        queries = json.loads(llm_stream.get_text())["queries"]
        yield SetNextNode(next_node="merge")
        yield Fork.of(*(("searcher", q) for q in queries))

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        fork = node_run_steps(tape, index)[-1]
        assert isinstance(fork, Fork)
        return LLMOutput(content=json.dumps({"queries": [b.content for b in fork.branches]}))


class MergeNode(Node):
    """Answers the user from the searchers' responses."""

    name: str = "merge"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        found = [s.content for s in agent.compute_view(tape).top.steps if isinstance(s, Respond)]
        notes = "\n".join(f"- {f}" for f in found)
        return Prompt(
            messages=[
                {"role": "system", "content": "Answer the question from the notes, in one paragraph."},
                {"role": "user", "content": f"Question: {_question(tape)}\nNotes:\n{notes}"},
            ]
        )

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield AssistantStep(content=llm_stream.get_text())

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        step = tape.steps[index]
        assert isinstance(step, AssistantStep)
        return LLMOutput(content=step.content)


class SearchNode(Node):
    """The searcher: look the query up with the search tool."""

    name: str = "search"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        opened = agent.compute_view(tape).top.steps[0]  # the Call that opened this branch
        assert isinstance(opened, Call)
        query = opened.content
        return Prompt(
            messages=[{"role": "user", "content": f"Search for: {query}"}],
            tools=TOOLS.tool_schemas(),
        )

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        calls = llm_stream.get_output().tool_calls
        if not calls:
            raise ValueError("the searcher's LLM answered without a search tool call")
        call = calls[0]
        yield ToolCall(name=call.name, arguments=json.loads(call.arguments), call_id=call.id)

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        return LLMOutput(
            tool_calls=[s.to_request() for s in node_run_steps(tape, index) if isinstance(s, ToolCall)]
        )


class SummarizeNode(Node):
    """The searcher: sum up the tool's result for the lead."""

    name: str = "summarize"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        view = agent.compute_view(tape).top.steps
        result = next(s for s in reversed(view) if isinstance(s, ToolResult))
        return Prompt(messages=[{"role": "user", "content": f"Sum up in one sentence: {result.content}"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield Respond(content=llm_stream.get_text())

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        step = tape.steps[index]
        assert isinstance(step, Respond)
        return LLMOutput(content=step.content)


TOOLS = ToolEnvironment([search])


def scripted_brain(prompt: Prompt) -> LLMOutput:
    """A deterministic stand-in for a model: a function of the prompt only."""
    system = prompt.messages[0]["content"] if prompt.messages[0]["role"] == "system" else ""
    user = prompt.messages[-1]["content"]
    if system.startswith("Answer with JSON"):
        queries = ["Vulcan Materials products", "Vulcan Materials stock", "Vulcan Materials history"]
        return LLMOutput(content=json.dumps({"queries": queries}))
    if system.startswith("Answer the question"):
        notes = [line[2:] for line in user.splitlines() if line.startswith("- ")]
        return LLMOutput(content=" ".join(notes))
    if user.startswith("Search for: "):
        query = user.removeprefix("Search for: ")
        call_id = f"call_{zlib.crc32(query.encode())}"
        args = json.dumps({"query": query})
        return LLMOutput(tool_calls=[{"id": call_id, "name": "search", "arguments": args}])
    return LLMOutput(content=user.removeprefix("Sum up in one sentence: "))


def make_lead(llm: Any = None, latency_s: float = 0.2) -> Agent:
    """The research team: a lead with fan_out and merge nodes, and one searcher subagent."""
    llm = llm or FunctionLLM(fn=scripted_brain, latency_s=latency_s)
    searcher = Agent.create("searcher", llms=llm, nodes=[SearchNode(), SummarizeNode()])
    return Agent.create("lead", llms=llm, nodes=[FanOutNode(), MergeNode()], subagents=[searcher])


def start_tape(question: str = "What should I know about Vulcan Materials?") -> Tape[Any, Any]:
    """A tape holding just the user's question."""
    return Tape(steps=[UserStep(content=question)])


async def arun(agent: Agent, tape: Tape[Any, Any]) -> Tape[Any, Any]:
    """Run the team on ``tape`` with the search tool until it answers."""
    return await async_main_loop(agent, tape, TOOLS).get_final_tape()
