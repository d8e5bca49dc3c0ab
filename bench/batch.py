"""Batch throughput against a real OpenAI-compatible endpoint over local HTTP.

A scripted chat-completions server (a bare ASGI app on uvicorn, in its own process) answers
every request after a fixed latency (``--latency-ms``, default 20) with a deterministic answer
streamed as server-sent events, token usage included.

The agent makes two LLM calls and one tool call per loop (``think``, then ``act``, whose tool
call the ``ToolEnvironment`` answers) for ``--loops`` loops per tape (default 10). For each N
in ``--ns`` (default 64, 256, 1024) the batch runs N tapes at concurrency N and prints:
wall time, LLM calls/s, tokens/s, and the ratio to the ideal, where
ideal = min(concurrency / latency, endpoint ceiling).

The **endpoint ceiling** is measured separately at the same concurrency, without an agent:
the requests of one tape's run are recorded, then sent by the same HTTP client from N workers,
one request at a time each, worker w starting at position w of the sequence so that the mix of
small (early) and large (late) requests is the batch's. It is measured before and after the
batch and averaged, since a shared VM drifts. Both also print this process's CPU time per LLM
call (``client_cpu_ms_per_call`` for the batch, ``ceiling_cpu_ms_per_call`` for the ceiling),
which other load on the machine moves much less than the wall-clock figures, and the 1-minute
load average at the end of the row. Then a sample of the tapes is run one at a time
(concurrency 1) and compared with the batch's results.

Python's garbage collector costs the batch more than the ceiling run, because the batch holds
N growing tapes that every full collection walks; ``--gc-threshold 10000,50,100`` applies
``gc.set_threshold`` to the whole run (ceiling and batch alike) to show that share.

Two clients (``--clients``):

- ``tapekit`` (default): tapekit's ``OpenAICompatibleLLM``, the real client path. Its ceiling
  sends the recorded prompts through the same ``OpenAICompatibleLLM`` (``astream``: the same
  request building, HTTP session, stream parsing and output assembly), only without the agent,
  so the ratio is what the agent and the batch runner cost on top of the client.
- ``aiohttp``: a minimal chat-completions client on aiohttp (``AiohttpChatLLM`` below, no
  retries, no error mapping), with its ceiling measured by bare aiohttp posts that read the
  whole body without parsing it: the floor of what any Python client costs.

``python bench/batch.py clients`` measures only the bare ceilings (no agent) of four clients on the
same requests: the openai SDK (``client.post`` with its chunk models, tapekit's path before),
httpx with an unbounded pool, bare aiohttp, and ``OpenAICompatibleLLM``.

    python bench/batch.py [clients] [--latency-ms 20] [--ns 64,256,1024] [--clients tapekit,aiohttp]
                          [--gc-threshold 10000,50,100] [--db PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# ----------------------------------------------------------------------------- the server


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def scripted_answer(request: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """The deterministic answer to a chat request: (content, tool calls).

    Requests that offer tools get a ``lookup`` call until the conversation holds ``loops``
    tool results, then a final answer; other requests get a short thought. Everything derives
    from the messages, so the same request always gets the same answer.
    """
    messages = request["messages"]
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
    if not request.get("tools"):
        return f"Thought {digest[:8]}: look up the next key, then check it against the task.", []
    results = sum(1 for m in messages if m.get("role") == "tool")
    loops = int(messages[0]["content"].rsplit(" ", 1)[-1])
    if results >= loops:
        return f"Final answer {digest[:8]}: all {results} keys were looked up.", []
    call = {
        "index": 0,
        "id": f"call_{digest[:12]}",
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"key": f"k{results}-{digest[:4]}"})},
    }
    return None, [call]


def sse_body(request: dict[str, Any]) -> bytes:
    """The whole streamed response: a role chunk, the content or tool call, the finish reason,
    the usage chunk and ``[DONE]``."""
    content, calls = scripted_answer(request)
    base = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": request["model"],
    }
    prompt_tokens = sum(_tokens(json.dumps(m)) for m in request["messages"])
    if content is not None:
        pieces = [content[: len(content) // 2], content[len(content) // 2 :]]
        deltas: list[dict[str, Any]] = [{"content": p} for p in pieces]
        output_tokens, finish = _tokens(content), "stop"
    else:
        deltas = [{"tool_calls": calls}]
        output_tokens, finish = _tokens(json.dumps(calls)), "tool_calls"
    chunks = [{"role": "assistant", "content": ""}, *deltas]
    events = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in chunks]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens}
    usage["total_tokens"] = prompt_tokens + output_tokens
    events.append({**base, "choices": [], "usage": usage})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def make_app(latency_s: float) -> Any:
    """A bare ASGI app: ``POST .../chat/completions`` (streaming) and ``GET .../models``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["path"].endswith("/models"):
            status, headers, payload = 200, [(b"content-type", b"application/json")], b'{"data": []}'
        elif scope["path"].endswith("/chat/completions"):
            await asyncio.sleep(latency_s)
            status, headers = 200, [(b"content-type", b"text/event-stream")]
            payload = sse_body(json.loads(body))
        else:
            status, headers, payload = 404, [(b"content-type", b"text/plain")], b"not found"
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app


