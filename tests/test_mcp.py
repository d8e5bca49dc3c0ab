"""MCPEnvironment against real MCP servers written with the SDK's server helper: one started over
stdio by the environment, one serving streamable HTTP on 127.0.0.1 in a subprocess."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra (pip install 'tapekit[mcp]')")

from tapekit import (
    Agent,
    AssistantThought,
    FunctionLLM,
    LLMOutput,
    LLMStream,
    Node,
    Prompt,
    SetNextNode,
    StopStep,
    Tape,
    ToolCall,
    ToolCallRequest,
    ToolResult,
    UserStep,
    async_main_loop,
    main_loop,
    tool_calls_from_output,
    view_to_messages,
)
from tapekit.mcp import (
    HTTPServer,
    InProcessServer,
    MCPEnvironment,
    MCPServerError,
    ServerSpec,
    StdioServer,
    listed_names,
)
from tests.conftest import alive, free_port

SERVER = str(Path(__file__).parent / "mcp_servers" / "tools_server.py")


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the HTTP MCP server exited with {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the HTTP MCP server did not listen on port {port} within {timeout_s} s")


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The streamable HTTP endpoint of a 'beta' server with two tools ('whoami' clashes)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, SERVER, "beta", "--http", str(port), "--tools", "whoami,shout,hang"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


def stdio(name: str = "alpha", *tools: str) -> StdioServer:
    args = [SERVER, name] + (["--tools", ",".join(tools)] if tools else [])
    return StdioServer(name, sys.executable, args)


# ----------------------------------------------------------------------------- an agent that uses tools


class ToolUse(Node):
    """Sends the conversation and the tools to the LLM; tool calls loop back to this node."""

    name: str = "act"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=view_to_messages(tape.steps), tools=agent.templates["tools"])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Any]:
        output = llm_stream.get_output()
        if output.tool_calls:
            yield SetNextNode(next_node="act")
            yield from tool_calls_from_output(output)
        else:
            yield AssistantThought(content=output.content or "")
            yield StopStep(reason="answered")


def brain(prompt: Prompt) -> LLMOutput:
    """Calls the tools once, then reports what they answered."""
    last = prompt.messages[-1]
    if last["role"] == "user":
        names = [t["function"]["name"] for t in prompt.tools or []]
        calls = [
            ToolCallRequest(id="c1", name="add", arguments=json.dumps({"numbers": [2, 3, 4]})),
            ToolCallRequest(id="c2", name="beta__whoami", arguments="{}"),
            ToolCallRequest(id="c3", name="alpha__whoami", arguments="{}"),
            ToolCallRequest(
                id="c4", name="shout", arguments=json.dumps({"text": "tools: " + ",".join(names)})
            ),
        ]
        return LLMOutput(tool_calls=calls)
    answers = [m["content"] for m in prompt.messages if m["role"] == "tool"]
    return LLMOutput(content=" | ".join(answers))


def make_agent(env: MCPEnvironment) -> Agent:
    return Agent.create(
        "helper", llms=FunctionLLM(fn=brain), nodes=[ToolUse()], templates={"tools": env.tool_schemas()}
    )


def check_session(final: Tape[Any, Any]) -> None:
    assert final.metadata.error is None
    results = {s.call_id: s for s in final.steps if isinstance(s, ToolResult)}
    assert results["c1"].content == {"total": 9, "terms": [2, 3, 4]}  # structured content kept as JSON
    assert results["c1"].metadata.other["mcp"] == {"server": "alpha", "tool": "add"}
    assert results["c2"].content == "beta" and results["c3"].content == "alpha"
    assert results["c2"].metadata.other["mcp"] == {"server": "beta", "tool": "whoami"}
    assert results["c4"].content == "TOOLS: SHOUT,ADD,ALPHA__WHOAMI,BETA__SHOUT,BETA__WHOAMI,HANG"
    assert all(r.error is None for r in results.values())
    answer = final.steps[-2]
    assert isinstance(answer, AssistantThought) and answer.content.startswith('{"total": 9')
    assert isinstance(final.steps[-1], StopStep)


def test_agent_calls_stdio_and_http_tools_through_the_main_loop(http_url: str) -> None:
    async def session() -> Tape[Any, Any]:
        servers: list[ServerSpec] = [stdio("alpha", "add", "whoami"), HTTPServer("beta", http_url)]
        async with MCPEnvironment(servers, tools=[shout_locally], timeout_s=20) as env:
            start: Tape[Any, Any] = Tape(steps=[UserStep(content="use the tools")])
            return await async_main_loop(make_agent(env), start, env).get_final_tape()

    check_session(asyncio.run(session()))


def shout_locally(text: str) -> str:
    """A Python tool next to the MCP tools: the text in capitals."""
    return text.upper()


shout_locally.__name__ = "shout"


def test_sync_environment_serves_the_sync_main_loop(http_url: str) -> None:
    beta = HTTPServer("beta", http_url, headers={"X-Test": "1"})
    servers: list[ServerSpec] = [stdio("alpha", "add", "whoami"), beta]
    with MCPEnvironment(servers, tools=[shout_locally], timeout_s=20) as env:
        final = main_loop(make_agent(env), Tape(steps=[UserStep(content="go")]), env).get_final_tape()
    check_session(final)
    assert not env.running


def test_tools_are_listed_like_python_tools_with_clashes_prefixed(http_url: str) -> None:
    servers: list[ServerSpec] = [stdio("alpha", "add", "whoami", "shout"), HTTPServer("beta", http_url)]
    with MCPEnvironment(servers, timeout_s=20) as env:
        schemas = {s["function"]["name"]: s for s in env.tool_schemas()}
        infos = dict(env.mcp_tools)
    assert set(schemas) == {"add", "alpha__whoami", "beta__whoami", "alpha__shout", "beta__shout", "hang"}
    add = schemas["add"]
    assert add["type"] == "function"
    assert add["function"]["description"].startswith("Add numbers together.")
    assert add["function"]["parameters"] == {
        "type": "object",
        "properties": {"numbers": {"items": {"type": "integer"}, "type": "array"}},
        "required": ["numbers"],
    }
    assert (infos["beta__whoami"].server, infos["beta__whoami"].tool) == ("beta", "whoami")
    assert (infos["hang"].server, infos["hang"].tool) == ("beta", "hang")


def test_listed_names_rules() -> None:
    tools = [("a", "x"), ("a", "y"), ("b", "y")]
    assert listed_names(tools) == ["x", "a__y", "b__y"]
    assert listed_names(tools, taken=["x"]) == ["a__x", "a__y", "b__y"]
    assert listed_names(tools, prefix_all=True) == ["a__x", "a__y", "b__y"]
    with pytest.raises(MCPServerError, match="a__y"):
        listed_names([("a", "y"), ("b", "y"), ("c", "a__y")])


def calls(*names_args: tuple[str, dict[str, Any]]) -> Tape[Any, Any]:
    return Tape(steps=[ToolCall(name=n, arguments=a, call_id=f"c{i}") for i, (n, a) in enumerate(names_args)])


def test_errors_hangs_and_deaths_become_error_observations(http_url: str) -> None:
    async def session() -> list[ToolResult]:
        servers: list[ServerSpec] = [
            stdio("alpha", "add", "fail", "die", "pid", "hang"),
            HTTPServer("beta", http_url),
        ]
        async with MCPEnvironment(servers, timeout_s=1.5) as env:
            tape = calls(
                ("fail", {"message": "the disk is full"}),
                ("add", {"numbers": "not a list"}),
                ("alpha__hang", {}),
                ("beta__hang", {}),
                ("nonexistent", {}),
            )
            first = await env.areact(tape)
            died = await env.areact(calls(("die", {})))
            after = await env.areact(calls(("add", {"numbers": [1]}), ("whoami", {})))
            return [s for t in (first, died, after) for s in t.steps if isinstance(s, ToolResult)]

    results = asyncio.run(session())
    errors = [r.error for r in results]
    assert errors[0] == "MCP server 'alpha', tool 'fail': the disk is full"
    assert errors[1] is not None and errors[1].startswith("MCP server 'alpha', tool 'add': ")
    assert "valid list" in errors[1]
    assert errors[2] == "MCP server 'alpha', tool 'hang': no answer within 1.5 s (timed out)"
    assert errors[3] == "MCP server 'beta', tool 'hang': no answer within 1.5 s (timed out)"
    assert errors[4] is not None and errors[4].startswith("unknown tool 'nonexistent'; available tools: add")
    assert errors[5] is not None
    assert errors[5].startswith("MCP server 'alpha', tool 'die': the server closed the connection")
    assert errors[6] is not None
    assert errors[6].startswith("MCP server 'alpha', tool 'add': the server is not available")
    assert results[7].error is None and results[7].content == "beta"  # the other server is fine


def test_what_a_call_gives_back_is_what_the_guide_says() -> None:
    """docs/mcp.md, "What a call gives back", against a real server started over stdio."""
    json_text = '{"a": [1, 2]}'
    tape = calls(
        ("shout", {"text": json_text}),  # -> str: structured content {"result": ...}, unwrapped
        ("echo", {"text": json_text}),  # text only: a JSON object is parsed
        ("echo", {"text": "[1, 2]"}),
        ("echo", {"text": "{not json}"}),  # ... and text that is not JSON stays text
        ("add", {"numbers": [1, 2]}),  # a model: its structured content
        ("pid", {}),  # -> int: {"result": n}, unwrapped
        ("fail", {"message": "the disk is full"}),  # ToolError: its own message
        ("crash", {}),  # any other exception: the SDK sends no details
        ("add", {"numbers": "x"}),  # arguments that fail the schema
    )
    tools = ("shout", "echo", "add", "pid", "fail", "crash")
    with MCPEnvironment([stdio("alpha", *tools)], timeout_s=20) as env:
        results = [s for s in env.react(tape).steps if isinstance(s, ToolResult)]
    assert [r.content for r in results[:4]] == ['{"A": [1, 2]}', {"a": [1, 2]}, [1, 2], "{not json}"]
    assert results[4].content == {"total": 3, "terms": [1, 2]}
    assert isinstance(results[5].content, int) and results[5].content > 0
    assert all(r.error is None for r in results[:6])
    assert [r.content for r in results[6:]] == [None, None, None]
    assert results[6].error == "MCP server 'alpha', tool 'fail': the disk is full"
    assert results[7].error == "MCP server 'alpha', tool 'crash': Error executing tool crash"
    assert results[8].error is not None and results[8].error.startswith(
        "MCP server 'alpha', tool 'add': 1 validation error for addArguments"
    )


def test_a_dying_server_does_not_stop_the_agent() -> None:
    def dies_then_answers(prompt: Prompt) -> LLMOutput:
        if prompt.messages[-1]["role"] == "user":
            return LLMOutput(tool_calls=[ToolCallRequest(id="d", name="die", arguments="{}")])
        return LLMOutput(content=prompt.messages[-1]["content"])

    with MCPEnvironment([stdio("alpha", "die")], timeout_s=20) as env:
        agent = Agent.create(
            "helper", llms=FunctionLLM(fn=dies_then_answers), nodes=[ToolUse()], templates={"tools": []}
        )
        final = main_loop(agent, Tape(steps=[UserStep(content="go")]), env).get_final_tape()
    assert final.metadata.error is None
    assert final.steps[-2].content.startswith("Error: MCP server 'alpha', tool 'die': the server closed")


def test_servers_stop_with_the_environment_and_leave_no_process() -> None:
    async def pids() -> list[int]:
        servers = [stdio("alpha", "pid"), stdio("gamma", "pid")]
        async with MCPEnvironment(servers, timeout_s=20) as env:
            tape = await env.areact(calls(("alpha__pid", {}), ("gamma__pid", {})))
            found = [s.content for s in tape.steps if isinstance(s, ToolResult)]
            assert all(alive(p) for p in found)
            return found

    found = asyncio.run(pids())
    assert len(set(found)) == 2 and not any(alive(p) for p in found)
    env = MCPEnvironment([stdio("alpha", "pid")], timeout_s=20)
    env.start()
    pid = env.react(calls(("pid", {}))).steps[-1].content
    assert alive(pid)
    env.close()
    env.close()  # twice is fine
    assert not alive(pid) and not env.running
    with pytest.raises(RuntimeError, match="not started"):
        env.tool_schemas()


def test_a_server_that_cannot_start_is_named_and_the_others_are_stopped() -> None:
    bad = StdioServer("broken", sys.executable, ["-c", "import sys; sys.exit(2)"])
    env = MCPEnvironment([stdio("alpha", "pid"), bad], connect_timeout_s=20)
    with pytest.raises(MCPServerError, match="cannot start MCP server 'broken'"):
        env.start()
    assert not env.running
    missing = StdioServer("ghost", "/no/such/mcp-server")
    with pytest.raises(MCPServerError, match="cannot start MCP server 'ghost'"), MCPEnvironment([missing]):
        pass


def test_bad_configuration_is_named() -> None:
    with pytest.raises(ValueError, match="two MCP servers are named 'a'"):
        MCPEnvironment([stdio("a"), stdio("a")])
    with pytest.raises(ValueError, match="server name 'a b'"):
        MCPEnvironment([StdioServer("a b", "x")])
    with pytest.raises(TypeError, match="StdioServer, HTTPServer or InProcessServer"):
        MCPEnvironment(["http://x"])  # type: ignore[list-item]


def test_in_process_server() -> None:
    from tests.mcp_servers.tools_server import build

    async def session() -> ToolResult:
        async with MCPEnvironment([InProcessServer("local", build("local", {"add"}))]) as env:
            result = (await env.areact(calls(("add", {"numbers": [4, 5]})))).steps[-1]
            assert isinstance(result, ToolResult)
            return result

    assert asyncio.run(session()).content == {"total": 9, "terms": [4, 5]}
