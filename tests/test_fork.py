"""Forks: several subagent Calls run concurrently inside one agent turn."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import PrivateAttr

from tapekit import (
    Agent,
    AssistantStep,
    AssistantThought,
    Call,
    Environment,
    Fork,
    FunctionLLM,
    LLMCall,
    LLMOutput,
    LLMStream,
    Node,
    Prompt,
    Respond,
    SetNextNode,
    Step,
    Tape,
    ToolCall,
    ToolEnvironment,
    UserStep,
    async_main_loop,
    main_loop,
    node_run_steps,
    reconstruct_llm_calls,
    replay_tape,
)
from tapekit._diff import signatures
from tapekit.llm.base import LLMEvent
from tapekit.testing import research

# ----------------------------------------------------------------------------- a generic team


def _calls_seen(tape: Tape[Any, Any]) -> str:
    """What a node could see of the whole tape: the content of every Call on it."""
    return ",".join(s.content for s in tape.steps if isinstance(s, Call))


class FanNode(Node):
    """Asks the LLM for a JSON list and forks one ``target`` branch per item."""

    name: str = "fan"
    target: str

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        view = agent.compute_view(tape).top
        topic = view.call.content if view.call is not None else "root"
        return Prompt(messages=[{"role": "user", "content": f"fan {topic}"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield SetNextNode(next_node="merge")
        yield Fork.of(*((self.target, item) for item in json.loads(llm_stream.get_text())))

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        fork = node_run_steps(tape, index)[-1]
        assert isinstance(fork, Fork)
        return LLMOutput(content=json.dumps([b.content for b in fork.branches]))


class MergeNode(Node):
    """Joins the responses it sees; responds, or answers the user at the root."""

    name: str = "merge"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        got = [s.content for s in agent.compute_view(tape).top.steps if isinstance(s, Respond)]
        return Prompt(messages=[{"role": "user", "content": "merge " + "|".join(got)}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        text = llm_stream.get_text()
        yield Respond(content=text) if agent.manager is not None else AssistantStep(content=text)

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        return LLMOutput(content=tape.steps[index].content)


class LeafNode(Node):
    """Responds with what it could see of the whole tape (to check branch separation)."""

    name: str = "leaf"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": f"leaf saw {_calls_seen(tape)}"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield Respond(content=llm_stream.get_text())

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        return LLMOutput(content=tape.steps[index].content)


def brain(prompt: Prompt) -> str:
    text = prompt.messages[-1]["content"]
    if text == "fan root":
        return json.dumps(["a", "b", "c"])
    if text.startswith("fan "):
        topic = text.removeprefix("fan ")
        return json.dumps([f"{topic}1", f"{topic}2"])
    if text.startswith("leaf saw "):
        return text.removeprefix("leaf saw ")
    return text.removeprefix("merge ")


class Counting:
    """A deterministic LLM function that also counts and logs its prompts."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.prompts: list[str] = []
        self.fail_on = fail_on

    def __call__(self, prompt: Prompt) -> str:
        text = prompt.messages[-1]["content"]
        self.prompts.append(text)
        if self.fail_on is not None and self.fail_on in text:
            raise RuntimeError(f"model down for {text!r}")
        return brain(prompt)


class InFlightLLM(FunctionLLM):
    """A FunctionLLM that records the most of its calls that were in flight at once: calls
    that overlap prove concurrency without timing anything."""

    _now: int = PrivateAttr(0)
    _peak: int = PrivateAttr(0)

    @property
    def peak(self) -> int:
        """The most calls in flight at the same time so far."""
        return self._peak

    async def astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        """The wrapped stream, counted while it runs."""
        self._now += 1
        self._peak = max(self._peak, self._now)
        try:
            async for event in super().astream(prompt):
                yield event
        finally:
            self._now -= 1


def flat_team(fn: Any = brain, latency_s: float = 0.0) -> Agent:
    llm = FunctionLLM(fn=fn, latency_s=latency_s)
    leaf = Agent.create("leaf", llms=llm, nodes=[LeafNode()])
    return Agent.create("lead", llms=llm, nodes=[FanNode(target="leaf"), MergeNode()], subagents=[leaf])


