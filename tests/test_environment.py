"""Tests for tapekit.environment: tool schemas, ToolEnvironment.react, handlers and the sync bridge."""

import asyncio
import datetime
import threading
from typing import Any, Literal

import pydantic
import pytest

from tapekit import (
    Action,
    AssistantStep,
    AssistantThought,
    Environment,
    ExternalObservationNeeded,
    Observation,
    SetNextNode,
    StopStep,
    Tape,
    Thought,
    Tool,
    ToolCall,
    ToolEnvironment,
    ToolResult,
    UnknownActionError,
    UserStep,
    unanswered_actions,
)

# --------------------------------------------------------------------------- custom steps


class EnvtestPing(Action):
    kind: Literal["envtest_ping"] = "envtest_ping"
    text: str = ""


class EnvtestPong(Observation):
    kind: Literal["envtest_pong"] = "envtest_pong"
    text: str = ""


class EnvtestUnhandled(Action):
    kind: Literal["envtest_unhandled"] = "envtest_unhandled"


class EnvtestNote(Thought):
    kind: Literal["envtest_note"] = "envtest_note"
    text: str = ""


# --------------------------------------------------------------------------- tools used below


class Point(pydantic.BaseModel):
    x: int
    y: int


def search(
    query: str,
    limit: int = 5,
    tags: list[str] | None = None,
    mode: Literal["fast", "deep"] = "fast",
    exact: bool = False,
) -> list[str]:
    """Search the document index.

    This second paragraph is long
    and must not appear in the description.

    Args:
        query: The text to look for,
            possibly spanning lines.
        limit (int): Maximum number of hits.
        tags: Only documents with these tags.
        mode: How hard to search.

    Returns:
        list[str]: the matching titles.
    """
    return [query] * limit


def read_file(path: str, times: int = 1, encoding: str | None = None) -> str:
    """Read a file from disk
    and return its text.

    :param path: Where the file is.
    :param int times: How many times
        to read it.
    :param encoding: The text encoding.
    :returns: the text
    :rtype: str
    """
    return path * times


def no_doc(a, b: float = 1.5):
    return a


def add(a: int, b: int = 1) -> int:
    """Add two integers."""
    return a + b


async def async_add(a: int, b: int = 1) -> int:
    """Add two integers, asynchronously."""
    await asyncio.sleep(0)
    return a + b


def make_point(x: int, y: int) -> Point:
    """Make a point."""
    return Point(x=x, y=y)


class Opaque:
    def __str__(self) -> str:
        return "<opaque thing>"


def make_opaque() -> Opaque:
    """Return something that JSON cannot encode."""
    return Opaque()


def make_date() -> datetime.date:
    """Return a date."""
    return datetime.date(2024, 1, 2)


def explode(n: int) -> int:
    """Always fails."""
    raise KeyError(f"missing {n}")


async def async_explode() -> None:
    """Always fails, asynchronously."""
    await asyncio.sleep(0)
    raise RuntimeError("async kaboom")


def ask_human(question: str) -> str:
    """Needs a human."""
    raise ExternalObservationNeeded(AssistantStep(content=question))


async def async_ask_human(question: str) -> str:
    """Needs a human, asynchronously."""
    raise ExternalObservationNeeded(AssistantStep(content=question))


def tape_of(*steps: Any) -> Tape:
    return Tape(steps=list(steps))


def new_results(before: Tape, after: Tape) -> list[Any]:
    return list(after.steps)[len(before) :]


# --------------------------------------------------------------------------- schemas


def _no_titles(node: Any) -> bool:
    if isinstance(node, dict):
        return "title" not in node and all(_no_titles(v) for v in node.values())
    if isinstance(node, list):
        return all(_no_titles(v) for v in node)
    return True


