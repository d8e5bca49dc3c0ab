"""OpenAICompatibleLLM on the wire: a scripted chat-completions server (aiohttp, 127.0.0.1) answers
each request with the bytes a test gives it, so stream parsing, tool-call deltas, usage, token
ids, error statuses, retries, timeouts and the error hints are tested without a model."""

from __future__ import annotations

import asyncio
import gc
import json
import pickle
import socket
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402

from tapekit import Agent, AssistantThought, LLMStream, Node, Prompt, Step, Tape, UserStep  # noqa: E402
from tapekit.llm._chat_stream import ChatChunkFolder, SSEDecoder, StreamError  # noqa: E402
from tapekit.llm.base import LLMError, LLMEvent  # noqa: E402
from tapekit.llm.openai_compat import OpenAICompatibleLLM  # noqa: E402

QUESTION = Prompt(messages=[{"role": "user", "content": "Hi?"}])


# ----------------------------------------------------------------------------- the scripted server


@dataclass
class Reply:
    """One scripted answer: a status and body, or a 200 event stream written block by block."""

    status: int = 200
    blocks: list[bytes] = field(default_factory=list)
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before the status line
    gap_s: float = 0.02  # between blocks, so each arrives in its own network read
    stall_s: float = 0.0  # after the blocks, before the end
    drop: bool = False  # close the connection instead of ending the stream


@dataclass
class Seen:
    """A request the server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class WireServer:
    """An aiohttp server in its own thread and event loop, answering from ``replies`` in order."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[Seen] = []
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.SockSite(self.runner, sock).start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Seen(request.path, dict(request.headers), json.loads(body)))
        reply = self.replies.pop(0) if self.replies else Reply(blocks=[sse(text_chunk("ok", "stop"))])
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status != 200:
            return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **reply.headers})
        await response.prepare(request)
        for block in reply.blocks:
            await response.write(block)
            await asyncio.sleep(reply.gap_s)
        if reply.stall_s:
            await asyncio.sleep(reply.stall_s)
        if reply.drop:
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()
        return response

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def server() -> Iterator[WireServer]:
    wire = WireServer()
    yield wire
    wire.close()


@pytest.fixture
def wire(server: WireServer) -> WireServer:
    server.replies.clear()
    server.requests.clear()
    return server


def sse(*events: dict[str, Any] | str) -> bytes:
    """Server-sent events: each dict as one ``data:`` line, a string as it is."""
    lines = [e if isinstance(e, str) else "data: " + json.dumps(e) + "\n\n" for e in events]
    return "".join(lines).encode()


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> dict[str, Any]:
    """One chat.completion.chunk with one choice."""
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice], **top}


def text_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return chunk({"content": text}, finish)


USAGE = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}
DONE = "data: [DONE]\n\n"


def llm(server: WireServer, **kwargs: Any) -> OpenAICompatibleLLM:
    settings: dict[str, Any] = {"model_name": "m", "base_url": server.base_url, "api_key": "k"}
    return OpenAICompatibleLLM(**{**settings, "max_retries": 0, **kwargs})


# ----------------------------------------------------------------------------- streaming


