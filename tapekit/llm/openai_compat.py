"""Any server that speaks the OpenAI chat-completions API: OpenAI, vLLM, llama.cpp, Ollama, ...

Requests go out on aiohttp (extra ``openai``): one prepared JSON body per call, the streamed
answer read as server-sent events and parsed with plain ``json`` (no SDK models on the hot
path: the openai SDK's per-request CPU capped a batch at about 300 calls/s on one core, this
path does several times that; see docs/batch.md). Retries with backoff on 408/409/429/5xx and
connection failures happen before any byte of the answer is read. Failures come out as
:class:`~tapekit.llm.LLMError` naming the endpoint and the model, with a hint where one helps.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import PrivateAttr

from tapekit.core import Prompt
from tapekit.llm._chat_stream import ChatChunkFolder, SSEDecoder, StreamError, encode_json
from tapekit.llm._http import HTTPStatusFailure, SessionPool, TransportFailure, env_proxy, open_stream
from tapekit.llm.base import LLM, LLMError, LLMEvent

OPENAI_URL = "https://api.openai.com/v1"


class OpenAICompatibleLLM(LLM):
    """A chat-completions endpoint.

    ``base_url`` is the server's ``/v1`` URL (None: ``$OPENAI_BASE_URL``, else OpenAI itself);
    ``api_key`` defaults to ``$OPENAI_API_KEY`` and is sent as a bearer token (local servers
    accept anything or nothing); ``headers`` are added to every request (they override the
    defaults); ``parameters`` are sent with every request (``temperature``, ``max_tokens``,
    ``seed``, or a server's own fields such as vLLM's ``top_k``). A prompt's ``tools`` become
    ``tools``; its ``response_schema`` becomes OpenAI's ``json_schema`` response format, or with
    ``schema_style="json_object"`` the ``{"type": "json_object", "schema": ...}`` form that
    llama-cpp-python's server understands.

    ``timeout_s`` bounds connecting and each wait for the next bytes of the answer (not the
    whole answer, which may stream for long); ``max_retries`` retries a request that failed
    before its answer began. ``max_connections`` bounds open connections (None: as many as
    calls in flight, which the batch runner bounds).

    ``return_tokens=True`` asks the server for the token ids and sampling log-probabilities of
    each call (``logprobs`` with ``top_logprobs=1``, and vLLM's ``return_token_ids``) and puts
    them on the final event's ``tokens`` (a :class:`~tapekit.llm.TokenTrace` named by
    ``tokenizer``) when the server sends both the prompt's and the output's ids (vLLM >= 0.10.2
    does); otherwise ``tokens`` stays None.
    """

    model_name: str
    base_url: str | None = None
    api_key: str | None = None
    headers: dict[str, str] = {}
    parameters: dict[str, Any] = {}
    schema_style: Literal["json_schema", "json_object"] = "json_schema"
    timeout_s: float = 120.0
    max_retries: int = 3
    max_connections: int | None = None
    return_tokens: bool = False
    tokenizer: str = ""
    _conn: _Connection | None = PrivateAttr(None)

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages."""
        return (self.base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL).rstrip("/")

    def _key(self) -> str | None:
        return self.api_key or os.environ.get("OPENAI_API_KEY") or None

    def request_headers(self) -> dict[str, str]:
        """The headers of every request: JSON in, an event stream out, the key, your ``headers``."""
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "User-Agent": "tapekit"}
        key = self._key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return {**headers, **self.headers}

    def _connection(self) -> _Connection:
        # settings can change after the first call (or in a model_copy, which shares private
        # attributes): a new connection then, never a session with stale headers or URL
        key = (self.base_url, self.api_key, tuple(self.headers.items()), self.timeout_s, self.max_connections)
        connection = self._conn
        if connection is None or connection.key != key:
            connection = self._conn = _Connection(key, self)
        return connection

    def request(self, prompt: Prompt) -> dict[str, Any]:
        """The JSON body of the chat-completions request for ``prompt`` (before streaming options)."""
        body: dict[str, Any] = {"model": self.model_name, "messages": prompt.messages, **self.parameters}
        if prompt.tools:
            body["tools"] = prompt.tools
        if prompt.response_schema is not None and self.schema_style == "json_object":
            body["response_format"] = {"type": "json_object", "schema": prompt.response_schema}
        elif prompt.response_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": prompt.response_schema},
            }
        if self.return_tokens:
            # top_logprobs 1: llama.cpp's server computes no log-probabilities at 0 and 20
            # alternatives per token when it is left out
            body.setdefault("logprobs", True)
            body.setdefault("top_logprobs", 1)
            body.setdefault("return_token_ids", True)
        return body

    def _where(self) -> str:
        return f"{self.endpoint} (model {self.model_name!r})"

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        body = {**self.request(prompt), "stream": True, "stream_options": {"include_usage": True}}
        data = encode_json(body)
        connection = self._connection()
        try:
            session = await connection.pool.get()
        except ImportError as e:
            raise LLMError(f"{self._where()}: {e}") from e
        try:
            response = await open_stream(
                session,
                connection.url,
                data,
                max_retries=self.max_retries,
                timeout_s=self.timeout_s,
                proxy=connection.proxy,
            )
        except HTTPStatusFailure as e:
            message = f"{self._where()} answered HTTP {e.status}: {e.message}{self._hint(e.status)}"
            raise LLMError(message) from e
        except TransportFailure as e:
            raise self._transport_error(e) from e
        folder = ChatChunkFolder(want_tokens=self.return_tokens)
        decoder = SSEDecoder()
        done = complete = False
        try:
            async for block in response.content.iter_any():
                # one text event per network read: chunks that arrived together go on together
                pieces = []
                for payload in decoder.feed(block):
                    if payload == b"[DONE]":
                        done = True
                        break
                    text = folder.feed(payload)
                    if text:
                        pieces.append(text)
                if pieces:
                    yield LLMEvent(chunk="".join(pieces))
                if done:
                    break
            else:
                for payload in decoder.flush():
                    if payload != b"[DONE]":
                        folder.feed(payload)
            complete = True
        except Exception as e:
            error = self._stream_failure(e)
            if error is None:
                raise
            raise error from e
        finally:
            if complete:
                response.release()
            else:
                response.close()
        if not done and not folder.finished:
            raise LLMError(
                f"{self._where()} cannot be reached or dropped the connection: "
                "the stream ended before the answer was complete"
            )
        yield folder.final_event(self.tokenizer)

    def _stream_failure(self, error: Exception) -> LLMError | None:
        """The LLMError for a failure while the answer streams (None: not a stream failure)."""
        if isinstance(error, StreamError):
            return LLMError(f"{self._where()}: {error}")
        if isinstance(error, TimeoutError | OSError) or type(error).__module__.split(".")[0] == "aiohttp":
            timed_out = isinstance(error, TimeoutError)
            return self._transport_error(TransportFailure(timed_out, f"{type(error).__name__}: {error}"))
        return None

    def _transport_error(self, failure: TransportFailure) -> LLMError:
        if failure.timed_out:
            return LLMError(f"{self._where()} did not answer within {self.timeout_s} s")
        return LLMError(f"{self._where()} cannot be reached or dropped the connection: {failure.detail}")

    def _hint(self, status: int) -> str:
        if status == 401 and self._key() is None:
            return " (no API key was given: set api_key or OPENAI_API_KEY)"
        if status == 400 and self.return_tokens:
            return (
                " (return_tokens adds logprobs and return_token_ids to the request: "
                "it needs a server that accepts them, such as vLLM >= 0.10.2)"
            )
        return _HINTS.get(status, "")

    async def aclose(self) -> None:
        """Close the HTTP session of the running event loop (the next call opens a new one)."""
        if self._conn is not None:
            await self._conn.pool.aclose()

    def __getstate__(self) -> dict[Any, Any]:
        """Pickle the settings only (a session belongs to one process and event loop)."""
        state = super().__getstate__()
        state["__pydantic_private__"] = {"_conn": None}
        return state


class _Connection:
    """The HTTP session pool and URL made from one set of an LLM's settings (``key``)."""

    __slots__ = ("key", "pool", "proxy", "url")

    def __init__(self, key: tuple[Any, ...], llm: OpenAICompatibleLLM) -> None:
        from yarl import URL

        self.key = key
        self.url = URL(llm.endpoint + "/chat/completions")
        https = self.url.scheme == "https"
        self.pool = SessionPool(llm.request_headers(), llm.timeout_s, llm.max_connections, https)
        self.proxy = env_proxy(self.url.scheme, self.url.host or "")


_HINTS = {
    401: " (check the API key)",
    403: " (the key may not have access to this model)",
    404: " (check the base URL and the model name)",
    429: " (rate limited, retries exhausted: lower the concurrency or raise max_retries)",
}
