"""OpenAICompatibleLLM against a real OpenAI-compatible server (llama-cpp-python's, SmolLM2)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from tapekit import Action, Agent, Environment, LLMStream, Node, Prompt, Step, Tape, UserStep, async_main_loop
from tapekit.llm.base import LLMError
from tapekit.llm.openai_compat import OpenAICompatibleLLM
from tapekit.store import SQLiteStore
from tests.conftest import Server, needs_local_model, start_server

pytestmark = needs_local_model

QUESTION = Prompt(
    messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
)
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def client(server: Server, **kwargs: Any) -> OpenAICompatibleLLM:
    params = {"temperature": 0.0, "max_tokens": 40, "seed": 1}
    params.update(kwargs.pop("parameters", {}))
    settings: dict[str, Any] = {
        "model_name": "smollm2",
        "base_url": server.base_url,
        "api_key": server.api_key,
        "schema_style": "json_object",
        "max_retries": 0,
    }
    return OpenAICompatibleLLM(**{**settings, **kwargs}, parameters=params)


def test_streaming_text(llama_server: Server) -> None:
    events = list(client(llama_server).stream(QUESTION))
    chunks = [e.chunk for e in events if e.chunk]
    assert len(chunks) >= 3, "the answer should arrive in several chunks"
    output = events[-1].output
    assert output is not None and output.content == "".join(chunks)
    assert "Paris" in output.content


def test_json_schema_response(llama_server: Server) -> None:
    prompt = Prompt(
        messages=[{"role": "user", "content": "The capital of France, as JSON."}], response_schema=CITY_SCHEMA
    )
    output = client(llama_server).generate(prompt)
    data = json.loads(output.content or "")
    assert set(data) == {"city"} and isinstance(data["city"], str)


def test_tool_call(llama_server: Server) -> None:
    llm = client(
        llama_server, parameters={"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    )
    prompt = Prompt(
        messages=[{"role": "user", "content": "What's the weather in Paris?"}], tools=[WEATHER_TOOL]
    )
    output = llm.generate(prompt)
    assert output.tool_calls and len(output.tool_calls) == 1
    call = output.tool_calls[0]
    assert call.name == "get_weather" and call.id
    assert isinstance(json.loads(call.arguments)["city"], str)


def test_return_tokens_on_a_server_without_ids(llama_server: Server) -> None:
    # llama-cpp-python's server accepts the token fields but sends no token ids (its logprob
    # entries carry token text only), so there is no trace rather than a guessed one
    llm = client(llama_server, return_tokens=True, tokenizer="smollm2")
    final = list(llm.stream(QUESTION))[-1]
    assert final.output is not None and "Paris" in (final.output.content or "")
    assert final.tokens is None


def test_timeout_is_a_clear_error(llama_server: Server) -> None:
    llm = client(llama_server, timeout_s=0.01, parameters={"max_tokens": 200})
    # a long prompt the server has not seen (no prompt cache to reuse): its prefill alone takes
    # far longer than 0.01 s. With the short QUESTION, cached by earlier tests, an idle machine
    # streamed the answer's tokens less than 0.01 s apart and nothing timed out.
    words = " ".join(f"item{i} weighs {i * 7 % 13} kg;" for i in range(80))
    long = Prompt(messages=[{"role": "user", "content": f"{os.urandom(8).hex()} {words} Which is heaviest?"}])
    with pytest.raises(LLMError, match=r"did not answer within 0\.01 s") as info:
        llm.generate(long)
    assert llama_server.base_url in str(info.value) and "'smollm2'" in str(info.value)


def test_bad_api_key_names_the_endpoint_and_model(llama_server: Server) -> None:
    llm = client(llama_server, api_key="wrong-key")
    with pytest.raises(LLMError, match="HTTP 401") as info:
        llm.generate(QUESTION)
    message = str(info.value)
    assert llama_server.base_url in message and "smollm2" in message and "API key" in message


def test_unreachable_server() -> None:
    llm = OpenAICompatibleLLM(model_name="m", base_url="http://127.0.0.1:9/v1", max_retries=0, timeout_s=5)
    with pytest.raises(LLMError, match="cannot be reached"):
        llm.generate(QUESTION)


class City(Action):
    kind: Literal["llmtest_city"] = "llmtest_city"
    city: str


class CityNode(Node):
    """Asks for a JSON answer and turns it into a typed step."""

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        question = tape.steps[-1].content  # type: ignore[attr-defined]
        return Prompt(messages=[{"role": "user", "content": question}], response_schema=CITY_SCHEMA)

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield City.model_validate({"kind": "llmtest_city", **json.loads(llm_stream.get_text())})


def test_an_agent_runs_on_the_server(llama_server: Server) -> None:
    agent = Agent.create(name="geo", llms=client(llama_server), nodes=[CityNode()])
    events = list(agent.run(Tape(steps=[UserStep(content="The capital of France, as JSON.")])))
    tape = events[-1].final_tape
    assert tape is not None and tape.metadata.error is None, tape and tape.metadata.error
    assert isinstance(tape.steps[-1], City)
    call = next(e.llm_call for e in events if e.llm_call is not None)
    assert call.model == "smollm2" and call.latency_s > 0
    assert call.prompt.id == tape.steps[-1].metadata.prompt_id


def test_server_killed_mid_stream(tmp_path: Path) -> None:
    server = start_server()
    store = SQLiteStore(tmp_path / "t.db")
    try:
        llm = client(server, parameters={"max_tokens": 1000, "temperature": 1.0})
        long_prompt = Prompt(
            messages=[{"role": "user", "content": "Write a very long story about a dragon."}]
        )
        agent = Agent.create(name="writer", llms=llm, nodes=[_TextNode()])

        start: Tape[Any, Any] = Tape(steps=[UserStep(content="go")])

        async def run() -> tuple[list[Any], Tape[Any, Any]]:
            seen: list[Any] = []
            final = None
            async for loop_event in async_main_loop(agent, start, Environment(), store=store):
                event = loop_event.agent_event
                if event is None:
                    continue
                seen.append(event)
                if event.chunk and sum(1 for e in seen if e.chunk) == 3:
                    server.stop()  # the server dies while it streams
                if event.final_tape is not None:
                    final = event.final_tape
            assert final is not None
            return seen, final

        _TextNode.prompt = long_prompt
        seen, tape = asyncio.run(run())
    finally:
        server.stop()
    stored = store.get_tape(start.metadata.id)
    calls = store.list_llm_calls()
    store.close()
    assert len(stored) == 1 and stored.metadata.error == tape.metadata.error  # the error, no partial step
    assert calls == []  # and no LLM call row for the broken stream
    assert tape.metadata.error is not None and "LLMError" in tape.metadata.error
    assert "dropped the connection" in tape.metadata.error or "cannot be reached" in tape.metadata.error
    assert len(tape) == 1, "no step may be made from a broken stream"
    assert not any(e.llm_call for e in seen), "a broken call must not be reported as completed"


class _TextNode(Node):
    prompt: Any = None

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return type(self).prompt

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield City(city=llm_stream.get_text()[:20])