def test_text_streams_in_pieces_with_usage(wire: WireServer) -> None:
    wire.replies.append(
        Reply(
            blocks=[
                sse(chunk({"role": "assistant", "content": ""})),
                sse(text_chunk("Paris is ")),
                sse(text_chunk("the capital.")),
                sse(chunk(finish="stop"), USAGE, DONE),
            ]
        )
    )
    events = list(llm(wire, parameters={"temperature": 0.0}).stream(QUESTION))
    assert [e.chunk for e in events if e.chunk] == ["Paris is ", "the capital."]
    final = events[-1]
    assert final.output is not None and final.output.content == "Paris is the capital."
    assert final.output.tool_calls is None
    assert (final.prompt_tokens, final.output_tokens) == (11, 3)
    assert final.tokens is None
    seen = wire.requests[0]
    assert seen.path == "/v1/chat/completions"
    assert seen.body == {
        "model": "m",
        "messages": QUESTION.messages,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert seen.headers["Authorization"] == "Bearer k"
    assert seen.headers["Content-Type"] == "application/json"


def test_sse_lines_split_across_reads_crlf_and_comments(wire: WireServer) -> None:
    whole = sse(": keep-alive\n\n", text_chunk("héllo "), "event: message\n", text_chunk("wörld", "stop"))
    whole = whole.replace(b"\n\n", b"\r\n\r\n", 1)
    whole += b"data:" + json.dumps(USAGE).encode() + b"\n\n" + DONE.encode()
    cut = len(whole) // 3
    wire.replies.append(Reply(blocks=[whole[:cut], whole[cut : 2 * cut], whole[2 * cut :]]))
    event = list(llm(wire).stream(QUESTION))[-1]
    assert event.output is not None and event.output.content == "héllo wörld"
    assert event.prompt_tokens == 11


def test_tool_call_deltas_across_chunks(wire: WireServer) -> None:
    def call(index: int, **parts: Any) -> dict[str, Any]:
        function = {k: v for k, v in parts.items() if k in ("name", "arguments")}
        delta: dict[str, Any] = {"index": index, "function": function}
        if "id" in parts:
            delta.update(id=parts["id"], type="function")
        return chunk({"tool_calls": [delta]})

    wire.replies.append(
        Reply(
            blocks=[
                sse(call(0, id="call_a", name="get_weather", arguments="")),
                sse(call(1, id="call_b", name="get_time", arguments='{"tz"')),
                sse(call(0, arguments='{"city": "Pa'), call(0, arguments='ris"}')),
                sse(call(1, arguments=': "CET"}')),
                sse(chunk(finish="tool_calls"), USAGE, DONE),
            ]
        )
    )
    output = llm(wire).generate(QUESTION)
    assert output.content is None
    assert output.tool_calls is not None
    calls = [(c.id, c.name, json.loads(c.arguments)) for c in output.tool_calls]
    assert calls == [("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_time", {"tz": "CET"})]


def test_tools_and_both_schema_styles_in_the_request(wire: WireServer) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    prompt = Prompt(messages=QUESTION.messages, tools=[tool], response_schema=schema)
    llm(wire).generate(prompt)
    llm(wire, schema_style="json_object").generate(prompt)
    first, second = (r.body for r in wire.requests)
    assert first["tools"] == [tool] and second["tools"] == [tool]
    named = {"name": "response", "schema": schema}
    assert first["response_format"] == {"type": "json_schema", "json_schema": named}
    assert second["response_format"] == {"type": "json_object", "schema": schema}


def test_api_key_from_the_environment_and_custom_headers(
    wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    llm(wire, api_key=None, headers={"X-Team": "blue", "User-Agent": "mine"}).generate(QUESTION)
    headers = wire.requests[0].headers
    assert headers["Authorization"] == "Bearer from-env"
    assert headers["X-Team"] == "blue" and headers["User-Agent"] == "mine"


def test_text_that_arrives_in_one_read_is_one_event(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=[sse(text_chunk("a"), text_chunk("b"), text_chunk("c", "stop"), DONE)]))
    events = list(llm(wire).stream(QUESTION))
    assert [e.chunk for e in events if e.chunk] == ["abc"]
    assert events[-1].output is not None and events[-1].output.content == "abc"


def test_a_stream_without_done_but_finished_is_complete(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=[sse(text_chunk("fine", "stop"))]))
    assert llm(wire).generate(QUESTION).content == "fine"


def test_a_very_long_sse_line(wire: WireServer) -> None:
    big = "x" * 400_000  # longer than aiohttp's line limit: lines are split by tapekit itself
    wire.replies.append(Reply(blocks=[sse(text_chunk(big, "stop"), DONE)]))
    assert llm(wire).generate(QUESTION).content == big


# ----------------------------------------------------------------------------- errors and retries


def test_401_names_endpoint_model_and_the_key(wire: WireServer) -> None:
    body = json.dumps({"error": {"message": "Invalid API Key", "type": "invalid_request_error"}}).encode()
    wire.replies.append(Reply(status=401, body=body))
    with pytest.raises(LLMError) as info:
        llm(wire).generate(QUESTION)
    message = str(info.value)
    assert "HTTP 401: Invalid API Key" in message and "check the API key" in message
    assert wire.base_url in message and "'m'" in message


