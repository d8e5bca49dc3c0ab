"""Structured steps from LLM output: schema, parsing, failures as steps, the embedded model."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from tapekit import Action, Agent, FunctionLLM, Tape, Thought, UserStep
from tapekit.llm.llamacpp import LlamaCppLLM
from tapekit.structured import (
    LLMOutputParsingFailure,
    StepParsingError,
    StructuredNode,
    parse_steps,
    steps_or_failure,
    steps_schema,
)
from tests.conftest import needs_local_model


class Reasoning(Thought):
    kind: Literal["structtest_reasoning"] = "structtest_reasoning"
    text: str


class Search(Action):
    kind: Literal["structtest_search"] = "structtest_search"
    query: str
    max_results: int = 3


class Reply(Action):
    kind: Literal["structtest_reply"] = "structtest_reply"
    message: str
    tone: Literal["formal", "casual"] = "casual"


CLASSES = [Reasoning, Search, Reply]


def test_schema_lists_the_step_fields_without_metadata() -> None:
    schema = steps_schema(CLASSES, max_steps=4)
    variants = schema["properties"]["steps"]["items"]["anyOf"]
    assert [v["properties"]["kind"] for v in variants] == [
        {"const": "structtest_reasoning"},
        {"const": "structtest_search"},
        {"const": "structtest_reply"},
    ]
    assert all("metadata" not in v["properties"] for v in variants)
    assert variants[1]["required"] == ["kind", "query"] and schema["properties"]["steps"]["maxItems"] == 4
    assert variants[2]["properties"]["tone"]["enum"] == ["formal", "casual"]
    assert "StepMetadata" not in json.dumps(schema)
    with pytest.raises(ValueError):
        steps_schema([])


def test_parse_valid_output() -> None:
    text = json.dumps(
        {
            "steps": [
                {"kind": "structtest_reasoning", "text": "look it up"},
                {"kind": "structtest_search", "query": "tapes"},
            ]
        }
    )
    steps = parse_steps(text, CLASSES)
    assert isinstance(steps[0], Reasoning) and isinstance(steps[1], Search) and steps[1].max_results == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json at all", "not JSON"),
        ('{"steps": []}', "at least one step"),
        ('[{"kind": "structtest_reply"}]', "at least one step"),
        ('{"steps": [{"kind": "structtest_fly"}]}', "allowed kinds"),
        ('{"steps": [{"kind": "structtest_search"}]}', "query"),
        ('{"steps": [{"kind": "structtest_reply", "message": "hi", "tone": "angry"}]}', "tone"),
    ],
)
def test_bad_output_is_explained_and_becomes_a_failure_step(text: str, message: str) -> None:
    with pytest.raises(StepParsingError, match=message):
        parse_steps(text, CLASSES)
    (failure,) = steps_or_failure(text, CLASSES)
    assert isinstance(failure, LLMOutputParsingFailure) and failure.raw == text and message in failure.error


def answers(*outputs: str) -> FunctionLLM:
    queue = list(outputs)
    return FunctionLLM(fn=lambda prompt: queue.pop(0))


def test_structured_node_retries_once_then_keeps_the_failure_on_the_tape() -> None:
    node = StructuredNode(name="think", step_classes=CLASSES, max_retries=1)
    agent = Agent.create(name="a", llms=answers("oops", "still oops"), nodes=[node])
    tape = agent.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
    kinds = [s.kind for s in tape.steps]
    assert kinds[:4] == ["user", "set_next_node", "llm_output_parsing_failure", "llm_output_parsing_failure"]
    assert tape.steps[2].raw == "oops"  # type: ignore[attr-defined]
    assert "ran its last node" in (tape.metadata.error or "")  # no retries left, nothing routes onwards


def test_structured_node_round_trips_into_training_text() -> None:
    good = json.dumps(
        {
            "steps": [
                {"kind": "structtest_reasoning", "text": "t"},
                {"kind": "structtest_reply", "message": "m"},
            ]
        }
    )
    node = StructuredNode(name="think", step_classes=CLASSES)
    agent = Agent.create(name="a", llms=answers("bad", good), nodes=[node])
    tape = agent.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
    assert [s.kind for s in tape.steps[1:]] == [
        "set_next_node",
        "llm_output_parsing_failure",
        "structtest_reasoning",
        "structtest_reply",
    ]
    texts = agent.make_training_text(tape)  # validated: each rebuilt output regenerates its run
    assert texts[0].output_text.startswith("bad")
    rebuilt = json.loads(texts[1].output_text.removesuffix("<|end|>\n"))
    assert rebuilt == {"steps": [s.llm_dict() for s in tape.steps[3:]]}


@needs_local_model
def test_the_embedded_model_always_produces_valid_steps() -> None:
    llm = LlamaCppLLM(parameters={"temperature": 0.7, "max_tokens": 200, "seed": 3})
    node = StructuredNode(
        name="act", step_classes=CLASSES, system="You are a helpful assistant.", max_steps=2
    )
    agent = Agent.create(name="helper", llms=llm, nodes=[node])
    for question in ["Find me papers about tapes.", "Say hello politely.", "What's 2+2?"]:
        tape = agent.run(Tape(steps=[UserStep(content=question)])).get_final_tape()
        assert tape.metadata.error is None, tape.metadata.error
        last_run = [s for s in tape.steps if s.metadata.prompt_id == tape.steps[-1].metadata.prompt_id]
        assert all(type(s) in CLASSES for s in last_run) and 1 <= len(last_run) <= 2
        for failure in (s for s in tape.steps if isinstance(s, LLMOutputParsingFailure)):
            assert "cut off" in failure.error  # the only way constrained output can fail
