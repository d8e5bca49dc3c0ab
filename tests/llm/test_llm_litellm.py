"""LiteLLM backend: offline against a scripted chat-completions server on 127.0.0.1 (text, tool
calls, errors, a local import failure), and against the real local llama-cpp-python server where
the embedded model is installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tapekit import Prompt
from tapekit.llm.base import LLMError
from tapekit.llm.litellm import LiteLLM
from tests.conftest import Server, needs_local_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("litellm") is None, reason="needs the litellm extra")

ROOT = Path(__file__).resolve().parents[2]
QUESTION = Prompt(messages=[{"role": "user", "content": "Weather in Paris?"}])
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


# ----------------------------------------------------------------------------- a scripted server


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}


def _events(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The scripted model: a tool call when tools are offered, else a short text in two pieces."""
    if request.get("tools"):
        call = {"index": 0, "id": "call_1", "type": "function"}
        first = {**call, "function": {"name": "get_weather", "arguments": '{"city": '}}
        second = {"index": 0, "function": {"arguments": '"Paris"}'}}
        chunks = [_chunk({"tool_calls": [first]}), _chunk({"tool_calls": [second]}, "tool_calls")]
    else:
        chunks = [_chunk({"role": "assistant", "content": "Sunny "}), _chunk({"content": "today."}, "stop")]
    usage = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": []}
    return [*chunks, {**usage, "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}}]


class ScriptedChat(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions``: 401 without the right key, else the scripted stream."""

    requests: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        if self.headers.get("Authorization") != "Bearer right-key":
            payload = json.dumps({"error": {"message": "bad key", "type": "auth", "code": 401}}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        stream = "".join(f"data: {json.dumps(e)}\n\n" for e in _events(body)) + "data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(stream.encode())))
        self.end_headers()
        self.wfile.write(stream.encode())

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The scripted server's base URL and the request bodies it received."""
    handler = type("Handler", (ScriptedChat,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler.requests
    server.shutdown()
    server.server_close()


def scripted_llm(base_url: str, **kwargs: Any) -> LiteLLM:
    settings = {"model_name": "openai/m", "api_base": base_url, "api_key": "right-key", "num_retries": 0}
    return LiteLLM(**{**settings, **kwargs})


def test_streams_text_with_usage(scripted: tuple[str, list[dict[str, Any]]]) -> None:
    base_url, seen = scripted
    events = list(scripted_llm(base_url, parameters={"temperature": 0.0}).stream(QUESTION))
    assert [e.chunk for e in events if e.chunk] == ["Sunny ", "today."]
    final = events[-1]
    assert final.output is not None and final.output.content == "Sunny today."
    assert (final.prompt_tokens, final.output_tokens) == (12, 4)
    assert seen[-1]["messages"] == QUESTION.messages and seen[-1]["temperature"] == 0.0


def test_a_tool_call_streamed_in_pieces(scripted: tuple[str, list[dict[str, Any]]]) -> None:
    """The route that imports ``mcp`` inside LiteLLM (any request with tools)."""
    base_url, seen = scripted
    output = scripted_llm(base_url).generate(QUESTION.model_copy(update={"tools": [WEATHER_TOOL]}))
    assert output.tool_calls is not None and len(output.tool_calls) == 1
    assert output.tool_calls[0].name == "get_weather" and json.loads(output.tool_calls[0].arguments) == {
        "city": "Paris"
    }
    assert seen[-1]["tools"] == [WEATHER_TOOL]


def test_a_provider_error_names_the_route_and_status(scripted: tuple[str, list[dict[str, Any]]]) -> None:
    base_url, _ = scripted
    with pytest.raises(LLMError, match="401") as info:
        scripted_llm(base_url, api_key="wrong").generate(QUESTION)
    assert "openai/m" in str(info.value) and base_url in str(info.value)


def test_a_local_import_failure_is_a_short_local_error(scripted: tuple[str, list[dict[str, Any]]]) -> None:
    """An import that fails inside LiteLLM's request (``mcp``, hidden here by an import hook)
    is reported as a failure on this machine naming the package, not as the provider's HTTP 500
    that LiteLLM wraps it in. Some LiteLLM releases imported ``mcp`` for every request with tools;
    1.110 does not, so the test makes LiteLLM's OpenAI handler import it."""
    base_url, _ = scripted
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class HideMcp(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "mcp" or name.startswith("mcp."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        sys.meta_path.insert(0, HideMcp())
        import litellm.main

        def handler_that_imports_mcp(*args, **kwargs):
            import mcp  # noqa: F401

        litellm.main.openai_chat_completions.completion = handler_that_imports_mcp
        from tapekit import Prompt
        from tapekit.llm.litellm import LiteLLM
        from tests.llm.test_llm_litellm import QUESTION, WEATHER_TOOL

        llm = LiteLLM(model_name="openai/m", api_base={base_url!r}, api_key="right-key", num_retries=0)
        llm.generate(QUESTION.model_copy(update={{"tools": [WEATHER_TOOL]}}))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and last.startswith(
        "tapekit.llm.base.LLMError: LiteLLM failed on this machine"
    )
    assert "could not import 'mcp'" in last and "pip install 'tapekit[litellm]'" in last
    assert "HTTP 500" not in run.stderr


# ----------------------------------------------------------------------------- the embedded model


def llm(server: Server, **kwargs: object) -> LiteLLM:
    settings = {
        "model_name": "openai/smollm2",
        "api_base": server.base_url,
        "api_key": server.api_key,
        "parameters": {"temperature": 0.0, "max_tokens": 32},
        "num_retries": 0,
        **kwargs,
    }
    return LiteLLM(**settings)  # type: ignore[arg-type]


@needs_local_model
def test_streams_from_a_provider_route(llama_server: Server) -> None:
    events = list(
        llm(llama_server).stream(Prompt(messages=[{"role": "user", "content": "Capital of France?"}]))
    )
    chunks = [e.chunk for e in events if e.chunk]
    assert chunks and events[-1].output is not None and events[-1].output.content == "".join(chunks)


@needs_local_model
def test_errors_name_the_route(llama_server: Server) -> None:
    with pytest.raises(LLMError, match="401") as info:
        llm(llama_server, api_key="wrong").generate(Prompt(messages=[{"role": "user", "content": "hi"}]))
    assert "openai/smollm2" in str(info.value) and llama_server.base_url in str(info.value)


@needs_local_model
def test_tool_call_through_litellm(llama_server: Server) -> None:
    model = llm(
        llama_server,
        parameters={
            "temperature": 0.0,
            "max_tokens": 48,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    )
    output = model.generate(QUESTION.model_copy(update={"tools": [WEATHER_TOOL]}))
    assert output.tool_calls and output.tool_calls[0].name == "get_weather"
    assert isinstance(json.loads(output.tool_calls[0].arguments)["city"], str)