def test_google_docstring_schema() -> None:
    schema = Tool(search).schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "search"
    assert fn["description"] == "Search the document index."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert "title" not in params
    assert params["required"] == ["query"]
    props = params["properties"]
    assert list(props) == ["query", "limit", "tags", "mode", "exact"]
    assert props["query"] == {
        "type": "string",
        "description": "The text to look for, possibly spanning lines.",
    }
    assert props["limit"]["type"] == "integer"
    assert props["limit"]["default"] == 5
    assert props["limit"]["description"] == "Maximum number of hits."
    assert props["tags"]["default"] is None
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert {"type": "null"} in props["tags"]["anyOf"]
    assert props["tags"]["description"] == "Only documents with these tags."
    assert props["mode"]["enum"] == ["fast", "deep"]
    assert props["mode"]["default"] == "fast"
    assert props["mode"]["description"] == "How hard to search."
    assert props["exact"] == {"type": "boolean", "default": False}  # no docstring entry: no description
    # the Returns section does not leak into the parameters
    assert "description" not in props["exact"]
    assert _no_titles(props)


def test_sphinx_docstring_schema() -> None:
    fn = Tool(read_file).schema()["function"]
    assert fn["description"] == "Read a file from disk and return its text."
    params = fn["parameters"]
    assert params["required"] == ["path"]
    props = params["properties"]
    assert props["path"] == {"type": "string", "description": "Where the file is."}
    assert props["times"] == {"type": "integer", "default": 1, "description": "How many times to read it."}
    assert props["encoding"]["description"] == "The text encoding."
    assert {"type": "null"} in props["encoding"]["anyOf"]
    assert set(props) == {"path", "times", "encoding"}  # :returns: / :rtype: are not parameters
    assert _no_titles(props)


def test_sphinx_continuation_line_with_colon() -> None:
    def scale(x: int) -> int:
        """Scale a value.

        :param x: The value to scale,
            example: 3.
        """
        return x

    props = Tool(scale).schema()["function"]["parameters"]["properties"]
    assert props["x"]["description"] == "The value to scale, example: 3."
    assert set(props) == {"x"}


def test_schema_without_docstring_or_hints() -> None:
    fn = Tool(no_doc).schema()["function"]
    assert fn["description"] == ""
    params = fn["parameters"]
    assert params["required"] == ["a"]
    assert params["properties"]["a"] == {}  # no annotation: any JSON value
    assert params["properties"]["b"] == {"type": "number", "default": 1.5}


def test_schema_skips_var_args_and_rejects_extra() -> None:
    def f(a: int, *args: int, **kwargs: int) -> int:
        """F."""
        return a

    params = Tool(f).schema()["function"]["parameters"]
    assert set(params["properties"]) == {"a"}
    assert params["additionalProperties"] is False


def test_tool_name_override_and_non_callable() -> None:
    assert Tool(add, name="plus").schema()["function"]["name"] == "plus"
    with pytest.raises(TypeError):
        Tool(42)  # type: ignore[arg-type]


def test_tool_schemas_openai_format() -> None:
    env = ToolEnvironment([add, async_add, Tool(make_point, name="point")])
    schemas = env.tool_schemas()
    assert [s["function"]["name"] for s in schemas] == ["add", "async_add", "point"]
    for s in schemas:
        assert set(s) == {"type", "function"}
        assert s["type"] == "function"
        assert set(s["function"]) == {"name", "description", "parameters"}
        assert s["function"]["parameters"]["type"] == "object"
        assert _no_titles(s["function"]["parameters"]["properties"])
    assert schemas[0]["function"]["description"] == "Add two integers."
    assert schemas[1]["function"]["description"] == "Add two integers, asynchronously."


def test_duplicate_tool_names_raise() -> None:
    with pytest.raises(ValueError, match="add"):
        ToolEnvironment([add, add])
    with pytest.raises(ValueError, match="add"):
        ToolEnvironment([add, Tool(async_add, name="add")])


# --------------------------------------------------------------------------- react: results


def test_sync_and_async_tools_answered() -> None:
    env = ToolEnvironment([add, async_add])
    tape = tape_of(
        UserStep(content="go"),
        ToolCall(name="add", arguments={"a": 2, "b": 3}, call_id="c1"),
        ToolCall(name="async_add", arguments={"a": 10}, call_id="c2"),
    )
    out = env.react(tape)
    results = new_results(tape, out)
    assert all(isinstance(r, ToolResult) for r in results)
    assert [(r.call_id, r.name, r.content, r.error) for r in results] == [
        ("c1", "add", 5, None),
        ("c2", "async_add", 11, None),
    ]


