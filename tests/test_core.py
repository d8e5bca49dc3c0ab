"""Steps, metadata, tapes: JSON round trips, kind dispatch, O(1) structural sharing."""

from __future__ import annotations

import threading
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

from tapekit import (
    Action,
    Call,
    Observation,
    Respond,
    SetNextNode,
    Step,
    StepSequence,
    StopStep,
    Tape,
    TapeMetadata,
    Thought,
)
from tapekit.core import Prompt, step_kinds


class Question(Observation):
    kind: Literal["coretest_question"] = "coretest_question"
    text: str


class Idea(Thought):
    kind: Literal["coretest_idea"] = "coretest_idea"
    text: str
    score: float = 0.0


class Lookup(Action):
    kind: Literal["coretest_lookup"] = "coretest_lookup"
    key: str
    options: list[int] = []


class Ctx(BaseModel):
    user: str


CoreStep = Annotated[Question | Idea | Lookup | SetNextNode | Call | Respond, Field(discriminator="kind")]


class CoreTape(Tape[Ctx, CoreStep]):
    pass


def sample_steps() -> list[Step]:
    steps: list[Step] = [
        Question(text="what is 2+2?"),
        Idea(text="add", score=0.5),
        SetNextNode(next_node="act"),
        Call(agent_name="helper", content="compute"),
        Respond(content="4"),
        Lookup(key="sum", options=[2, 2]),
    ]
    steps[1].metadata.agent = "root"
    steps[1].metadata.node = "think"
    steps[1].metadata.prompt_id = "p1"
    steps[1].metadata.other["note"] = {"nested": [1, 2]}
    return steps


def test_step_categories_and_control_steps() -> None:
    assert isinstance(SetNextNode(next_node=1), Thought)
    assert isinstance(StopStep(), Thought)
    assert SetNextNode(next_node="x").kind == "set_next_node"
    assert Call(agent_name="a").kind == "call" and Respond().kind == "respond"
    assert step_kinds()["coretest_lookup"] is Lookup


def test_step_metadata_defaults_are_fresh() -> None:
    a, b = Idea(text="x"), Idea(text="x")
    assert a.metadata.id != b.metadata.id and len(a.metadata.id) == 32
    assert a.metadata.prompt_id == "" and a.metadata.agent == "" and a.metadata.other == {}
    a.metadata.other["k"] = 1
    assert b.metadata.other == {}


def test_step_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        Idea(text="x", colour="red")  # type: ignore[call-arg]


def test_typed_tape_json_round_trip_is_exact() -> None:
    tape = CoreTape(context=Ctx(user="ann"), steps=sample_steps())
    tape = tape.with_metadata(author="me", result={"answer": 4}, error=None)
    text = tape.model_dump_json()
    back = CoreTape.model_validate_json(text)
    assert back == tape
    assert back.model_dump_json() == text
    assert [type(s) for s in back.steps] == [type(s) for s in tape.steps]
    assert back.steps[1].metadata.other == {"note": {"nested": [1, 2]}}
    assert isinstance(back.context, Ctx)


def test_bare_tape_round_trips_through_the_kind_registry() -> None:
    tape = Tape(steps=sample_steps())
    back = Tape.model_validate_json(tape.model_dump_json())
    assert back == tape
    assert isinstance(back.steps[5], Lookup) and back.steps[5].options == [2, 2]
    assert Tape.model_validate(tape.model_dump()) == tape


def test_unknown_kind_is_a_clear_error_naming_it() -> None:
    data = Tape(steps=[Question(text="q")]).model_dump()
    data["steps"][0]["kind"] = "no_such_kind"
    with pytest.raises(ValidationError, match="unknown step kind 'no_such_kind'"):
        Tape.model_validate(data)
    with pytest.raises(ValidationError, match="no_such_kind"):
        CoreTape.model_validate(data)


def test_typed_tape_rejects_steps_outside_its_union() -> None:
    data = Tape(steps=[StopStep()]).model_dump()
    with pytest.raises(ValidationError):
        CoreTape.model_validate(data)


def test_duplicate_kind_in_another_class_is_refused() -> None:
    with pytest.raises(TypeError, match="already used"):

        class Other(Thought):
            kind: Literal["coretest_idea"] = "coretest_idea"


def test_kind_default_must_match_literal() -> None:
    with pytest.raises(TypeError, match="declare"):

        class Bad(Thought):
            kind: Literal["coretest_bad"] = "oops"  # type: ignore[assignment]