def test_401_without_any_key_says_so(wire: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    wire.replies.append(Reply(status=401, body=b'{"detail": "missing key"}'))
    with pytest.raises(LLMError, match=r"HTTP 401: missing key \(no API key was given") as info:
        llm(wire, api_key=None).generate(QUESTION)
    assert "Authorization" not in wire.requests[0].headers
    assert "OPENAI_API_KEY" in str(info.value)


def test_404_hint_and_no_retry_on_client_errors(wire: WireServer) -> None:
    wire.replies += [Reply(status=404, body=b"no such model"), Reply(status=400, body=b"bad")]
    with pytest.raises(LLMError, match=r"HTTP 404: no such model \(check the base URL and the model name\)"):
        llm(wire, max_retries=3).generate(QUESTION)
    with pytest.raises(LLMError, match="HTTP 400: bad"):
        llm(wire, max_retries=3).generate(QUESTION)
    assert len(wire.requests) == 2, "4xx other than 408/409/429 are not retried"


def test_429_and_500_are_retried_then_succeed(wire: WireServer) -> None:
    fast = {"retry-after-ms": "1"}
    wire.replies += [
        Reply(status=429, body=b'{"error": "slow down"}', headers=fast),
        Reply(status=500, body=b"boom", headers=fast),
        Reply(status=503, body=b"busy", headers={"retry-after": "0"}),
        Reply(blocks=[sse(text_chunk("made it", "stop"), USAGE, DONE)]),
    ]
    assert llm(wire, max_retries=3).generate(QUESTION).content == "made it"
    assert len(wire.requests) == 4
    assert all(r.body == wire.requests[0].body for r in wire.requests), "a retry resends the same body"


def test_429_when_retries_run_out(wire: WireServer) -> None:
    fast = {"retry-after-ms": "1"}
    wire.replies += [Reply(status=429, body=b'{"error": "slow down"}', headers=fast) for _ in range(2)]
    with pytest.raises(LLMError, match=r"HTTP 429: slow down \(rate limited, retries exhausted"):
        llm(wire, max_retries=1).generate(QUESTION)
    assert len(wire.requests) == 2


def test_timeout_before_the_answer_is_retried_then_reported(wire: WireServer) -> None:
    wire.replies += [Reply(delay_s=1.0), Reply(delay_s=1.0)]
    with pytest.raises(LLMError, match=r"did not answer within 0\.2 s") as info:
        llm(wire, timeout_s=0.2, max_retries=1).generate(QUESTION)
    assert wire.base_url in str(info.value) and "'m'" in str(info.value)
    assert len(wire.requests) == 2


def test_a_stream_that_stalls_times_out(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=[sse(text_chunk("start"))], stall_s=1.0))
    seen: list[LLMEvent] = []
    with pytest.raises(LLMError, match=r"did not answer within 0\.2 s"):
        for event in llm(wire, timeout_s=0.2, max_retries=2).stream(QUESTION):
            seen.append(event)
    assert [e.chunk for e in seen] == ["start"] and len(wire.requests) == 1, "no retry once text arrived"


def test_a_dropped_stream_is_an_error_not_an_output(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=[sse(text_chunk("half an an"))], drop=True))
    events: list[LLMEvent] = []
    with pytest.raises(LLMError, match="dropped the connection"):
        for event in llm(wire).stream(QUESTION):
            events.append(event)
    assert all(e.output is None for e in events)


def test_a_stream_that_ends_unfinished_is_an_error(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=[sse(text_chunk("no finish reason"))]))
    with pytest.raises(LLMError, match="ended before the answer was complete"):
        llm(wire).generate(QUESTION)


def test_an_error_event_mid_stream(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=[sse(text_chunk("a"), {"error": {"message": "engine died"}})]))
    with pytest.raises(LLMError, match="error mid-stream: engine died") as info:
        llm(wire).generate(QUESTION)
    assert wire.base_url in str(info.value)


def test_a_malformed_chunk(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=[b"data: {not json\n\n"]))
    with pytest.raises(LLMError, match=r"a stream chunk is not JSON .*\{not json"):
        llm(wire).generate(QUESTION)