def test_arguments_are_validated_and_coerced() -> None:
    env = ToolEnvironment([add])
    tape = tape_of(ToolCall(name="add", arguments={"a": "4"}, call_id="c"))
    (result,) = new_results(tape, env.react(tape))
    assert result.error is None
    assert result.content == 5


def test_pydantic_return_is_dumped() -> None:
    env = ToolEnvironment([make_point])
    tape = tape_of(ToolCall(name="make_point", arguments={"x": 1, "y": 2}, call_id="p"))
    (result,) = new_results(tape, env.react(tape))
    assert result.error is None
    assert result.content == {"x": 1, "y": 2}
    assert isinstance(result.content, dict)


def test_non_json_return_becomes_str() -> None:
    env = ToolEnvironment([make_opaque, make_date])
    tape = tape_of(
        ToolCall(name="make_opaque", call_id="o"),
        ToolCall(name="make_date", call_id="d"),
    )
    res_opaque, res_date = new_results(tape, env.react(tape))
    assert res_opaque.content == "<opaque thing>"
    assert res_date.content == "2024-01-02"
    assert res_opaque.error is None and res_date.error is None
    # the resulting tape is JSON-serialisable
    assert Tape.model_validate_json(env.react(tape).model_dump_json()).steps[-1].content == "2024-01-02"


def test_list_of_pydantic_models_is_dumped() -> None:
    def points() -> list[Point]:
        """Some points."""
        return [Point(x=1, y=2)]

    env = ToolEnvironment([points])
    tape = tape_of(ToolCall(name="points", call_id="p"))
    (result,) = new_results(tape, env.react(tape))
    assert result.content == [{"x": 1, "y": 2}]


# --------------------------------------------------------------------------- react: errors


def test_tool_exception_becomes_error_observation() -> None:
    env = ToolEnvironment([explode, async_explode, add])
    tape = tape_of(
        ToolCall(name="explode", arguments={"n": 7}, call_id="e1"),
        ToolCall(name="async_explode", call_id="e2"),
        ToolCall(name="add", arguments={"a": 1}, call_id="ok"),
    )
    r1, r2, r3 = new_results(tape, env.react(tape))
    assert r1.call_id == "e1" and r1.name == "explode"
    assert r1.content is None
    assert "KeyError" in r1.error and "missing 7" in r1.error
    assert r2.call_id == "e2"
    assert "RuntimeError" in r2.error and "async kaboom" in r2.error
    # the failing calls do not spoil the others
    assert r3.error is None and r3.content == 2


def test_validation_error_inside_tool_is_not_an_argument_error() -> None:
    def parse(x: int) -> int:
        """Parses a point from the database."""
        return Point.model_validate({"x": "not a number", "y": x}).x

    env = ToolEnvironment([parse])
    tape = tape_of(ToolCall(name="parse", arguments={"x": 1}, call_id="v"))
    (result,) = new_results(tape, env.react(tape))
    assert result.error is not None
    assert "ValidationError" in result.error
    assert "invalid arguments" not in result.error


def test_positional_only_parameters() -> None:
    def double(n: int, /) -> int:
        """Double a number."""
        return 2 * n

    env = ToolEnvironment([double])
    tape = tape_of(ToolCall(name="double", arguments={"n": 4}, call_id="d"))
    (result,) = new_results(tape, env.react(tape))
    assert result.error is None
    assert result.content == 8


@pytest.mark.parametrize(
    ("arguments", "argument"),
    [
        ({"a": "not a number"}, "a"),  # wrong type
        ({"b": 2}, "a"),  # missing required
        ({"a": 1, "c": 2}, "c"),  # extra
    ],
)
def test_invalid_arguments_give_error_naming_argument(arguments: dict[str, Any], argument: str) -> None:
    calls: list[Any] = []

    def guarded(a: int, b: int = 1) -> int:
        """Records its calls."""
        calls.append((a, b))
        return a

    env = ToolEnvironment([guarded])
    tape = tape_of(ToolCall(name="guarded", arguments=arguments, call_id="x"))
    (result,) = new_results(tape, env.react(tape))
    assert isinstance(result, ToolResult)
    assert result.call_id == "x" and result.name == "guarded"
    assert result.content is None
    assert result.error is not None
    assert "guarded" in result.error
    assert f"{argument}:" in result.error
    assert calls == []  # the function never ran


