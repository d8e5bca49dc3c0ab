"""Structured steps from LLM output: schema, parsing, failures as steps, the embedded model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Literal

import pytest

from tapekit import Action, Agent, FunctionLLM, Node, Tape, Thought, UserStep, replay_tape
from tapekit.core import LLMOutput, Prompt, ToolCallRequest
from tapekit.dialog import tool_calls_from_output
from tapekit.llm.base import escape_lone_surrogates
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
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (
            '{"steps": [{"kind": "structtest_search", "query": "q", "max_results": ' + "9" * 5000 + "}]}",
            "int",
        ),
        ("", "the output is empty"),
        ("  \n", "the output is empty"),
    ],
    ids=[
        *("prose", "no-steps", "a-list", "unknown-kind", "missing-field", "bad-enum"),
        *("deep", "huge-int", "empty", "blank"),
    ],
)
def test_bad_output_is_explained_and_becomes_a_failure_step(text: str, message: str) -> None:
    with pytest.raises(StepParsingError, match=message):
        parse_steps(text, CLASSES)
    (failure,) = steps_or_failure(text, CLASSES)
    assert isinstance(failure, LLMOutputParsingFailure) and failure.raw == text and message in failure.error
    assert "cut off" not in failure.error or message == "not JSON"


def test_every_malformed_output_becomes_a_failure_step_retried_then_a_clear_error() -> None:
    deep = '{"steps": ' + "[" * 100_000 + "]" * 100_000 + "}"
    huge = '{"steps": [{"kind": "structtest_search", "query": "q", "max_results": ' + "9" * 5000 + "}]}"
    for bad in (deep, huge, ""):
        node = StructuredNode(name="think", step_classes=CLASSES, max_retries=1)
        agent = Agent.create(name="a", llms=answers(bad, bad), nodes=[node])
        tape = agent.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
        failures = [s for s in tape.steps if isinstance(s, LLMOutputParsingFailure)]
        assert [f.raw for f in failures] == [bad, bad]  # the raw text is kept, and it was retried
        error = tape.metadata.error or ""
        assert "could not be parsed into steps in 2 attempts" in error and "SetNextNode" not in error
        assert "cut off" not in error and "(in node a.think)" in error


def answers(*outputs: str) -> FunctionLLM:
    queue = list(outputs)
    return FunctionLLM(fn=lambda prompt: queue.pop(0))


def test_structured_node_retries_once_then_keeps_the_failure_on_the_tape() -> None:
    node = StructuredNode(name="think", step_classes=CLASSES, max_retries=1)
    agent = Agent.create(name="a", llms=answers("oops", "still oops"), nodes=[node])
    tape = agent.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
    kinds = [s.kind for s in tape.steps]
    assert kinds == ["user", *["set_next_node", "llm_output_parsing_failure"] * 2]
    assert tape.steps[2].raw == "oops" and tape.steps[4].raw == "still oops"  # type: ignore[attr-defined]
    # no retries left, and no other node to route to: the agent stops, saying why
    assert "StepParsingError: the LLM's output could not be parsed into steps in 2 attempts" in (
        tape.metadata.error or ""
    )
    assert "the output is not JSON" in (tape.metadata.error or "")


class GiveUp(Node):
    """Replies that it gave up, after seeing the parsing failure."""

    def make_prompt(self, agent: Agent, tape: Tape) -> None:
        return None

    def generate_steps(self, agent: Agent, tape: Tape, llm_stream: object) -> Iterator[Reply]:
        assert isinstance(tape.steps[-1], LLMOutputParsingFailure)
        yield Reply(message="gave up")


def test_when_retries_run_out_the_next_node_sees_the_failure() -> None:
    node = StructuredNode(name="think", step_classes=CLASSES, max_retries=0)
    agent = Agent.create(name="a", llms=answers("oops"), nodes=[node, GiveUp(name="after")])
    tape = agent.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
    assert [s.kind for s in tape.steps[1:]] == ["llm_output_parsing_failure", "structtest_reply"]
    assert tape.metadata.error is None


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


# ---------------------------------------------------------------------------- lone surrogates in LLM output


def test_json_decoding_to_a_lone_surrogate_gives_steps_with_its_escape() -> None:
    escaped = '{"steps": [{"kind": "structtest_search", "query": "half \\ud83d, whole \\ud83d\\ude00"}]}'
    raw = '{"steps": [{"kind": "structtest_search", "query": "half \ud83d, whole \ud83d\ude00"}]}'
    for text in (escaped, raw):  # a JSON escape, and raw code points (a pair split in two)
        assert json.loads(text)["steps"][0]["query"].startswith("half \ud83d")  # json.loads accepts it
        (step,) = parse_steps(text, CLASSES)
        assert isinstance(step, Search) and step.query == "half \\ud83d, whole \U0001f600"
        step.model_dump_json()  # valid Unicode: it serialises, so any store can hold it
    (failure,) = steps_or_failure("prose \ud83d", CLASSES)
    assert isinstance(failure, LLMOutputParsingFailure) and failure.raw == "prose \\ud83d"
    assert "not JSON" in failure.error


def test_every_llm_streams_valid_unicode_and_tool_call_arguments_decode_to_it() -> None:
    def half_emoji(prompt: Prompt) -> LLMOutput:
        arguments = '{"q": "raw \ud83d", "e\\udc00": "escaped \\ud83d"}'
        return LLMOutput(
            content="half \ud83d", tool_calls=[ToolCallRequest(id="c1", name="f", arguments=arguments)]
        )

    events = list(FunctionLLM(fn=half_emoji).stream(Prompt(messages=[])))
    assert "".join(e.chunk for e in events if e.chunk) == "half \\ud83d"
    output = events[-1].output
    assert output is not None and output.content == "half \\ud83d"
    assert output.tool_calls is not None
    assert output.tool_calls[0].arguments == '{"q": "raw \\ud83d", "e\\udc00": "escaped \\ud83d"}'
    (call,) = tool_calls_from_output(output)
    assert call.arguments == {"q": "raw \\ud83d", "e\\udc00": "escaped \\ud83d"}
    valid = "whole \U0001f600"
    assert escape_lone_surrogates(valid) is valid and escape_lone_surrogates(3) == 3


def test_a_tape_with_escaped_output_replays_and_makes_training_text() -> None:
    answer = '{"steps": [{"kind": "structtest_reply", "message": "bye \\ud83d"}]}'
    agent = Agent.create(name="a", llms=answers(answer), nodes=[StructuredNode(step_classes=CLASSES)])
    tape = agent.run(Tape(steps=[UserStep(content="hi")])).get_final_tape()
    assert tape.metadata.error is None and tape.steps[-1].message == "bye \\ud83d"  # type: ignore[attr-defined]
    assert replay_tape(agent, tape).ok
    (text,) = agent.make_training_text(tape)
    assert "bye \\\\ud83d" in text.output_text  # the rebuilt JSON escapes the backslash


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
