"""Tests for tapekit.dialog: tool calls from LLM output, chat messages from steps, JSON round trips."""

import json
from typing import Literal

import pytest

from tapekit import (
    AssistantStep,
    AssistantThought,
    Call,
    LLMOutput,
    Observation,
    Respond,
    SetNextNode,
    StepMetadata,
    StopStep,
    SystemStep,
    Tape,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    UserStep,
    tool_calls_from_output,
    view_to_messages,
)


class EnvtestDialogReading(Observation):
    kind: Literal["envtest_dialog_reading"] = "envtest_dialog_reading"
    value: float
    unit: str = "C"


# --------------------------------------------------------------------------- tool_calls_from_output


def test_tool_calls_from_output_valid() -> None:
    output = LLMOutput(
        content=None,
        tool_calls=[
            ToolCallRequest(id="call_1", name="search", arguments='{"query": "tapes", "limit": 3}'),
            ToolCallRequest(id="call_2", name="now", arguments=""),
            ToolCallRequest(id="call_3", name="nested", arguments='{"a": {"b": [1, 2]}, "c": null}'),
        ],
    )
    calls = tool_calls_from_output(output)
    assert all(isinstance(c, ToolCall) for c in calls)
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("call_1", "search", {"query": "tapes", "limit": 3}),
        ("call_2", "now", {}),
        ("call_3", "nested", {"a": {"b": [1, 2]}, "c": None}),
    ]


def test_tool_calls_from_output_without_tool_calls() -> None:
    assert tool_calls_from_output(LLMOutput(content="just text")) == []
    assert tool_calls_from_output(LLMOutput(content="x", tool_calls=[])) == []


def test_tool_calls_from_output_invalid_json_names_tool() -> None:
    output = LLMOutput(
        tool_calls=[
            ToolCallRequest(id="1", name="fine", arguments="{}"),
            ToolCallRequest(id="2", name="broken_tool", arguments='{"query": "unterminated'),
        ]
    )
    with pytest.raises(ValueError, match="broken_tool") as info:
        tool_calls_from_output(output)
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


@pytest.mark.parametrize("arguments", ["[1, 2]", '"text"', "42", "null", "true"])
def test_tool_calls_from_output_non_object_raises(arguments: str) -> None:
    output = LLMOutput(tool_calls=[ToolCallRequest(id="1", name="picky_tool", arguments=arguments)])
    with pytest.raises(ValueError, match="picky_tool"):
        tool_calls_from_output(output)


def test_to_request_round_trip() -> None:
    call = ToolCall(
        name="lookup",
        arguments={"city": "Zürich", "days": 3, "opts": {"metric": True, "tags": ["a", "b"]}},
        call_id="call_42",
    )
    request = call.to_request()
    assert isinstance(request, ToolCallRequest)
    assert request.id == "call_42"
    assert request.name == "lookup"
    assert isinstance(request.arguments, str)
    assert json.loads(request.arguments) == call.arguments

    (back,) = tool_calls_from_output(LLMOutput(tool_calls=[request]))
    assert back.llm_dict() == call.llm_dict()
    assert back.to_request() == request


def test_to_request_defaults() -> None:
    request = ToolCall(name="ping").to_request()
    assert request == ToolCallRequest(id="", name="ping", arguments="{}")


# --------------------------------------------------------------------------- view_to_messages


def test_basic_role_mapping() -> None:
    steps = [
        SystemStep(content="You are terse."),
        UserStep(content="Hi"),
        AssistantThought(content="The user greets me."),
        AssistantStep(content="Hello!"),
    ]
    assert view_to_messages(steps) == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "The user greets me."},
        {"role": "assistant", "content": "Hello!"},
    ]


def test_consecutive_tool_calls_grouped() -> None:
    steps = [
        UserStep(content="weather?"),
        ToolCall(name="weather", arguments={"city": "Paris"}, call_id="c1"),
        ToolCall(name="weather", arguments={"city": "Rome"}, call_id="c2"),
        SetNextNode(next_node="after_tools"),
        ToolCall(name="clock", arguments={}, call_id="c3"),
        ToolResult(call_id="c1", name="weather", content="sunny"),
        ToolResult(call_id="c2", name="weather", content={"temp": 21, "sky": "clear"}),
        ToolResult(call_id="c3", name="clock", error="TimeoutError: no clock"),
        ToolCall(name="weather", arguments={"city": "Oslo"}, call_id="c4"),
    ]
    messages = view_to_messages(steps)
    assert len(messages) == 6
    assert messages[0] == {"role": "user", "content": "weather?"}

    grouped = messages[1]
    assert grouped["role"] == "assistant"
    assert grouped["content"] is None
    assert [tc["id"] for tc in grouped["tool_calls"]] == ["c1", "c2", "c3"]
    assert grouped["tool_calls"][0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})},
    }
    assert json.loads(grouped["tool_calls"][2]["function"]["arguments"]) == {}

    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert messages[3]["role"] == "tool"
    assert messages[3]["tool_call_id"] == "c2"
    assert json.loads(messages[3]["content"]) == {"temp": 21, "sky": "clear"}
    assert messages[4] == {"role": "tool", "tool_call_id": "c3", "content": "Error: TimeoutError: no clock"}

    # a tool call after the results starts a new assistant message
    assert messages[5]["role"] == "assistant"
    assert [tc["id"] for tc in messages[5]["tool_calls"]] == ["c4"]