def test_unknown_tool_lists_available_tools() -> None:
    env = ToolEnvironment([add, async_add])
    tape = tape_of(ToolCall(name="subtract", arguments={"a": 1}, call_id="u"))
    (result,) = new_results(tape, env.react(tape))
    assert isinstance(result, ToolResult)
    assert result.call_id == "u" and result.name == "subtract"
    assert "subtract" in result.error
    assert "add" in result.error and "async_add" in result.error

    (empty_result,) = new_results(tape, ToolEnvironment().react(tape))
    assert "subtract" in empty_result.error


# --------------------------------------------------------------------------- ordering and concurrency


def test_async_tools_run_concurrently_and_keep_order() -> None:
    finished: list[str] = []
    started: list[str] = []
    b_done = asyncio.Event()

    async def slow(label: str) -> str:
        """Waits: a and c until b is done, so they only finish if the three overlap."""
        started.append(label)
        if label == "b":
            b_done.set()
        else:
            await asyncio.wait_for(b_done.wait(), timeout=30)
        finished.append(label)
        return label

    env = ToolEnvironment([slow])
    tape = tape_of(
        UserStep(content="go"),
        ToolCall(name="slow", arguments={"label": "a"}, call_id="1"),
        ToolCall(name="slow", arguments={"label": "b"}, call_id="2"),
        ToolCall(name="slow", arguments={"label": "c"}, call_id="3"),
    )
    out = env.react(tape)
    results = new_results(tape, out)
    assert started[:2] == ["a", "b"] and finished[0] == "b"  # a was still waiting when b ran...
    assert [r.content for r in results] == ["a", "b", "c"]  # ...but results follow the calls
    assert [r.call_id for r in results] == ["1", "2", "3"]


def test_sync_tools_run_concurrently_in_threads() -> None:
    threads: list[int] = []
    lock = threading.Lock()

    together = threading.Barrier(3, timeout=30)  # passes only when all three run at once

    def blocking(label: str) -> str:
        """Blocks its thread until the other two calls are running too."""
        together.wait()
        with lock:
            threads.append(threading.get_ident())
        return label

    env = ToolEnvironment([blocking])
    tape = tape_of(*(ToolCall(name="blocking", arguments={"label": x}, call_id=x) for x in "xyz"))
    out = env.react(tape)
    assert [r.content for r in new_results(tape, out)] == ["x", "y", "z"]
    assert threading.get_ident() not in threads
    assert len(set(threads)) == 3


# --------------------------------------------------------------------------- unanswered_actions


def test_unanswered_actions_after_last_observation() -> None:
    old_call = ToolCall(name="add", arguments={"a": 1}, call_id="old")
    c1 = ToolCall(name="add", arguments={"a": 2}, call_id="c1")
    c2 = ToolCall(name="add", arguments={"a": 3}, call_id="c2")
    ping = EnvtestPing(text="hi")
    tape = tape_of(
        UserStep(content="q"),
        old_call,
        ToolResult(call_id="old", name="add", content=2),
        c1,
        AssistantThought(content="thinking"),
        EnvtestNote(text="note"),
        SetNextNode(next_node="n"),
        c2,
        ping,
        StopStep(reason="done"),
    )
    actions = unanswered_actions(tape)
    assert actions == [c1, c2, ping]
    assert all(not isinstance(a, StopStep) for a in actions)


def test_unanswered_actions_empty_cases() -> None:
    assert unanswered_actions(tape_of()) == []
    assert unanswered_actions(tape_of(UserStep(content="hi"))) == []
    assert unanswered_actions(tape_of(ToolCall(name="x"), ToolResult(name="x"))) == []
    assert unanswered_actions(tape_of(UserStep(content="hi"), StopStep())) == []
    only = ToolCall(name="x", call_id="1")
    assert unanswered_actions(tape_of(only)) == [only]


def test_react_answers_only_unanswered_actions() -> None:
    env = ToolEnvironment([add])
    tape = tape_of(
        ToolCall(name="add", arguments={"a": 1}, call_id="old"),
        ToolResult(call_id="old", name="add", content=2),
        AssistantThought(content="again"),
        ToolCall(name="add", arguments={"a": 5}, call_id="new"),
        StopStep(),
    )
    results = new_results(tape, env.react(tape))
    assert [(r.call_id, r.content) for r in results] == [("new", 6)]