def nested_team(fn: Any = brain) -> Agent:
    llm = FunctionLLM(fn=fn)
    leaf = Agent.create("leaf", llms=llm, nodes=[LeafNode()])
    mid = Agent.create("mid", llms=llm, nodes=[FanNode(target="leaf"), MergeNode()], subagents=[leaf])
    return Agent.create("lead", llms=llm, nodes=[FanNode(target="mid"), MergeNode()], subagents=[mid])


def start() -> Tape[Any, Any]:
    return Tape(steps=[UserStep(content="go")])


async def run_agent(agent: Agent, tape: Tape[Any, Any]) -> tuple[Tape[Any, Any], list[LLMCall]]:
    calls: list[LLMCall] = []
    final = None
    async for event in agent.arun(tape):
        if event.llm_call is not None:
            calls.append(event.llm_call)
        if event.final_tape is not None:
            final = event.final_tape
    assert final is not None
    return final, calls


def content(tape: Tape[Any, Any]) -> list[Any]:
    return signatures(tape.steps)


# ----------------------------------------------------------------------------- layout and views


def test_branches_join_in_order_and_see_only_their_own_steps() -> None:
    tape, calls = asyncio.run(run_agent(flat_team(), start()))
    assert tape.metadata.error is None
    kinds = [s.kind for s in tape.steps]
    assert kinds == ["user", "set_next_node", "fork"] + ["call", "respond"] * 3 + ["assistant"]
    # each branch saw the tape up to the fork plus its own Call, never a sibling's
    responds = [s.content for s in tape.steps if isinstance(s, Respond)]
    assert responds == ["a", "b", "c"]
    assert tape.steps[-1].content == "a|b|c"
    # authorship: branch Calls belong to the forking node, responses to the subagent
    call_steps = [s for s in tape.steps if isinstance(s, Call)]
    assert {(s.metadata.agent, s.metadata.node) for s in call_steps} == {("lead", "fan")}
    assert all(s.metadata.agent == "lead/leaf" for s in tape.steps if isinstance(s, Respond))
    assert len(calls) == 5  # fan, three leaves, merge
    # the final view stack: the fork is joined, the root sees all three responses
    top = flat_team().compute_view(tape).top
    assert top.fork is None and [s.content for s in top.steps if isinstance(s, Respond)] == responds


def test_nested_forks_keep_every_branch_apart() -> None:
    tape, _ = asyncio.run(run_agent(nested_team(), start()))
    assert tape.metadata.error is None
    leaves = [s.content for s in tape.steps if isinstance(s, Respond) and s.metadata.agent == "lead/mid/leaf"]
    # a leaf sees the fork prefix: the outer Call of its own mid branch, then its own Call
    assert leaves == ["a,a1", "a,a2", "b,b1", "b,b2", "c,c1", "c,c2"]
    assert tape.steps[-1].content == "a,a1|a,a2|b,b1|b,b2|c,c1|c,c2"


def test_visible_prefix_rebuilds_what_each_branch_saw() -> None:
    team = flat_team()
    tape, _ = asyncio.run(run_agent(team, start()))
    third_call = [i for i, s in enumerate(tape.steps) if isinstance(s, Call)][2]
    seen = team.visible_prefix(tape, third_call + 1)
    assert [s.kind for s in seen.steps] == ["user", "set_next_node", "fork", "call"]
    assert seen.steps[-1].content == "c"
    assert len(team.visible_prefix(tape, len(tape) - 1)) == len(tape) - 1  # after the join: all


# ----------------------------------------------------------------------------- concurrency


def test_the_three_calls_of_a_fork_are_in_flight_together() -> None:
    llm = FunctionLLM(fn=brain)
    slow = InFlightLLM(fn=brain, latency_s=0.05)
    leaf = Agent.create("leaf", llms=slow, nodes=[LeafNode()])
    team = Agent.create("lead", llms=llm, nodes=[FanNode(target="leaf"), MergeNode()], subagents=[leaf])
    tape, _ = asyncio.run(run_agent(team, start()))
    assert tape.metadata.error is None
    assert slow.peak == 3, f"at most {slow.peak} of the three branch calls overlapped"


