"""Agents and nodes: the run loop, node choice, errors, node runs, training text, reuse, clone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from tapekit import (
    Action,
    Agent,
    AgentError,
    Call,
    FunctionLLM,
    LLMOutput,
    LLMStream,
    Node,
    Observation,
    PartialStep,
    Prompt,
    ReconstructionError,
    Respond,
    ScriptedLLM,
    SetNextNode,
    Step,
    StopStep,
    Tape,
    Thought,
)


class Ask(Observation):
    kind: Literal["agenttest_ask"] = "agenttest_ask"
    text: str


class Note(Thought):
    kind: Literal["agenttest_note"] = "agenttest_note"
    text: str


class Do(Action):
    kind: Literal["agenttest_do"] = "agenttest_do"
    what: str


class NoteNode(Node):
    """One LLM call; its text becomes a Note."""

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": f"{self.name} after {len(tape)} steps"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield Note(text=llm_stream.get_text())

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        return LLMOutput(content=tape.steps[index].text)  # type: ignore[attr-defined]


class DoNode(Node):
    """One LLM call; streams a partial step, then loops back to itself with an action."""

    loop_to: str | int = "DoNode"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": f"do after {len(tape)} steps"}])

    def generate_steps(
        self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream
    ) -> Iterator[Step | PartialStep]:
        text = llm_stream.get_text()
        yield PartialStep(step=Do(what=text[:2]))
        yield SetNextNode(next_node=self.loop_to)
        yield Do(what=text)

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        return LLMOutput(content=tape.steps[index + 1].what)  # type: ignore[attr-defined]


class Const(Node):
    """No prompt: yields the given steps (copies)."""

    steps: list[Step] = []

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        assert not llm_stream
        for s in self.steps:
            yield s.model_copy(deep=True)


def echo_llm() -> FunctionLLM:
    return FunctionLLM(fn=lambda p: "answer to " + p.messages[-1]["content"])


def start() -> Tape[Any, Any]:
    return Tape(steps=[Ask(text="go")])


def test_run_streams_chunks_llm_calls_partial_steps_steps_and_the_final_tape() -> None:
    agent = Agent.create(name="a", llms=echo_llm(), nodes=[NoteNode(), DoNode()])
    events = list(agent.run(start()))
    kinds = [
        next(
            k
            for k in ("chunk", "llm_call", "partial_step", "step", "final_tape")
            if getattr(e, k) is not None
        )
        for e in events
    ]
    assert kinds[0] == "chunk" and kinds[-1] == "final_tape"
    assert kinds.count("llm_call") == 2 and kinds.count("partial_step") == 1 and kinds.count("step") == 3
    assert "".join(e.chunk for e in events[: kinds.index("llm_call")]) == "answer to NoteNode after 1 steps"  # type: ignore[misc]
    final = events[-1].final_tape
    assert final is not None
    assert [s.kind for s in final.steps] == [
        "agenttest_ask",
        "agenttest_note",
        "set_next_node",
        "agenttest_do",
    ]
    assert final.metadata.author == "a" and final.metadata.n_added_steps == 3
    assert final.metadata.parent_id is not None and final.metadata.error is None


def test_run_stops_after_the_node_run_with_the_first_action() -> None:
    agent = Agent.create(name="a", llms=echo_llm(), nodes=[NoteNode(), DoNode()])
    tape = agent.run(start()).get_final_tape()
    assert isinstance(tape.steps[-1], Do)
    again = agent.run(tape.append(Ask(text="next"))).get_final_tape()  # SetNextNode loops to DoNode
    assert [s.metadata.node for s in again.steps[5:]] == ["DoNode", "DoNode"]


def test_set_next_node_by_index() -> None:
    agent = Agent.create(name="a", llms=echo_llm(), nodes=[NoteNode(), DoNode(loop_to=0)])
    tape = agent.run(start()).get_final_tape()
    tape = agent.run(tape.append(Ask(text="next"))).get_final_tape()
    assert [s.metadata.node for s in tape.steps[5:]] == ["NoteNode", "DoNode", "DoNode"]


def test_a_node_without_prompt_calls_no_llm() -> None:
    llm = ScriptedLLM(outputs=[])
    agent = Agent.create(
        name="a", llms=llm, nodes=[Const(steps=[Note(text="x")]), Const(name="c2", steps=[StopStep()])]
    )
    tape = agent.run(start()).get_final_tape()
    assert tape.metadata.error is None and llm.n_calls == 0
    assert [s.kind for s in tape.steps[1:]] == ["agenttest_note", "stop"]
    assert (
        tape.steps[1].metadata.prompt_id
        and tape.steps[1].metadata.prompt_id != tape.steps[2].metadata.prompt_id
    )


def test_step_metadata_is_set_on_copies_not_on_the_nodes_objects() -> None:
    shared = Note(text="same object")

    class Same(Node):
        def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
            yield shared
            yield StopStep()

    tape = Agent.create(name="a", nodes=[Same()]).run(start()).get_final_tape()
    assert tape.steps[1].metadata.agent == "a" and shared.metadata.agent == ""


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([Const(steps=[])], "produced no steps"),
        ([Const(steps=[Note(text="x")])], "ran its last node"),
        ([Const(steps=[SetNextNode(next_node="nope")])], "has no node 'nope'"),
        ([Const(steps=[SetNextNode(next_node=7)])], "has no node #7"),
        ([Const(steps=[Call(agent_name="ghost")])], "has no subagent 'ghost'"),
        ([Const(steps=[SetNextNode(next_node=0)])], "max_iterations"),
        ([], "has no nodes"),
    ],
)
def test_errors_end_up_on_the_tape_with_a_clear_message(nodes: list[Node], message: str) -> None:
    agent = Agent.create(name="a", nodes=nodes, max_iterations=5)
    tape = agent.run(start()).get_final_tape()
    assert tape.metadata.error is not None and message in tape.metadata.error


def test_llm_failure_keeps_the_steps_made_before_it() -> None:
    llm = ScriptedLLM(outputs=["first"])
    agent = Agent.create(name="a", llms=llm, nodes=[NoteNode(), DoNode()])
    tape = agent.run(start()).get_final_tape()
    assert [s.kind for s in tape.steps] == ["agenttest_ask", "agenttest_note"]
    assert "ran out of outputs" in (tape.metadata.error or "") and "a.DoNode" in (tape.metadata.error or "")


def test_node_llm_selection() -> None:
    agent = Agent.create(
        name="a", llms={"big": echo_llm(), "small": echo_llm()}, nodes=[NoteNode(llm="small")]
    )
    assert agent.llm_for(agent.nodes[0]) is agent.llms["small"]
    agent = Agent.create(name="a", llms={"big": echo_llm(), "small": echo_llm()}, nodes=[NoteNode()])
    with pytest.raises(AgentError, match="names no LLM"):
        agent.llm_for(agent.nodes[0])
    with pytest.raises(AgentError, match="wants LLM 'huge'"):
        agent.llm_for(NoteNode(llm="huge"))


def test_configuration_errors() -> None:
    with pytest.raises(ValueError, match="two nodes named"):
        Agent.create(name="a", nodes=[NoteNode(), NoteNode()])
    with pytest.raises(ValueError, match="contain no '/'"):
        Agent.create(name="a/b")
    sub = Agent.create(name="sub", nodes=[NoteNode()])
    Agent.create(name="m1", subagents=[sub])
    with pytest.raises(ValueError, match="clone"):
        Agent.create(name="m2", subagents=[sub])
    with pytest.raises(AgentError, match="run the root agent 'm1'"):
        sub.run(start())


def team() -> Agent:
    helper = Agent.create(
        name="helper",
        nodes=[
            Const(name="work", steps=[Note(text="working")]),
            Const(name="answer", steps=[Respond(content="42")]),
        ],
    )
    boss = Agent.create(
        name="boss",
        nodes=[
            Const(name="delegate", steps=[Call(agent_name="helper", content="find 42")]),
            Const(name="finish", steps=[Do(what="report")]),
        ],
        subagents=[helper],
    )
    return boss


def test_call_and_respond_delegate_through_the_view_stack() -> None:
    boss = team()
    tape = boss.run(start()).get_final_tape()
    assert [(s.metadata.agent, s.metadata.node, s.kind) for s in tape.steps[1:]] == [
        ("boss", "delegate", "call"),
        ("boss/helper", "work", "agenttest_note"),
        ("boss/helper", "answer", "respond"),
        ("boss", "finish", "agenttest_do"),
    ]
    assert boss.find_agent("boss/helper").full_name == "boss/helper"
    assert boss.subagents[0].root is boss and boss.subagents[0].manager is boss


def test_get_node_runs_and_make_training_text() -> None:
    agent = Agent.create(name="a", llms=echo_llm(), nodes=[NoteNode(), DoNode()])
    tape = agent.run(start()).get_final_tape()
    runs = agent.get_node_runs(tape)
    assert [(n.name, i) for n, i in runs] == [("NoteNode", 1), ("DoNode", 2)]
    texts = agent.make_training_text(tape)
    assert len(texts) == 2
    assert texts[0].output_text.startswith("answer to NoteNode after 1 steps")
    assert "NoteNode after 1 steps" in texts[0].prompt_text
    assert texts[1].prompt_id == tape.steps[2].metadata.prompt_id and texts[1].node == "DoNode"
    assert texts[0].text == texts[0].prompt_text + texts[0].output_text


def test_make_training_text_refuses_a_wrong_make_llm_output() -> None:
    class Liar(NoteNode):
        def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
            return LLMOutput(content="something else")

    agent = Agent.create(name="a", llms=echo_llm(), nodes=[Liar(), DoNode()])
    tape = agent.run(start()).get_final_tape()
    with pytest.raises(ReconstructionError, match=r"a\.Liar at step 1") as info:
        agent.make_training_text(tape)
    assert "something else" in str(info.value)


def test_make_llm_output_missing_is_explained() -> None:
    class Plain(Node):
        def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
            return Prompt(messages=[{"role": "user", "content": "x"}])

        def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
            yield Do(what=llm_stream.get_text())

    agent = Agent.create(name="a", llms=echo_llm(), nodes=[Plain()])
    tape = agent.run(start()).get_final_tape()
    with pytest.raises(NotImplementedError, match="does not implement make_llm_output"):
        agent.make_training_text(tape)


class Combined(Node):
    """A single node that writes the note and the action from one LLM output (a 'student')."""

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[{"role": "user", "content": "note and do"}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        note, what = llm_stream.get_text().split("|")
        yield Note(text=note)
        yield SetNextNode(next_node=0)
        yield Do(what=what)

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        return LLMOutput(content=f"{tape.steps[index].text}|{tape.steps[index + 2].what}")  # type: ignore[attr-defined]


def test_reuse_reattributes_another_agents_tape_with_its_llm_calls() -> None:
    teacher = Agent.create(name="teacher", llms=echo_llm(), nodes=[NoteNode(), DoNode()])
    tape = teacher.run(start()).get_final_tape()
    student = Agent.create(name="student", llms=echo_llm(), nodes=[Combined()])
    reused, calls = student.reuse(tape)

    def content(t: Tape[Any, Any]) -> list[dict[str, Any]]:
        return [s.llm_dict() for s in t.steps if not isinstance(s, SetNextNode)]

    assert content(reused) == content(tape)
    assert reused.steps[2] == SetNextNode(next_node=0, metadata=reused.steps[2].metadata)  # its own routing
    assert {s.metadata.agent for s in reused.steps[1:]} == {"student"}
    assert {s.metadata.node for s in reused.steps[1:]} == {"Combined"}
    assert len({s.metadata.prompt_id for s in reused.steps[1:]}) == 1 and reused.steps[-1].metadata.run_end
    assert len(calls) == 1 and calls[0].output.content == f"{tape.steps[1].text}|{tape.steps[3].what}"  # type: ignore[attr-defined]
    assert reused.metadata.author == "student" and reused.metadata.author_tape_id == tape.metadata.id
    assert student.make_training_text(reused)[0].output_text.startswith(calls[0].output.content or "")


def test_reuse_explains_steps_it_cannot_reproduce() -> None:
    teacher = Agent.create(name="teacher", llms=echo_llm(), nodes=[NoteNode(), DoNode()])
    tape = teacher.run(start()).get_final_tape()
    other = Agent.create(name="other", llms=echo_llm(), nodes=[DoNode()])
    with pytest.raises(ReconstructionError, match=r"other\.DoNode at step 1: make_llm_output failed"):
        other.reuse(tape)


def test_reuse_of_its_own_tape_is_an_identity_up_to_ids() -> None:
    agent = team()
    tape = agent.run(start()).get_final_tape()
    reused, calls = agent.reuse(tape)
    assert calls == []  # no node of this team makes a prompt
    assert [(s.metadata.agent, s.metadata.node, s.llm_dict()) for s in reused.steps] == [
        (s.metadata.agent, s.metadata.node, s.llm_dict()) for s in tape.steps
    ]


def test_clone_is_independent_but_shares_llm_clients() -> None:
    boss = team()
    copy = boss.clone()
    assert copy.subagents[0].manager is copy and copy.manager is None
    copy.nodes[0].name = "renamed"
    assert boss.nodes[0].name == "delegate"
    llm_agent = Agent.create(name="a", llms=echo_llm(), nodes=[NoteNode()], templates={"t": {"x": [1]}})
    twin = llm_agent.clone()
    assert twin.llms["default"] is llm_agent.llms["default"]
    twin.templates["t"]["x"].append(2)
    assert llm_agent.templates["t"]["x"] == [1]
    Agent.create(name="m2", subagents=[boss.subagents[0].clone()])  # a clone may join another team


def test_sync_run_works_inside_a_running_event_loop() -> None:
    agent = Agent.create(name="a", llms=echo_llm(), nodes=[NoteNode(), DoNode()])

    async def inside() -> Tape[Any, Any]:
        return agent.run(start()).get_final_tape()

    tape = asyncio.run(inside())
    assert isinstance(tape.steps[-1], Do)
    steps = asyncio.run(_steps_inside(agent))
    assert [s.kind for s in steps] == ["agenttest_note", "set_next_node", "agenttest_do"]


async def _steps_inside(agent: Agent) -> list[Step]:
    return agent.run(start()).get_steps()


def test_arun_matches_run() -> None:
    agent = Agent.create(name="a", llms=echo_llm(), nodes=[NoteNode(), DoNode()])
    a = asyncio.run(agent.arun(start()).get_final_tape())
    b = agent.run(start()).get_final_tape()
    assert [s.llm_dict() for s in a.steps] == [s.llm_dict() for s in b.steps]


def test_breaking_out_of_a_sync_run_closes_it() -> None:
    agent = Agent.create(name="a", llms=echo_llm(), nodes=[NoteNode(), DoNode()])
    for event in agent.run(start()):
        if event.step is not None:
            break
    assert event.step is not None and event.step.kind == "agenttest_note"


@pytest.mark.parametrize("control", [Call(agent_name="helper"), Respond(content="x")])
def test_call_and_respond_must_end_their_node_run(control: Step) -> None:
    helper = Agent.create(name="helper", nodes=[Const(steps=[Respond(content="ok")])])
    agent = Agent.create(
        name="a", nodes=[Const(steps=[control, SetNextNode(next_node=0)])], subagents=[helper]
    )
    tape = agent.run(start()).get_final_tape()
    assert f"made a {control.kind} that is not the last step" in (tape.metadata.error or "")
    assert len(tape) == 1  # nothing half-routed was added


def test_an_empty_tape_is_still_a_tape_value() -> None:
    empty: Tape[Any, Any] = Tape()
    assert bool(empty) and len(empty) == 0
    agent = Agent.create(name="a", nodes=[])
    from tapekit import Environment, main_loop

    final = main_loop(agent, empty, Environment()).get_final_tape()
    assert "has no nodes" in (final.metadata.error or "")