# --------------------------------------------------------------------------- tape metadata


def test_returned_tape_metadata_and_input_unchanged() -> None:
    env = ToolEnvironment([add], name="calc_env")
    tape = tape_of(
        UserStep(content="q"),
        ToolCall(name="add", arguments={"a": 1}, call_id="1"),
        ToolCall(name="add", arguments={"a": 2}, call_id="2"),
    )
    snapshot = tape.model_dump()
    out = env.react(tape)
    assert out.metadata.parent_id == tape.metadata.id
    assert out.metadata.id != tape.metadata.id
    assert out.metadata.author == "calc_env"
    assert out.metadata.n_added_steps == 2
    assert len(out) == 5
    assert list(out.steps)[:3] == list(tape.steps)
    # the input is untouched, and reacting to it again gives an independent continuation
    assert len(tape) == 3
    assert tape.model_dump() == snapshot
    again = env.react(tape)
    assert len(again) == 5 and len(out) == 5
    assert [s.content for s in new_results(tape, again)] == [2, 3]


def test_default_environment_name_and_nothing_to_answer() -> None:
    env = ToolEnvironment([add])
    tape = tape_of(UserStep(content="hi"))
    out = env.react(tape)
    assert out.metadata.author == "environment"
    assert out.metadata.parent_id == tape.metadata.id
    assert out.metadata.n_added_steps == 0
    assert list(out.steps) == list(tape.steps)


# --------------------------------------------------------------------------- handlers and unknown actions


def test_unhandled_action_raises_unknown_action_error() -> None:
    env = ToolEnvironment([add], name="my_env")
    tape = tape_of(EnvtestUnhandled())
    with pytest.raises(UnknownActionError, match="envtest_unhandled") as info:
        env.react(tape)
    assert isinstance(info.value, TypeError)
    assert "my_env" in str(info.value)


def test_sync_handler() -> None:
    seen: list[EnvtestPing] = []

    def pong(action: EnvtestPing) -> EnvtestPong:
        seen.append(action)
        return EnvtestPong(text=action.text.upper())

    env = ToolEnvironment(handlers={EnvtestPing: pong})
    ping = EnvtestPing(text="hello")
    tape = tape_of(ping)
    (obs,) = new_results(tape, env.react(tape))
    assert isinstance(obs, EnvtestPong)
    assert obs.text == "HELLO"
    assert seen == [ping]


def test_async_handler_alongside_tools() -> None:
    async def pong(action: EnvtestPing) -> EnvtestPong:
        await asyncio.sleep(0)
        return EnvtestPong(text=action.text * 2)

    env = ToolEnvironment([add], handlers={EnvtestPing: pong})
    tape = tape_of(
        ToolCall(name="add", arguments={"a": 1}, call_id="t"),
        EnvtestPing(text="ab"),
    )
    tool_result, obs = new_results(tape, env.react(tape))
    assert isinstance(tool_result, ToolResult) and tool_result.content == 2
    assert isinstance(obs, EnvtestPong) and obs.text == "abab"


def test_handler_returning_non_observation_raises_type_error() -> None:
    env = ToolEnvironment(handlers={EnvtestPing: lambda action: "not a step"})
    with pytest.raises(TypeError, match="EnvtestPing"):
        env.react(tape_of(EnvtestPing()))

    async def returns_thought(action: EnvtestPing) -> Any:
        return AssistantThought(content="oops")

    env = ToolEnvironment(handlers={EnvtestPing: returns_thought})
    with pytest.raises(TypeError):
        env.react(tape_of(EnvtestPing()))


# --------------------------------------------------------------------------- external observations


def test_assistant_step_needs_external_observation() -> None:
    env = ToolEnvironment([add])
    message = AssistantStep(content="What is your name?")
    tape = tape_of(UserStep(content="hi"), message)
    with pytest.raises(ExternalObservationNeeded) as info:
        env.react(tape)
    assert info.value.action == message
    assert info.value.action.content == "What is your name?"