def test_branches_with_tool_calls_run_under_the_main_loop() -> None:
    llm = InFlightLLM(fn=research.scripted_brain, latency_s=0.05)
    tape = asyncio.run(research.arun(research.make_lead(llm), research.start_tape()))
    assert tape.metadata.error is None
    kinds = [s.kind for s in tape.steps]
    assert kinds[3:] == ["call", "tool_call", "tool_result", "respond"] * 3 + ["assistant"]
    assert "crushed stone" in tape.steps[-1].content and "1909" in tape.steps[-1].content
    assert llm.peak == 3, f"at most {llm.peak} of the three branches' LLM calls overlapped"


def test_a_branch_action_without_an_environment_is_a_clear_error() -> None:
    team = research.make_lead(latency_s=0)
    tape, _ = asyncio.run(run_agent(team, research.start_tape()))
    assert tape.metadata.error is not None
    assert "branch 0 (searcher)" in tape.metadata.error
    assert "without an environment" in tape.metadata.error


class SearchOnce(Node):
    """A root's one node: a search tool call (no LLM), like each searcher branch makes."""

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield ToolCall(name="search", arguments={"query": "vulcan materials stock"})


def solo() -> tuple[Agent, Tape[Any, Any]]:
    """A session with no fork whose first move is the searchers' kind of action."""
    return Agent.create("solo", nodes=[SearchOnce()]), Tape(steps=[UserStep(content="search")])


