"""Any server that speaks the OpenAI chat-completions API: OpenAI, vLLM, llama.cpp, Ollama, ...

Built on the official ``openai`` SDK (extra ``openai``), which also does the retries with
backoff on 429/5xx and connection errors. Failures come out as :class:`~tapekit.llm.LLMError`
naming the endpoint and the model.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import PrivateAttr

from tapekit.core import Prompt
from tapekit.llm.base import LLM, LLMError, LLMEvent, StreamedOutput

__all__ = ["OpenAICompatibleLLM"]


class OpenAICompatibleLLM(LLM):
    """A chat-completions endpoint.

    ``base_url`` is the server's ``/v1`` URL (None: OpenAI itself); ``api_key`` defaults to
    ``$OPENAI_API_KEY`` (local servers accept anything); ``parameters`` are sent with every
    request (``temperature``, ``max_tokens``, ``seed``, ...). A prompt's ``tools`` become
    ``tools``; its ``response_schema`` becomes OpenAI's ``json_schema`` response format, or with
    ``schema_style="json_object"`` the ``{"type": "json_object", "schema": ...}`` form that
    llama-cpp-python's server understands.
    """

    model_name: str
    base_url: str | None = None
    api_key: str | None = None
    parameters: dict[str, Any] = {}
    schema_style: Literal["json_schema", "json_object"] = "json_schema"
    timeout_s: float = 120.0
    max_retries: int = 3
    _client: Any = PrivateAttr(None)
    _client_loop: Any = PrivateAttr(None)

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages."""
        return self.base_url or "https://api.openai.com/v1"

    def _get_client(self) -> Any:
        # an async HTTP client belongs to the event loop it was made in: each sync call runs
        # its own loop, so keep one client per loop
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client_loop = loop
            try:
                import openai
            except ImportError as e:  # pragma: no cover - depends on the environment
                raise LLMError(
                    "OpenAICompatibleLLM needs the openai package: pip install 'tapekit[openai]'"
                ) from e
            self._client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self.api_key or os.environ.get("OPENAI_API_KEY") or "none",
                timeout=self.timeout_s,
                max_retries=self.max_retries,
            )
        return self._client

    def request(self, prompt: Prompt) -> dict[str, Any]:
        """The keyword arguments of the chat-completions request for ``prompt``."""
        kwargs: dict[str, Any] = {"model": self.model_name, "messages": prompt.messages, **self.parameters}
        if prompt.tools:
            kwargs["tools"] = prompt.tools
        if prompt.response_schema is not None and self.schema_style == "json_object":
            kwargs["response_format"] = {"type": "json_object", "schema": prompt.response_schema}
        elif prompt.response_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": prompt.response_schema},
            }
        return kwargs

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        import openai
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        where = f"{self.endpoint} (model {self.model_name!r})"
        client = self._get_client()
        answer = StreamedOutput()
        usage = None
        try:
            # the prepared body goes straight to the endpoint: the SDK's per-request conversion
            # of keyword arguments costs several ms of CPU, which caps a batch's calls per second
            body = {**self.request(prompt), "stream": True, "stream_options": {"include_usage": True}}
            stream = await client.post(
                "/chat/completions",
                body=body,
                cast_to=ChatCompletion,
                stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk],
            )
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta.content:
                        answer.add_text(delta.content)
                        yield LLMEvent(chunk=delta.content)
                    for tc in delta.tool_calls or []:
                        function = tc.function
                        answer.add_tool_call(
                            tc.index, tc.id, function and function.name, function and function.arguments
                        )
        except openai.APIStatusError as e:
            hint = _HINTS.get(e.status_code, "")
            raise LLMError(f"{where} answered HTTP {e.status_code}: {_message(e)}{hint}") from e
        except openai.APITimeoutError as e:
            raise LLMError(f"{where} did not answer within {self.timeout_s} s") from e
        except openai.APIConnectionError as e:
            raise LLMError(f"{where} cannot be reached or dropped the connection: {e.__cause__ or e}") from e
        except openai.OpenAIError as e:
            raise LLMError(f"{where} failed: {type(e).__name__}: {e}") from e
        except Exception as e:
            # errors while a stream is being read come straight from the HTTP library
            # (httpx for openai 1.x/2.x, httpx2 for 3.x), not wrapped by the SDK
            if type(e).__module__.split(".")[0] not in {"httpx", "httpx2", "httpcore"}:
                raise
            if "Timeout" in type(e).__name__:
                raise LLMError(f"{where} did not answer within {self.timeout_s} s") from e
            raise LLMError(
                f"{where} cannot be reached or dropped the connection: {type(e).__name__}: {e}"
            ) from e
        yield LLMEvent(
            output=answer.output(),
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            output_tokens=getattr(usage, "completion_tokens", None),
        )


_HINTS = {
    401: " (check the API key)",
    403: " (the key may not have access to this model)",
    404: " (check the base URL and the model name)",
    429: " (rate limited, retries exhausted: lower the concurrency or raise max_retries)",
}


def _message(error: Any) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return str(getattr(error, "message", error))