@pytest.mark.parametrize("tool_name", ["ask_human", "async_ask_human"])
def test_tool_raising_external_observation_propagates(tool_name: str) -> None:
    env = ToolEnvironment([ask_human, async_ask_human])
    tape = tape_of(ToolCall(name=tool_name, arguments={"question": "ok?"}, call_id="h"))
    with pytest.raises(ExternalObservationNeeded) as info:
        env.react(tape)
    assert isinstance(info.value.action, AssistantStep)
    assert info.value.action.content == "ok?"


def test_external_observation_needed_default_message() -> None:
    action = EnvtestPing()
    exc = ExternalObservationNeeded(action)
    assert exc.action is action
    assert "envtest_ping" in str(exc)
    assert str(ExternalObservationNeeded(action, "custom")) == "custom"


# --------------------------------------------------------------------------- Environment base class


class EchoEnvironment(Environment):
    name = "echo"

    def react(self, tape: Tape) -> Tape:
        observations = [EnvtestPong(text=a.text) for a in unanswered_actions(tape)]
        return self._continued(tape, observations)


class AsyncEchoEnvironment(Environment):
    name = "async_echo"

    async def areact(self, tape: Tape) -> Tape:
        await asyncio.sleep(0)
        return self._continued(tape, [EnvtestPong(text="async " + a.text) for a in unanswered_actions(tape)])


class LazyEnvironment(Environment):
    pass


def test_environment_overriding_react_works_through_areact() -> None:
    env = EchoEnvironment()
    tape = tape_of(EnvtestPing(text="one"), EnvtestPing(text="two"))
    out = asyncio.run(env.areact(tape))
    assert [s.text for s in new_results(tape, out)] == ["one", "two"]
    assert out.metadata.author == "echo"
    assert out.metadata.parent_id == tape.metadata.id
    assert out.metadata.n_added_steps == 2


def test_environment_overriding_areact_works_through_react() -> None:
    env = AsyncEchoEnvironment()
    tape = tape_of(EnvtestPing(text="x"))
    out = env.react(tape)
    assert [s.text for s in new_results(tape, out)] == ["async x"]
    assert out.metadata.author == "async_echo"


def test_environment_overriding_neither_raises() -> None:
    env = LazyEnvironment()
    tape = tape_of(EnvtestPing())
    with pytest.raises(NotImplementedError, match="LazyEnvironment"):
        asyncio.run(env.areact(tape))
    with pytest.raises(NotImplementedError):
        env.react(tape)


# --------------------------------------------------------------------------- sync bridge


def test_react_inside_running_event_loop() -> None:
    tool_threads: list[int] = []

    async def where(x: int) -> int:
        """Records the thread it runs on."""
        tool_threads.append(threading.get_ident())
        await asyncio.sleep(0)
        return x * 3

    env = ToolEnvironment([where, add])
    tape = tape_of(
        ToolCall(name="where", arguments={"x": 2}, call_id="w"),
        ToolCall(name="add", arguments={"a": 2}, call_id="a"),
    )

    async def main() -> tuple[Tape, int]:
        loop_thread = threading.get_ident()
        out = env.react(tape)  # sync call while this loop runs
        return out, loop_thread

    out, loop_thread = asyncio.run(main())
    assert [r.content for r in new_results(tape, out)] == [6, 3]
    assert tool_threads and tool_threads[0] != loop_thread


def test_react_inside_running_loop_propagates_exceptions() -> None:
    env = ToolEnvironment()

    async def main() -> None:
        env.react(tape_of(EnvtestUnhandled()))

    with pytest.raises(UnknownActionError):
        asyncio.run(main())


def test_areact_directly() -> None:
    env = ToolEnvironment([async_add])
    tape = tape_of(ToolCall(name="async_add", arguments={"a": 1, "b": 1}, call_id="z"))
    out = asyncio.run(env.areact(tape))
    (result,) = new_results(tape, out)
    assert result.content == 2 and result.call_id == "z"


def test_tool_schemas_are_built_once_and_returned_as_copies() -> None:
    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: the word.
        """
        return word

    tool = Tool(lookup)
    first = tool.schema()
    first["function"]["parameters"]["properties"]["word"]["description"] = "edited"
    assert tool.schema()["function"]["parameters"]["properties"]["word"]["description"] == "the word."
    assert tool.schema() == tool.schema() and tool.schema() is not tool.schema()