def test_append_never_changes_the_original_and_shares_the_buffer() -> None:
    t0 = Tape(steps=[Question(text="q")])
    t1 = t0.append(Idea(text="a"))
    t2 = t1.append(Idea(text="b"))
    assert (len(t0), len(t1), len(t2)) == (1, 2, 3)
    assert t1.steps._buf is t0.steps._buf is t2.steps._buf  # no copy on the hot path
    assert t1.metadata.id != t0.metadata.id


def test_appending_to_an_older_tape_forks_without_touching_the_newer_one() -> None:
    t0 = Tape(steps=[Question(text="q")])
    t1 = t0.append(Idea(text="a"))
    fork = t0.append(Idea(text="b"))
    assert [s.text for s in t1.steps[1:]] == ["a"]  # type: ignore[attr-defined]
    assert [s.text for s in fork.steps[1:]] == ["b"]  # type: ignore[attr-defined]
    assert fork.steps._buf is not t0.steps._buf
    assert t1.append(Idea(text="c")).steps._buf is t0.steps._buf


def test_appends_are_linear_not_quadratic() -> None:
    tape: Tape[Any, Any] = Tape()
    for i in range(20_000):
        tape = tape.append(Idea(text=str(i)))
    # a copying append would have made 20_000 lists; here all tapes share one buffer
    assert len(tape.steps._buf.items) == 20_000
    assert tape.steps[-1].text == "19999"  # type: ignore[attr-defined]


def test_concurrent_appends_to_the_same_tape_do_not_mix() -> None:
    base = Tape(steps=[Question(text="q")])
    results: list[Tape[Any, Any]] = []

    def worker(i: int) -> None:
        tape = base
        for j in range(200):
            tape = tape.append(Idea(text=f"{i}-{j}"))
        results.append(tape)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for tape in results:
        owner = tape.steps[1].text.split("-")[0]  # type: ignore[attr-defined]
        assert [s.text for s in tape.steps[1:]] == [f"{owner}-{j}" for j in range(200)]  # type: ignore[attr-defined]


def test_slicing_and_indexing() -> None:
    tape = Tape(steps=sample_steps())
    head = tape[:2]
    assert isinstance(head, Tape) and len(head) == 2 and head.steps[1] is tape.steps[1]
    assert tape[-1] is tape.steps[5]
    assert list(tape.steps[1:3]) == list(tape.steps)[1:3]
    assert list(reversed(tape.steps)) == list(tape.steps)[::-1]
    with pytest.raises(IndexError):
        tape.steps[6]
    assert tape.steps == list(tape.steps) and tape.steps != list(tape.steps)[:-1]


def test_with_new_steps_records_provenance() -> None:
    t0 = Tape(steps=[Question(text="q")])
    t1 = t0.with_new_steps([Idea(text="a"), Idea(text="b")], author="env")
    assert t1.metadata.parent_id == t0.metadata.id
    assert t1.metadata.author == "env" and t1.metadata.n_added_steps == 2
    assert isinstance(t1.metadata, TapeMetadata)


def test_step_sequence_fold_is_memoised_per_prefix() -> None:
    seq: StepSequence[int] = StepSequence(range(10))
    calls: list[int] = []

    def add(state: int, item: int, index: int) -> int:
        calls.append(index)
        return state + item

    assert seq[:5].fold("sum", lambda: 0, add) == 10
    assert seq.fold("sum", lambda: 0, add) == 45
    assert calls == list(range(10))  # the second fold resumed at 5
    longer = seq.appended([100])
    assert longer.fold("sum", lambda: 0, add) == 145 and calls[-1] == 10
    fork = seq[:5].appended([1000])  # the fork keeps the memo for its shared prefix
    calls.clear()
    assert fork.fold("sum", lambda: 0, add) == 1010 and calls == [5]


def test_prompt_content_key_ignores_id() -> None:
    a = Prompt(messages=[{"role": "user", "content": "x"}])
    b = Prompt(messages=[{"role": "user", "content": "x"}])
    assert a.id != b.id and a.content_key() == b.content_key()
    assert Prompt(messages=[{"role": "user", "content": "y"}]).content_key() != a.content_key()


def test_tapes_pickle_with_their_typed_steps() -> None:
    import pickle

    from tapekit import Call, SetNextNode, Tape, TapeMetadata
    from tapekit.dialog import UserStep

    tape = Tape(steps=[UserStep(content="hi")], metadata=TapeMetadata(author="me"))
    tape = tape.append(SetNextNode(next_node=2)).append(Call(agent_name="helper", content="go"))
    back = pickle.loads(pickle.dumps(tape))
    assert back == tape and [type(s) for s in back.steps] == [UserStep, SetNextNode, Call]
    assert back.metadata == tape.metadata
    assert len(back.append(SetNextNode(next_node=0))) == 4  # a working sequence, not a frozen copy