def serve(port: int, latency_ms: float) -> None:
    """Run the endpoint (this is what the server process does)."""
    import importlib.util

    import uvicorn

    fast = (
        importlib.util.find_spec("httptools") is not None and importlib.util.find_spec("uvloop") is not None
    )
    uvicorn.run(
        make_app(latency_ms / 1000),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        http="httptools" if fast else "h11",
        loop="uvloop" if fast else "asyncio",
        backlog=4096,
        timeout_keep_alive=60,
    )


def start_server(latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    """Start the endpoint in its own process and wait until it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, __file__, "serve", "--port", str(port), "--latency-ms", str(latency_ms)]
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=1):
                return process, base_url
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"the bench server exited with {process.returncode}") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the bench server did not start within 30 s")


# ----------------------------------------------------------------------------- the agent

from pydantic import PrivateAttr  # noqa: E402

from tapekit import (  # noqa: E402  (after the server code: the server process needs only that)
    Agent,
    AssistantThought,
    LLMStream,
    Node,
    Prompt,
    SetNextNode,
    Step,
    StopStep,
    Tape,
    ToolEnvironment,
    UserStep,
    async_main_loop,
    tool_calls_from_output,
    view_to_messages,
)
from tapekit.batch import BatchResult, BatchStats, abatch  # noqa: E402
from tapekit.llm.base import LLM, LLMEvent, StreamedOutput  # noqa: E402
from tapekit.llm.openai_compat import OpenAICompatibleLLM  # noqa: E402


async def lookup(key: str) -> str:
    """Look a key up in the (instant) bench database.

    Args:
        key: what to look up.
    """
    return f"value of {key}"


TOOLS = ToolEnvironment([lookup])
# built once: Tool.schema() regenerates the pydantic JSON schema on every call (~0.8 ms)
TOOL_SCHEMAS = TOOLS.tool_schemas()


def _messages(agent: Agent, tape: Tape[Any, Any]) -> list[dict[str, Any]]:
    return view_to_messages(agent.compute_view(tape).top.steps, agent.full_name)


class ThinkNode(Node):
    """First LLM call of a loop: a thought about what to do next."""

    name: str = "think"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=[*_messages(agent, tape), {"role": "user", "content": "Think first."}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        yield AssistantThought(content=llm_stream.get_text())


class ActNode(Node):
    """Second LLM call: a tool call (then back to ``think``) or the final answer."""

    name: str = "act"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=_messages(agent, tape), tools=TOOL_SCHEMAS)

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        output = llm_stream.get_output()
        if output.tool_calls:
            yield SetNextNode(next_node="think")
            yield from tool_calls_from_output(output)
        else:
            yield AssistantThought(content=output.content or "")
            yield StopStep(reason="answered")


class AiohttpChatLLM(LLM):
    """A minimal streaming chat-completions client on aiohttp: no retries, no SDK models.

    For the diagnostic rows only; use ``OpenAICompatibleLLM`` for real endpoints.
    """

    base_url: str
    _session: Any = PrivateAttr(None)

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": prompt.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if prompt.tools:
            body["tools"] = prompt.tools
        answer, usage = StreamedOutput(), dict[str, Any]()
        async with self._session.post(f"{self.base_url}/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    if delta.get("content"):
                        answer.add_text(delta["content"])
                        yield LLMEvent(chunk=delta["content"])
                    for call in delta.get("tool_calls") or []:
                        function = call.get("function") or {}
                        answer.add_tool_call(
                            call["index"], call.get("id"), function.get("name"), function.get("arguments")
                        )
        yield LLMEvent(
            output=answer.output(),
            prompt_tokens=usage.get("prompt_tokens"),
            output_tokens=usage.get("completion_tokens"),
        )

    async def aclose(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def make_llm(client: str, base_url: str) -> LLM:
    """The LLM client for ``client`` ("tapekit" or "aiohttp") on the endpoint."""
    if client == "aiohttp":
        return AiohttpChatLLM(model_name="bench", base_url=base_url)
    if client != "tapekit":
        raise SystemExit(f"unknown client {client!r}: use tapekit or aiohttp")
    return OpenAICompatibleLLM(model_name="bench", base_url=base_url, api_key="bench", max_retries=0)


async def close_llm(llm: LLM) -> None:
    """Close the client's HTTP session."""
    if isinstance(llm, AiohttpChatLLM | OpenAICompatibleLLM):
        await llm.aclose()


def make_agent(llm: LLM) -> Agent:
    """The bench agent on ``llm``."""
    return Agent.create("bench", llms=llm, nodes=[ThinkNode(), ActNode()])


def make_tapes(n: int, loops: int) -> list[Tape[Any, Any]]:
    """``n`` different tasks of ``loops`` loops each (the server reads the number of loops)."""
    return [
        Tape(steps=[UserStep(content=f"Task {i}: look up the keys. loops {loops}")]).with_metadata(id=f"t{i}")
        for i in range(n)
    ]


def content(tape: Tape[Any, Any]) -> list[Any]:
    """A tape's steps without ids, for comparing runs."""
    return [(s.kind, s.llm_dict(), s.metadata.agent, s.metadata.node) for s in tape.steps]


# ----------------------------------------------------------------------------- measuring


async def run_batch(
    client: str, base_url: str, tapes: list[Tape[Any, Any]], concurrency: int, store: Any = None
) -> tuple[float, float, BatchStats, list[BatchResult]]:
    """One batch of ``tapes`` at ``concurrency``: (wall seconds, this process's CPU seconds,
    stats, results)."""
    llm = make_llm(client, base_url)
    stats = BatchStats()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    name = f"bench-{client}-{len(tapes)}-{time.time():.0f}"
    results = [
        r
        async for r in abatch(
            make_agent(llm), TOOLS, tapes, max_concurrency=concurrency, stats=stats, store=store, name=name
        )
    ]
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await close_llm(llm)
    return wall, cpu, stats, results


async def recorded_prompts(base_url: str, loops: int) -> list[Prompt]:
    """The prompts of one tape's run, in order (to replay them without the agent)."""
    llm = make_llm("tapekit", base_url)
    prompts = []
    async for event in async_main_loop(make_agent(llm), make_tapes(1, loops)[0], TOOLS):
        call = event.agent_event.llm_call if event.agent_event is not None else None
        if call is not None:
            prompts.append(call.prompt)
    await close_llm(llm)
    return prompts


async def _workers(
    concurrency: int, per_worker: int, n_requests: int, send: Callable[[int], Awaitable[None]]
) -> tuple[float, float]:
    """(calls/s, this process's CPU ms per call) when ``concurrency`` workers each send
    ``per_worker`` of the recorded requests, one at a time, worker w starting at position w:
    every position of a tape's sequence is sent equally often, so the mix of small and large
    requests is the batch's."""

    async def worker(w: int) -> None:
        for k in range(per_worker):
            await send((w + k) % n_requests)

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    calls = concurrency * per_worker
    return calls / (time.perf_counter() - t0), (time.process_time() - cpu0) * 1000 / calls


async def ceiling(
    client: str, base_url: str, prompts: list[Prompt], concurrency: int, per_worker: int
) -> tuple[float, float]:
    """The endpoint's calls/s through ``client`` alone, without the agent (streaming, usage
    included): ``tapekit`` sends each prompt through ``OpenAICompatibleLLM.astream`` and reads
    every event, ``aiohttp`` posts the same bodies with bare aiohttp and reads the raw bytes."""
    if client == "tapekit":
        llm = make_llm(client, base_url)

        async def send_tapekit(i: int) -> None:
            async for _event in llm.astream(prompts[i]):
                pass

        try:
            return await _workers(concurrency, per_worker, len(prompts), send_tapekit)
        finally:
            await close_llm(llm)
    # the bodies OpenAICompatibleLLM sends (the batch's aiohttp client sends the same fields)
    shape = OpenAICompatibleLLM(model_name="bench", base_url=base_url)
    options = {"stream": True, "stream_options": {"include_usage": True}}
    bodies = [{**shape.request(p), **options} for p in prompts]
    if client in ("httpx", "openai-sdk"):
        return await _bare_sdk_or_httpx(client, base_url, bodies, concurrency, per_worker)
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def send_aiohttp(i: int) -> None:
            async with session.post(f"{base_url}/chat/completions", json=bodies[i]) as response:
                response.raise_for_status()
                await response.read()

        return await _workers(concurrency, per_worker, len(prompts), send_aiohttp)


async def _bare_sdk_or_httpx(
    client: str, base_url: str, bodies: list[dict[str, Any]], concurrency: int, per_worker: int
) -> tuple[float, float]:
    """Bare streaming requests, each chunk parsed, through httpx (pool unbounded) or the openai
    SDK (``client.post`` with its chunk models, as tapekit's client did before aiohttp)."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    if client == "httpx":
        async with httpx.AsyncClient(limits=limits, timeout=120.0) as http:

            async def send_httpx(i: int) -> None:
                async with http.stream("POST", f"{base_url}/chat/completions", json=bodies[i]) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            json.loads(line[6:])

            return await _workers(concurrency, per_worker, len(bodies), send_httpx)
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=120.0)

    async def send_sdk(i: int) -> None:
        stream = await sdk.post(
            "/chat/completions",
            body=bodies[i],
            cast_to=ChatCompletion,
            stream=True,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )
        async for _chunk in stream:
            pass

    try:
        return await _workers(concurrency, per_worker, len(bodies), send_sdk)
    finally:
        await sdk.close()


async def compare_clients(args: argparse.Namespace) -> None:
    """``clients`` mode: the bare ceiling of each HTTP client at each N (no agent), the data
    behind the choice of aiohttp for ``OpenAICompatibleLLM``."""
    process, base_url = start_server(args.latency_ms)
    try:
        print(f"# machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
        prompts = await recorded_prompts(base_url, args.loops)
        for n in args.ns:
            per_worker = max(2, round(args.ceiling_calls / n))
            for client in ("openai-sdk", "httpx", "aiohttp", "tapekit"):
                calls_s, cpu_ms = await ceiling(client, base_url, prompts, n, per_worker)
                print(
                    f"client={client} N={n} calls_per_s={calls_s:.0f} client_cpu_ms_per_call={cpu_ms:.3f} "
                    f"load_avg_1min={os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    finally:
        process.terminate()
        process.wait(10)


async def main(args: argparse.Namespace) -> None:
    process, base_url = start_server(args.latency_ms)
    try:
        latency_s = args.latency_ms / 1000
        print(
            f"# machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"{platform.platform()}"
        )
        print(f"# endpoint: bare ASGI app on uvicorn in its own process, {args.latency_ms:g} ms per call")
        requests = await recorded_prompts(base_url, args.loops)
        calls_per_tape = len(requests)
        print(f"# agent: {calls_per_tape} LLM calls and {args.loops} tool calls per tape")
        print(f"# gc thresholds: {gc.get_threshold()} (Python's default is (700, 10, 10))")
        for client in args.clients:
            await run_batch(client, base_url, make_tapes(16, args.loops), 16)  # warm-up
            for n in args.ns:
                tapes = make_tapes(n, args.loops)
                per_worker = max(2, round(args.ceiling_calls / n))
                before, cpu_before = await ceiling(client, base_url, requests, n, per_worker)
                store = None
                if args.db:
                    from tapekit.store import open_store

                    store = open_store(args.db)
                wall, cpu, stats, results = await run_batch(client, base_url, tapes, n, store)
                if store is not None:
                    store.close()
                failed = [r for r in results if not r.ok]
                if failed:
                    raise SystemExit(f"{len(failed)} tapes failed, e.g. {failed[0].error}")
                sample = sorted(results, key=lambda r: r.index)[:: max(1, n // args.sample)][: args.sample]
                del results  # measure the second ceiling without the batch's tapes in memory
                after, cpu_after = await ceiling(client, base_url, requests, n, per_worker)  # a VM drifts
                top = (before + after) / 2
                ceiling_cpu_ms = (cpu_before + cpu_after) / 2
                batch_cpu_ms = cpu * 1000 / stats.llm_calls
                calls_s = stats.llm_calls / wall
                tokens_s = (stats.prompt_tokens + stats.output_tokens) / wall
                ideal = min(n / latency_s, top)
                *_, alone = await run_batch(client, base_url, [tapes[r.index] for r in sample], 1)
                alone.sort(key=lambda r: r.index)
                same = all(content(r.tape) == content(a.tape) for r, a in zip(sample, alone, strict=True))
                print(
                    f"client={client} N={n} concurrency={n} wall_s={wall:.2f} llm_calls={stats.llm_calls} "
                    f"llm_calls_per_s={calls_s:.0f} tokens_per_s={tokens_s:.0f} "
                    f"endpoint_ceiling_per_s={top:.0f} ideal_per_s={ideal:.0f} "
                    f"ratio_to_ideal={calls_s / ideal:.2f} "
                    f"client_cpu_ms_per_call={batch_cpu_ms:.3f} ceiling_cpu_ms_per_call={ceiling_cpu_ms:.3f} "
                    f"load_avg_1min={os.getloadavg()[0]:.1f} "
                    f"identical_to_one_at_a_time={same} ({len(sample)} tapes)",
                    flush=True,
                )
                if not same:
                    raise SystemExit("a batch result differs from the one-at-a-time run")
    finally:
        process.terminate()
        process.wait(10)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "serve", "clients"])
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256, 1024])
    parser.add_argument("--loops", type=int, default=10)
    parser.add_argument("--sample", type=int, default=8, help="tapes per N compared with a one-at-a-time run")
    parser.add_argument(
        "--gc-threshold",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        help="gc.set_threshold for the whole run, e.g. 10000,50,100 (default: Python's)",
    )
    parser.add_argument("--ceiling-calls", type=int, default=3000, help="calls per ceiling measurement")
    parser.add_argument("--clients", type=lambda s: s.split(","), default=["tapekit"])
    parser.add_argument("--db", help="also store the tapes (SQLite path or postgresql:// URL)")
    parser.add_argument("--port", type=int, default=0, help="(serve mode) the port")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = _parse(sys.argv[1:])
    if arguments.mode == "serve":
        serve(arguments.port, arguments.latency_ms)
    elif arguments.mode == "clients":
        asyncio.run(compare_clients(arguments))
    else:
        if arguments.gc_threshold:
            gc.set_threshold(*arguments.gc_threshold)
        asyncio.run(main(arguments))