def test_unreachable_server() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    client = OpenAICompatibleLLM(model_name="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1)
    with pytest.raises(LLMError, match=f"127.0.0.1:{port}/v1 \\(model 'm'\\) cannot be reached"):
        client.generate(QUESTION)


# ----------------------------------------------------------------------------- sessions


def test_sync_calls_on_fresh_loops_leave_no_open_session(wire: WireServer) -> None:
    client = llm(wire)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert client.generate(QUESTION).content == "ok"
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)], [str(w.message) for w in caught]


def test_concurrent_calls_share_one_session_and_pickle_drops_it(wire: WireServer) -> None:
    client = llm(wire)

    async def many() -> list[str | None]:
        outputs = await asyncio.gather(*(client.agenerate(QUESTION) for _ in range(20)))
        await client.aclose()
        return [o.content for o in outputs]

    assert asyncio.run(many()) == ["ok"] * 20
    copy = pickle.loads(pickle.dumps(client))
    assert copy.model_dump() == client.model_dump()
    assert copy.generate(QUESTION).content == "ok"


def test_one_client_used_from_two_threads_at_once(wire: WireServer) -> None:
    client = llm(wire)
    results: list[list[str | None]] = []

    async def many() -> list[str | None]:
        outputs = await asyncio.gather(*(client.agenerate(QUESTION) for _ in range(10)))
        return [o.content for o in outputs]

    def run() -> None:
        for _ in range(3):  # each asyncio.run is a fresh loop in this thread
            results.append(asyncio.run(many()))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [["ok"] * 10] * 6
    pool = client._connection().pool
    assert pool._sessions == {}, "every loop's session was closed when its loop shut down"


def test_a_copy_with_other_settings_uses_them(wire: WireServer) -> None:
    client = llm(wire)
    assert client.generate(QUESTION).content == "ok"
    other = client.model_copy(update={"api_key": "second", "headers": {"X-Copy": "1"}})
    assert other.generate(QUESTION).content == "ok"
    client.api_key = "third"
    assert client.generate(QUESTION).content == "ok"
    keys = [(r.headers["Authorization"], r.headers.get("X-Copy")) for r in wire.requests]
    assert keys == [("Bearer k", None), ("Bearer second", "1"), ("Bearer third", None)]