def test_tool_call_after_user_message_starts_new_message() -> None:
    messages = view_to_messages(
        [
            ToolCall(name="a", call_id="1"),
            UserStep(content="wait"),
            ToolCall(name="b", call_id="2"),
        ]
    )
    assert [m["role"] for m in messages] == ["assistant", "user", "assistant"]
    assert [tc["function"]["name"] for tc in messages[0]["tool_calls"]] == ["a"]
    assert [tc["function"]["name"] for tc in messages[2]["tool_calls"]] == ["b"]


def test_tool_result_error_takes_precedence_and_content_encoding() -> None:
    messages = view_to_messages(
        [
            ToolResult(call_id="e", name="t", content="partial", error="ValueError: bad"),
            ToolResult(call_id="l", name="t", content=[1, "ü"]),
            ToolResult(call_id="n", name="t", content=7),
        ]
    )
    assert messages[0]["content"] == "Error: ValueError: bad"
    assert messages[1]["content"] == '[1, "ü"]'  # not ASCII-escaped
    assert messages[2]["content"] == "7"
    assert all(m["role"] == "tool" for m in messages)


def test_control_steps_skipped() -> None:
    messages = view_to_messages(
        [
            UserStep(content="hi"),
            SetNextNode(next_node="x"),
            SetNextNode(next_node=2),
            StopStep(reason="done"),
        ]
    )
    assert messages == [{"role": "user", "content": "hi"}]


def test_call_rendering() -> None:
    by_root = Call(agent_name="researcher", content="find papers", metadata=StepMetadata(agent="root"))
    # no agent_name: the call reads as the assistant asking its subagent
    assert view_to_messages([by_root]) == [{"role": "assistant", "content": "(asks researcher) find papers"}]
    # viewed by the agent that made it: still the assistant asking
    assert view_to_messages([by_root], agent_name="root") == [
        {"role": "assistant", "content": "(asks researcher) find papers"}
    ]
    # viewed by the called agent: the caller's request reads as the user's message
    assert view_to_messages([by_root], agent_name="root/researcher") == [
        {"role": "user", "content": "find papers"}
    ]


def test_respond_rendering() -> None:
    from_sub = Respond(content="3 papers found", metadata=StepMetadata(agent="root/researcher"))
    anonymous = Respond(content="done")
    assert view_to_messages([from_sub, anonymous]) == [
        {"role": "user", "content": "(researcher answers) 3 papers found"},
        {"role": "user", "content": "(subagent answers) done"},
    ]


def test_other_steps_rendered_as_user_json() -> None:
    reading = EnvtestDialogReading(value=21.5, metadata=StepMetadata(agent="sensor"))
    (message,) = view_to_messages([reading])
    assert message["role"] == "user"
    assert json.loads(message["content"]) == {"kind": "envtest_dialog_reading", "value": 21.5, "unit": "C"}
    assert "metadata" not in message["content"]


def test_empty_view() -> None:
    assert view_to_messages([]) == []


# --------------------------------------------------------------------------- JSON round trip


def test_tape_json_round_trip_all_dialog_kinds() -> None:
    steps = [
        SystemStep(content="sys"),
        UserStep(content="hello ü"),
        AssistantThought(content="plan", metadata=StepMetadata(agent="root", node="think", prompt_id="p1")),
        ToolCall(name="search", arguments={"q": "x", "n": [1, 2]}, call_id="c1"),
        ToolCall(name="noargs", call_id="c2"),
        ToolResult(call_id="c1", name="search", content={"hits": ["a"], "score": 0.5}),
        ToolResult(call_id="c2", name="noargs", error="KeyError: 'x'"),
        ToolResult(call_id="c3", name="plain", content="text"),
        AssistantStep(content="answer", metadata=StepMetadata(run_end=True, other={"k": 1})),
        Call(agent_name="sub", content="go"),
        Respond(content="back"),
        SetNextNode(next_node=1),
        SetNextNode(next_node="named"),
        StopStep(reason="end"),
        EnvtestDialogReading(value=1.0),
    ]
    tape = Tape(steps=steps)
    text = tape.model_dump_json()
    restored = Tape.model_validate_json(text)
    assert restored == tape
    assert [type(s) for s in restored.steps] == [type(s) for s in steps]
    assert restored.metadata == tape.metadata
    assert [s.metadata for s in restored.steps] == [s.metadata for s in steps]
    assert restored.steps[11].next_node == 1 and restored.steps[12].next_node == "named"
    assert restored.steps[5].content == {"hits": ["a"], "score": 0.5}
    assert restored.steps[6].error == "KeyError: 'x'" and restored.steps[6].content is None
    # also through plain Python data
    assert Tape.model_validate(json.loads(text)) == tape
    # and the restored tape renders the same messages
    assert view_to_messages(restored.steps) == view_to_messages(tape.steps)