class Broken(Environment):
    """An environment whose backend is down: every reaction raises."""

    name = "broken"

    def react(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        raise ConnectionError("backend down")


def test_a_branch_whose_environment_fails_records_the_main_loops_failure_text() -> None:
    # the main loop's text for a failed environment, on a session with no fork
    session_error = main_loop(*solo(), Broken()).get_final_tape().metadata.error
    assert session_error == "ConnectionError: backend down (in environment broken)"
    # the same text, naming the branch, when the environment fails inside a fork branch
    forked = main_loop(research.make_lead(latency_s=0), research.start_tape(), Broken()).get_final_tape()
    error = forked.metadata.error or ""
    assert f"branch 0 (searcher) of the fork failed: {session_error}" in error, error
    assert [s.kind for s in forked.steps[3:]] == ["call", "tool_call"]  # the branch's steps are kept


def test_without_an_environment_the_loop_waits_and_a_branch_fails_with_the_same_text() -> None:
    events = list(main_loop(*solo()))
    external = events[-1].external
    assert external is not None and isinstance(external.action, ToolCall)
    assert str(external).startswith("nothing answers the actions (tool_call)")
    assert events[-2].tape is not None and events[-2].tape.metadata.error is None
    forked = main_loop(research.make_lead(latency_s=0), research.start_tape()).get_final_tape()
    assert f"branch 0 (searcher) of the fork failed: ExternalObservationNeeded: {external}" in (
        forked.metadata.error or ""
    )


def test_a_failing_branch_fails_the_fork_and_keeps_the_branches_before_it() -> None:
    fn = Counting(fail_on="leaf saw b")
    tape, _ = asyncio.run(run_agent(flat_team(fn), start()))
    assert tape.metadata.error is not None
    assert "branch 1 (leaf)" in tape.metadata.error and "model down" in tape.metadata.error
    kinds = [s.kind for s in tape.steps]
    assert kinds == ["user", "set_next_node", "fork", "call", "respond", "call"]


def test_fork_must_end_its_node_run() -> None:
    class BadFan(FanNode):
        def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
            yield Fork.of(("leaf", "x"))
            yield AssistantThought(content="more")

    llm = FunctionLLM(fn=brain)
    leaf = Agent.create("leaf", llms=llm, nodes=[LeafNode()])
    team = Agent.create("lead", llms=llm, nodes=[BadFan(target="leaf")], subagents=[leaf])
    tape, _ = asyncio.run(run_agent(team, start()))
    assert "fork that is not the last step" in (tape.metadata.error or "")


def test_fork_needs_at_least_one_branch() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Fork(branches=[])


# ----------------------------------------------------------------------------- tapes as data


@pytest.mark.parametrize("make", [flat_team, nested_team])
def test_training_text_and_reconstruction_use_each_branchs_own_view(make: Any) -> None:
    team = make()
    tape, calls = asyncio.run(run_agent(team, start()))
    texts = team.make_training_text(tape)  # regenerates every run's steps: raises on mismatch
    assert len(texts) == len(calls)
    recorded = {c.prompt.id: c for c in calls}
    for text in texts:
        assert recorded[text.prompt_id].prompt.messages[-1]["content"] in text.text
    rebuilt = sorted(json.dumps(c.prompt.messages) for c in reconstruct_llm_calls(team, tape))
    assert rebuilt == sorted(json.dumps(c.prompt.messages) for c in calls)


def test_replay_of_a_forked_session_with_tools() -> None:
    team = research.make_lead(latency_s=0)
    tape = asyncio.run(research.arun(team, research.start_tape()))
    assert replay_tape(research.make_lead(latency_s=0), tape).ok  # outputs rebuilt from the tape
    recorded = reconstruct_llm_calls(research.make_lead(latency_s=0), tape)
    assert isinstance(tape.steps[10], Respond)  # branch 1's answer: edit it, replay the true calls
    changed = tape.steps[10].model_copy(update={"content": "an edited answer"})
    edited = Tape(steps=[*tape.steps[:10], changed, *tape.steps[11:]])
    result = replay_tape(research.make_lead(latency_s=0), edited, llm_calls=recorded)
    assert not result.ok and result.first_divergence == 10
    assert "an edited answer" in result.diff


# ----------------------------------------------------------------------------- resuming


def _open_runs(tape: Tape[Any, Any], cut: int) -> int:
    """How many node runs of ``tape`` are not complete within its first ``cut`` steps."""
    runs: dict[str, bool] = {}
    for i, step in enumerate(tape.steps):
        pid = step.metadata.prompt_id
        if pid and step.metadata.agent:
            runs[pid] = runs.get(pid, False) or (step.metadata.run_end and i < cut)
    return sum(1 for done in runs.values() if not done)


@pytest.mark.parametrize("make", [flat_team, nested_team])
def test_resuming_a_tape_cut_anywhere_finishes_only_what_is_missing(make: Any) -> None:
    full, _ = asyncio.run(run_agent(make(), start()))
    for cut in range(1, len(full)):
        piece = Tape.model_validate_json(full[:cut].model_dump_json())
        fn = Counting()
        resumed, _ = asyncio.run(run_agent(make(fn), piece))
        assert resumed.metadata.error is None, (cut, resumed.metadata.error)
        assert content(resumed) == content(full), f"cut at {cut}"
        assert [s.metadata.id for s in resumed.steps[:cut]] == [s.metadata.id for s in full.steps[:cut]]
        assert len(fn.prompts) == _open_runs(full, cut), (cut, fn.prompts)


def test_resuming_inside_a_fork_with_tools_under_the_main_loop() -> None:
    full = asyncio.run(research.arun(research.make_lead(latency_s=0), research.start_tape()))
    for cut in range(3, len(full) - 1):
        piece = Tape.model_validate_json(full[:cut].model_dump_json())
        resumed = asyncio.run(
            async_main_loop(research.make_lead(latency_s=0), piece, research.TOOLS).get_final_tape()
        )
        assert content(resumed) == content(full), f"cut at {cut}"


def test_step_events_arrive_in_tape_order_so_a_recorder_always_holds_a_prefix() -> None:
    def search(query: str) -> str:
        """Search, slowly for the first query: later branches finish first.

        Args:
            query: what to look up.
        """
        time.sleep(0.15 if query.endswith("products") else 0.0)
        return research.search(query)

    async def go() -> tuple[list[Step], Tape[Any, Any]]:
        steps: list[Step] = []
        final = research.start_tape()
        async for event in async_main_loop(research.make_lead(latency_s=0), final, ToolEnvironment([search])):
            if event.step is not None:
                steps.append(event.step)
            if event.tape is not None:
                final = event.tape
        return steps, final

    steps, final = asyncio.run(go())
    assert final.metadata.error is None
    assert [s.metadata.id for s in steps] == [s.metadata.id for s in final.steps[1:]]
    assert "crushed stone" in final.steps[-1].content