def test_proxy_from_the_environment(wire: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", wire.base_url.removesuffix("/v1"))  # the wire server proxies
    remote = llm(wire, base_url="http://models.example.invalid/v1")
    assert remote.generate(QUESTION).content == "ok"
    assert wire.requests[-1].headers["Host"] == "models.example.invalid"
    monkeypatch.setenv("NO_PROXY", "models.example.invalid")
    bypassed = llm(wire, base_url="http://models.example.invalid/v1", timeout_s=5)
    with pytest.raises(LLMError, match="cannot be reached"):
        bypassed.generate(QUESTION)


# ----------------------------------------------------------------------------- token ids


def vllm_stream(prompt_ids: list[int], pieces: list[tuple[str, list[int], list[float]]]) -> list[bytes]:
    """A vLLM-shaped stream with ``return_token_ids`` and ``logprobs``: prompt ids on the first
    chunk, each piece's ids and log-probabilities on its choice."""
    first = chunk({"role": "assistant", "content": ""}, prompt_token_ids=prompt_ids)
    blocks = [sse(first)]
    for i, (text, ids, logprobs) in enumerate(pieces):
        entries: list[dict[str, Any]] = [
            {"token": f"t{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(ids, logprobs, strict=True)
        ]
        event = chunk({"content": text}, "stop" if i == len(pieces) - 1 else None)
        event["choices"][0].update(token_ids=ids, logprobs={"content": entries})
        blocks.append(sse(event))
    blocks.append(sse(USAGE, DONE))
    return blocks


def test_vllm_token_ids_and_logprobs(wire: WireServer) -> None:
    pieces = [("Hel", [10], [-0.5]), ("lo", [11, 12], [-0.25, 0.0])]
    wire.replies.append(Reply(blocks=vllm_stream([1, 2, 3], pieces)))
    final = list(llm(wire, return_tokens=True, tokenizer="tk1-test").stream(QUESTION))[-1]
    assert final.output is not None and final.output.content == "Hello"
    assert final.tokens is not None
    assert final.tokens.prompt_ids == [1, 2, 3]
    assert final.tokens.output_ids == [10, 11, 12]
    assert final.tokens.output_logprobs == [-0.5, -0.25, 0.0]
    assert final.tokens.tokenizer == "tk1-test" and final.tokens.finish_reason == "stop"
    body = wire.requests[0].body
    assert body["logprobs"] is True and body["top_logprobs"] == 1 and body["return_token_ids"] is True


def test_vllm_token_ids_as_logprob_strings(wire: WireServer) -> None:
    entries = [{"token": "token_id:42", "logprob": -1.0}, {"token": "token_id:7", "logprob": -2.0}]
    event = chunk({"content": "ab"}, "stop", prompt_token_ids=[5])
    event["choices"][0]["logprobs"] = {"content": entries}
    wire.replies.append(Reply(blocks=[sse(event, DONE)]))
    tokens = list(llm(wire, return_tokens=True).stream(QUESTION))[-1].tokens
    assert tokens is not None and tokens.output_ids == [42, 7] and tokens.output_logprobs == [-1.0, -2.0]


def test_no_prompt_ids_means_no_trace(wire: WireServer) -> None:
    # llama.cpp's server: output ids on the logprob entries, but no prompt ids
    event = chunk({"content": "ab"}, "stop")
    event["choices"][0]["logprobs"] = {"content": [{"id": 4, "token": "ab", "logprob": -0.1}]}
    wire.replies.append(Reply(blocks=[sse(event, DONE)]))
    final = list(llm(wire, return_tokens=True).stream(QUESTION))[-1]
    assert final.output is not None and final.output.content == "ab" and final.tokens is None


def test_without_return_tokens_nothing_is_asked_or_kept(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=vllm_stream([1], [("x", [9], [-0.1])])))
    final = list(llm(wire).stream(QUESTION))[-1]
    assert final.tokens is None
    assert not {"logprobs", "top_logprobs", "return_token_ids"} & set(wire.requests[0].body)


def test_a_server_that_refuses_the_token_fields_gets_a_hint(wire: WireServer) -> None:
    wire.replies.append(Reply(status=400, body=b'{"error": {"message": "Unrecognized request argument"}}'))
    with pytest.raises(LLMError, match=r"Unrecognized request argument \(return_tokens adds logprobs"):
        llm(wire, return_tokens=True).generate(QUESTION)


class _SayNode(Node):
    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return QUESTION

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield AssistantThought(content=llm_stream.get_text())


def test_the_agent_records_the_tokens_on_its_llm_call(wire: WireServer) -> None:
    wire.replies.append(Reply(blocks=vllm_stream([1, 2], [("Hi", [30, 31], [-0.1, -0.2])])))
    agent = Agent.create("say", llms=llm(wire, return_tokens=True, tokenizer="tk1-x"), nodes=[_SayNode()])
    events = list(agent.run(Tape(steps=[UserStep(content="go")])))
    call = next(e.llm_call for e in events if e.llm_call is not None)
    assert call.output.content == "Hi"
    assert call.tokens is not None and call.tokens.prompt_ids == [1, 2] and call.tokens.output_ids == [30, 31]
    assert call.tokens.tokenizer == "tk1-x"


# ----------------------------------------------------------------------------- the pure parts


def test_sse_decoder_keeps_partial_lines() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a"') == []
    assert decoder.feed(b": 1}\n\ndata:[DO") == [b'{"a": 1}']
    assert decoder.feed(b"NE]\n") == [b"[DONE]"]
    assert decoder.feed(b"data: tail") == [] and decoder.flush() == [b"tail"]


def test_chunk_folder_rejects_bad_chunks() -> None:
    folder = ChatChunkFolder(want_tokens=True)
    with pytest.raises(StreamError, match="not a JSON object"):
        folder.feed(b"[1, 2]")
    with pytest.raises(StreamError, match="prompt_token_ids is not a list of integers"):
        folder.feed(json.dumps(chunk(prompt_token_ids=["a"])))
    with pytest.raises(StreamError, match="not JSON"):
        folder.feed(b"[" * 100_000)
