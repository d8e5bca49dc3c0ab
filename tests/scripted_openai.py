"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests and the docs'
snippets: no model, deterministic answers, streamed like a real server.

The scripted model calls the first offered tool (each required argument filled with the first
number in the user's last message, else the message itself) until the conversation holds a tool
result, then answers in text, quoting the tool results.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["scripted_answer", "scripted_openai_server"]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}


def scripted_answer(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream of chunks (usage last) that answers a chat-completions ``request``."""
    messages = request.get("messages", [])
    users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    last_user = users[-1] if users else ""
    results = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
    tools = request.get("tools") or []
    if tools and not results:
        function = tools[0]["function"]
        number = re.search(r"\d+", last_user)
        value = number.group(0) if number else last_user
        required = function.get("parameters", {}).get("required", [])
        arguments = json.dumps({name: value for name in required})
        call = {"index": 0, "id": "call_1", "type": "function"}
        chunks = [
            _chunk({"tool_calls": [{**call, "function": {"name": function["name"], "arguments": ""}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}, "tool_calls"),
        ]
    else:
        text = f"Your order: {'; '.join(results)}." if results else f"You said: {last_user}"
        middle = len(text) // 2
        chunks = [
            _chunk({"role": "assistant", "content": text[:middle]}),
            _chunk({"content": text[middle:]}, "stop"),
        ]
    words = sum(len(str(m.get("content") or "").split()) for m in messages)
    usage = {"prompt_tokens": words, "completion_tokens": 5, "total_tokens": words + 5}
    return [
        *chunks,
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [],
            "usage": usage,
        },
    ]


class _Handler(BaseHTTPRequestHandler):
    api_key: str = ""
    requests: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        if self.api_key and self.headers.get("Authorization") != f"Bearer {self.api_key}":
            self._send(401, "application/json", json.dumps({"error": {"message": "bad key", "code": 401}}))
            return
        if not self.path.endswith("/chat/completions"):
            self._send(404, "application/json", json.dumps({"error": {"message": f"no route {self.path}"}}))
            return
        events = scripted_answer(body)
        if body.get("stream"):
            stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            self._send(200, "text/event-stream", stream)
            return
        self._send(200, "application/json", json.dumps(_whole(events)))

    def _send(self, status: int, content_type: str, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        """Quiet."""


def _whole(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The non-streamed answer the chunks add up to."""
    content, calls = "", {}
    for event in events:
        for choice in event["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(
                    call["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = call.get("id") or slot["id"]
                slot["function"]["name"] += call.get("function", {}).get("name") or ""
                slot["function"]["arguments"] += call.get("function", {}).get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": events[-1]["usage"],
    }


@contextmanager
def scripted_openai_server(api_key: str = "") -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Serve the scripted model; yield its ``/v1`` base URL and the request bodies it receives.
    With ``api_key`` every request must carry it as a bearer token (else HTTP 401)."""
    handler = type("ScriptedHandler", (_Handler,), {"api_key": api_key, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler.requests
    finally:
        server.shutdown()
        server.server_close()