# --------------------------------------------------------------------------- shared read-only messages


def test_view_to_messages_shares_read_only_messages_between_calls() -> None:
    import copy
    import pickle

    import pytest

    from tapekit.core import FrozenMessage, Prompt, StepSequence

    steps = StepSequence([SystemStep(content="sys"), UserStep(content="hi")])
    first = view_to_messages(steps)
    longer = view_to_messages(steps.appended([AssistantStep(content="hello")]))
    assert longer[0] is first[0]  # the past is not copied again
    assert first == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert all(isinstance(m, FrozenMessage) for m in longer)
    with pytest.raises(TypeError, match="read-only"):
        first[1]["content"] = "changed"
    with pytest.raises(TypeError):
        first[1].update(content="changed")
    first.append({"role": "user", "content": "the list itself is the caller's"})
    assert len(view_to_messages(steps)) == 2
    changed = {**first[1], "content": "changed"}
    assert type(changed) is dict and first[1]["content"] == "hi"
    assert pickle.loads(pickle.dumps(first[0])) == first[0]
    assert copy.deepcopy(first[0]) == first[0] and copy.copy(first[0]) == first[0]

    prompt = Prompt(messages=longer)
    assert prompt.messages[2] is longer[2] and prompt.messages is not longer
    assert Prompt.model_validate_json(prompt.model_dump_json()) == prompt


def test_the_message_list_keeps_track_of_plain_dicts_added_to_it() -> None:
    """view_to_messages returns a FrozenMessageList: every way of adding an item updates
    ``all_frozen`` (so Prompt can trust it and skip the per-message look), a Prompt made from it
    still copies its plain dicts, and copies of the list are plain lists."""
    import copy
    import pickle

    from tapekit.core import FrozenMessage, FrozenMessageList, Prompt, StepSequence

    steps = StepSequence([SystemStep(content="sys"), UserStep(content="hi")])
    frozen = FrozenMessage({"role": "user", "content": "f"})
    plain = {"role": "user", "content": "p"}
    for tape_steps in (steps, list(steps)):  # memoised and plain paths
        messages = view_to_messages(tape_steps)
        assert type(messages) is FrozenMessageList and messages.all_frozen

    adders = [
        lambda m, x: m.append(x),
        lambda m, x: m.extend(iter([x])),
        lambda m, x: m.insert(0, x),
        lambda m, x: m.__iadd__([x]),
        lambda m, x: m.__setitem__(1, x),
        lambda m, x: m.__setitem__(slice(0, 1), (x,)),
    ]
    for add_item in adders:
        messages = view_to_messages(steps)
        add_item(messages, frozen)
        assert messages.all_frozen
        add_item(messages, plain)
        assert not messages.all_frozen
        prompt = Prompt(messages=messages)
        assert type(prompt.messages) is list and prompt.messages == list(messages)
        copied = [m for m in prompt.messages if m == plain]
        assert copied and all(type(m) is dict and m is not plain for m in copied)

    messages = view_to_messages(steps)
    messages.pop()
    messages.reverse()
    del messages[:0]
    assert messages.all_frozen  # dropping or reordering adds nothing
    assert type(messages[:]) is list and type(messages.copy()) is list
    assert type(pickle.loads(pickle.dumps(messages))) is list
    assert type(copy.deepcopy(messages)) is list
    assert FrozenMessageList([frozen]).all_frozen and not FrozenMessageList([plain]).all_frozen


def test_prompt_still_copies_and_validates_plain_dicts() -> None:
    import pytest
    from pydantic import ValidationError

    from tapekit.core import Prompt

    system = {"role": "system", "content": "sys"}
    prompt = Prompt(messages=[system, *view_to_messages([UserStep(content="hi")])])
    system["content"] = "changed later"
    assert prompt.messages[0] == {"role": "system", "content": "sys"}
    with pytest.raises(ValidationError):
        Prompt(messages=[{1: "not a string key"}])
    with pytest.raises(ValidationError):
        Prompt(messages=["not a dict"])
    assert Prompt(messages=({"role": "user", "content": "x"},)).messages == [{"role": "user", "content": "x"}]
