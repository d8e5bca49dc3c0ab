"""LiteLLM backend, driven against the real local llama-cpp-python server (openai/ route)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tapekit import Prompt
from tapekit.llm.base import LLMError
from tapekit.llm.litellm import LiteLLM
from tests.conftest import Server, needs_local_model

pytestmark = [
    needs_local_model,
    pytest.mark.skipif(importlib.util.find_spec("litellm") is None, reason="needs the litellm extra"),
]


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


def test_streams_from_a_provider_route(llama_server: Server) -> None:
    events = list(
        llm(llama_server).stream(Prompt(messages=[{"role": "user", "content": "Capital of France?"}]))
    )
    chunks = [e.chunk for e in events if e.chunk]
    assert chunks and events[-1].output is not None and events[-1].output.content == "".join(chunks)


def test_errors_name_the_route(llama_server: Server) -> None:
    with pytest.raises(LLMError, match="401") as info:
        llm(llama_server, api_key="wrong").generate(Prompt(messages=[{"role": "user", "content": "hi"}]))
    assert "openai/smollm2" in str(info.value) and llama_server.base_url in str(info.value)


@pytest.mark.skipif(
    importlib.util.find_spec("mcp") is None,
    reason="LiteLLM's tool-call path imports the 'mcp' package, which litellm does not declare",
)
def test_tool_call_through_litellm(llama_server: Server) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    model = llm(
        llama_server,
        parameters={
            "temperature": 0.0,
            "max_tokens": 48,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    )
    output = model.generate(Prompt(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[tool]))
    assert output.tool_calls and output.tool_calls[0].name == "get_weather"
    assert isinstance(json.loads(output.tool_calls[0].arguments)["city"], str)
