"""TeamAgent: an AutoGen-style team (initiator, manager, workers) on one tape, resumable anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tapekit import (
    Agent,
    AgentError,
    Call,
    FunctionLLM,
    LLMStream,
    Node,
    Prompt,
    Respond,
    Step,
    Tape,
    UserStep,
)
from tapekit._diff import signatures
from tapekit.frameworks import (
    AnyOf,
    FunctionTermination,
    ManagerNode,
    MaxTurns,
    TeamAgent,
    TeamMessage,
    TeamTerminated,
    TextMention,
    conversation,
)


class Brain:
    """A deterministic team LLM that records every prompt it answers.

    The manager's question gets a speaker chosen from the number of messages so far; a worker
    answers with its role and how many messages it saw, and the critic approves on its 2nd turn.
    """

    def __init__(self) -> None:
        self.prompts: list[Prompt] = []

    def __call__(self, prompt: Prompt) -> str:
        self.prompts.append(prompt)
        last = prompt.messages[-1]["content"]
        if "Who speaks next" in last:
            return ["critic", "coder"][len(prompt.messages) % 2]
        role = prompt.messages[0]["content"].split()[1]
        seen = len(prompt.messages)
        return f"{role} answer after {seen} messages" + (
            " APPROVED" if role == "review" and seen >= 5 else ""
        )


def make_team(brain: Brain | None = None, turns: int = 8) -> TeamAgent:
    llm = FunctionLLM(fn=brain or Brain())
    coder = TeamAgent.create_worker("coder", llm, system="You code.", description="writes Python")
    critic = TeamAgent.create_worker("critic", llm, system="You review code.")
    manager = TeamAgent.create_manager(
        "manager",
        [coder, critic],
        selection="llm",
        llm=llm,
        termination=MaxTurns(turns=turns) | TextMention(text="APPROVED"),
    )
    return TeamAgent.create_initiator("requestor", manager, message="Plot the prices")


@pytest.fixture(scope="module")
def full() -> Tape[Any, Any]:
    tape = make_team().run(Tape(steps=[])).get_final_tape()
    assert tape.metadata.error is None
    return tape


def test_the_team_talks_on_one_tape_until_a_condition_holds(full: Tape[Any, Any]) -> None:
    rows = [(s.metadata.agent, s.kind) for s in full.steps]
    talk = [("requestor/manager", "set_next_node"), ("requestor/manager", "call")]
    assert rows[:2] == [("requestor", "set_next_node"), ("requestor", "call")]
    assert rows[2:4] == talk and rows[4] == ("requestor/manager/coder", "respond")
    speakers = [s.metadata.agent.rsplit("/", 1)[-1] for s in full.steps if isinstance(s, Respond)]
    assert speakers == ["coder", "critic", "coder", "critic", "manager"]
    stop = next(s for s in full.steps if isinstance(s, TeamTerminated))
    assert stop.reason == "critic said 'APPROVED'"
    assert full.steps[-1].kind == "assistant" and full.steps[-1].content.endswith("APPROVED")  # type: ignore[attr-defined]
    assert full.steps[-1].metadata.agent == "requestor"


def test_each_member_sees_its_own_view(full: Tape[Any, Any]) -> None:
    team = make_team()
    cut = full[:7]  # the manager has just called the critic
    stack = team.compute_view(cut)
    assert [v.agent_name for v in stack.views] == [
        "requestor",
        "requestor/manager",
        "requestor/manager/critic",
    ]
    requestor, manager, critic = stack.views
    assert [s.kind for s in requestor.steps] == ["set_next_node", "call"]  # the team's talk is hidden
    assert [s.kind for s in manager.steps] == [
        "call",
        "set_next_node",
        "call",
        "respond",
        "set_next_node",
        "call",
    ]
    assert list(critic.steps) == [cut.steps[6]]
    # the critic's prompt: its system prompt, then the conversation read from the manager's view
    prompt = (
        team.find_agent("requestor/manager/critic")
        .nodes[0]
        .make_prompt(team.find_agent("requestor/manager/critic"), cut)
    )
    assert prompt is not None
    assert [m["content"] for m in prompt.messages] == [
        "You review code.",
        "requestor: Plot the prices",
        "coder: code. answer after 2 messages",
    ]


def test_the_llm_manager_sees_the_roster_and_the_conversation() -> None:
    brain = Brain()
    make_team(brain).run(Tape(steps=[])).get_final_tape()
    first = brain.prompts[0]
    assert "- coder: writes Python" in first.messages[0]["content"]
    assert "- critic: You review code." in first.messages[0]["content"]
    assert first.messages[1:] == [
        {"role": "user", "content": "requestor: Plot the prices"},
        {"role": "user", "content": "Who speaks next? Answer with one name only: coder, critic."},
    ]


def _llm_runs_missing(full: Tape[Any, Any], llm_pids: set[str], cut: int) -> int:
    done = {s.metadata.prompt_id for s in full.steps[:cut] if s.metadata.run_end}
    return len(llm_pids - done)


def test_cut_after_every_step_resumes_to_the_identical_tape() -> None:
    brain = Brain()
    events = list(make_team(brain).run(Tape(steps=[])))
    full = events[-1].final_tape
    assert full is not None and full.metadata.error is None
    llm_pids = {e.llm_call.prompt.id for e in events if e.llm_call is not None}
    assert len(llm_pids) == len(brain.prompts) == 8  # 4 speaker choices, 4 worker answers
    want = signatures(full.steps)
    for k in range(0, len(full)):
        piece = Tape.model_validate_json(full[:k].model_dump_json())  # only the tape survives
        fresh = Brain()
        resumed = make_team(fresh).run(piece).get_final_tape()
        assert resumed.metadata.error is None, (k, resumed.metadata.error)
        assert signatures(resumed.steps) == want, f"resuming after {k} steps diverged"
        assert [s.metadata.id for s in resumed.steps[:k]] == [s.metadata.id for s in full.steps[:k]]
        assert len(fresh.prompts) == _llm_runs_missing(full, llm_pids, k), k


def test_training_text_rebuilds_every_llm_call(full: Tape[Any, Any]) -> None:
    texts = make_team().make_training_text(full)
    assert len(texts) == 8
    choices = [t.output_text for t in texts if t.node == "manage"]
    assert choices == ["coder<|end|>\n", "critic<|end|>\n", "coder<|end|>\n", "critic<|end|>\n"]


def test_round_robin_and_max_turns_with_the_manager_as_root() -> None:
    llm = FunctionLLM(fn=lambda p: f"turn {len(p.messages)}")
    workers = [TeamAgent.create_worker(n, llm, system=f"You are {n}.") for n in ("a", "b", "c")]
    manager = TeamAgent.create_manager("lead", workers, termination=MaxTurns(turns=4))
    tape = manager.run(Tape(steps=[UserStep(content="go")])).get_final_tape()
    assert tape.metadata.error is None
    called = [s.agent_name for s in tape.steps if isinstance(s, Call)]
    assert called == ["a", "b", "c", "a"]
    assert tape.steps[-1].kind == "assistant" and tape.steps[-1].metadata.agent == "lead"
    # the user answers: a new exchange, turns counted afresh, round robin goes on after 'a'
    more = tape.model_copy(update={"steps": tape.steps.appended([UserStep(content="again")])})
    tape2 = manager.run(more).get_final_tape()
    assert [s.agent_name for s in tape2.steps[len(more) :] if isinstance(s, Call)] == ["b", "c", "a", "b"]


def test_a_function_picks_the_speaker_and_another_ends_the_talk() -> None:
    llm = FunctionLLM(fn=lambda p: "ok")
    seen: list[list[str]] = []

    def pick(messages: list[TeamMessage], names: list[str]) -> str:
        seen.append([m.speaker for m in messages])
        return "b" if len(messages) % 2 else "a"

    stop = FunctionTermination(fn=lambda ms: len(ms) >= 4, name="enough")
    manager = TeamAgent.create_manager(
        "lead", [TeamAgent.create_worker(n, llm) for n in "ab"], selection=pick, termination=stop
    )
    tape = manager.run(Tape(steps=[UserStep(content="go")])).get_final_tape()
    assert [s.agent_name for s in tape.steps if isinstance(s, Call)] == ["b", "a", "b"]
    assert seen == [["user"], ["user", "b"], ["user", "b", "a"]]
    assert next(s for s in tape.steps if isinstance(s, TeamTerminated)).reason == "enough returned true"


def test_termination_conditions_compose() -> None:
    def talk(*texts: str) -> list[TeamMessage]:
        return [TeamMessage(speaker="user", content="go", from_member=False)] + [
            TeamMessage(speaker="w", content=t) for t in texts
        ]

    both = MaxTurns(turns=2) & TextMention(text="DONE")
    assert both.check(talk("DONE")) is None
    assert both.check(talk("x", "y")) is None
    assert both.check(talk("x", "DONE")) == "2 turns (max 2) and w said 'DONE'"
    either = MaxTurns(turns=3) | TextMention(text="DONE")
    assert either.check(talk("DONE")) == "w said 'DONE'"
    assert either.check(talk("a", "b", "c")) == "3 turns (max 3)"
    assert either.check(talk("a")) is None
    with pytest.raises(ValueError):
        MaxTurns(turns=0)


def test_a_manager_whose_llm_names_nobody_fails_with_a_clear_error() -> None:
    llm = FunctionLLM(fn=lambda p: "the intern" if "Who speaks" in p.messages[-1]["content"] else "hi")
    manager = TeamAgent.create_manager("lead", [TeamAgent.create_worker("a", llm)], selection="llm", llm=llm)
    tape = manager.run(Tape(steps=[UserStep(content="go")])).get_final_tape()
    assert tape.metadata.error is not None
    assert "'the intern', which names none of its members ['a']" in tape.metadata.error
    with pytest.raises(ValueError, match="pass llm="):
        TeamAgent.create_manager("lead", [], selection="llm")
    with pytest.raises(ValueError, match="needs an llm"):
        TeamAgent.create_worker("a")


def test_the_manager_config_round_trips_through_json() -> None:
    manager = make_team().find_agent("requestor/manager")
    node = manager.nodes[0]
    assert isinstance(node, ManagerNode)
    data = node.model_dump(mode="json")
    assert data["selection"] == "llm"
    assert data["termination"] == {
        "type": "AnyOf",
        "conditions": [{"type": "MaxTurns", "turns": 8}, {"type": "TextMention", "text": "APPROVED"}],
    }
    again = ManagerNode.model_validate_json(node.model_dump_json())
    assert again == node and isinstance(again.termination, AnyOf)
    # a function is not saved: the loaded condition says so when used
    func = ManagerNode(termination=FunctionTermination(fn=lambda ms: True, name="mine") & MaxTurns(turns=1))
    loaded = ManagerNode.model_validate_json(func.model_dump_json())
    assert loaded.termination is not None
    with pytest.raises(AgentError, match="termination 'mine' has no function"):
        loaded.termination.check([])
    with pytest.raises(ValueError, match="unknown termination type 'Nope'"):
        ManagerNode.model_validate({"termination": {"type": "Nope"}})


class CountWords(Node):
    """An executor-style worker without an LLM: it answers with the word count of the
    conversation's last message (the way a code executor runs the engineer's code)."""

    name: str = "count"

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        last = conversation(agent, tape)[-1]
        yield Respond(content=f"{last.speaker} wrote {len(last.content.split())} words")


def test_a_worker_with_its_own_nodes_reads_the_conversation() -> None:
    llm = FunctionLLM(fn=lambda p: "one two three")
    writer = TeamAgent.create_worker("writer", llm, system="You write.")
    counter = TeamAgent.create_worker("counter", nodes=[CountWords()], description="counts words")
    manager = TeamAgent.create_manager("lead", [writer, counter], termination=MaxTurns(turns=2))
    tape = (
        TeamAgent.create_initiator("user", manager)
        .run(Tape(steps=[UserStep(content="write")]))
        .get_final_tape()
    )
    assert tape.metadata.error is None
    assert [s.content for s in tape.steps if isinstance(s, Respond)] == [
        "one two three",
        "writer wrote 3 words",
        "writer wrote 3 words",
    ]
    assert tape.steps[-1].kind == "assistant"
    assert tape.steps[2].content == "write"  # type: ignore[attr-defined]  # the user's message is the request
