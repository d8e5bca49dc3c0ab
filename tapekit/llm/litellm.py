"""Providers without an OpenAI-compatible API, through LiteLLM (optional extra ``litellm``).

``model_name`` is a LiteLLM provider string (``anthropic/claude-...``, ``gemini/...``,
``bedrock/...``, or ``openai/NAME`` with ``api_base`` for any compatible server). LiteLLM is
imported only when the first call is made, so ``import tapekit`` stays light, and it is told to
use its bundled price table instead of fetching one from the web.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from typing import Any

from tapekit.core import Prompt
from tapekit.llm.base import LLM, LLMError, LLMEvent, StreamedOutput


class LiteLLM(LLM):
    """A model served by any provider LiteLLM supports, streamed.

    ``parameters`` go with every request (``temperature``, ``max_tokens``, ...); ``api_base``
    and ``api_key`` override the provider's defaults (keys otherwise come from the provider's
    usual environment variables).
    """

    model_name: str
    api_base: str | None = None
    api_key: str | None = None
    parameters: dict[str, Any] = {}
    timeout_s: float = 120.0
    num_retries: int = 3

    def request(self, prompt: Prompt) -> dict[str, Any]:
        """The keyword arguments of ``litellm.acompletion`` for ``prompt``."""
        kwargs: dict[str, Any] = {
            "model": self.model_name,
            "messages": prompt.messages,
            "timeout": self.timeout_s,
            "num_retries": self.num_retries,
            **self.parameters,
        }
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.api_key:
            kwargs["api_key"] = self.api_key
        if prompt.tools:
            kwargs["tools"] = prompt.tools
        if prompt.response_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": prompt.response_schema},
            }
        return kwargs

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        # LiteLLM fetches a price table from the web at import unless told to use its own copy
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            import litellm
        except ImportError as e:
            raise LLMError("the LiteLLM backend needs litellm: pip install 'tapekit[litellm]'") from e
        where = f"{self.api_base or 'the provider'} (model {self.model_name!r}, via LiteLLM)"
        answer = StreamedOutput()
        usage = None
        try:
            stream = await litellm.acompletion(
                **self.request(prompt), stream=True, stream_options={"include_usage": True}
            )
            async for chunk in stream:
                usage = getattr(chunk, "usage", None) or usage
                for choice in chunk.choices:
                    delta = choice.delta
                    if getattr(delta, "content", None):
                        answer.add_text(delta.content)
                        yield LLMEvent(chunk=delta.content)
                    for tc in getattr(delta, "tool_calls", None) or []:
                        function = tc.function
                        answer.add_tool_call(
                            tc.index or 0, tc.id, function and function.name, function and function.arguments
                        )
        except Exception as e:  # LiteLLM's errors share no base class beyond Exception
            missing = _import_failure(e)
            if missing is not None:  # raised on this machine, whatever status LiteLLM gave it
                raise LLMError(
                    f"LiteLLM failed on this machine, before reaching {where}: it could not import "
                    f"{missing} (install it, or reinstall the extra: pip install 'tapekit[litellm]')"
                ) from None
            status = getattr(e, "status_code", None)
            if status is not None:
                raise LLMError(f"{where} answered HTTP {status}: {getattr(e, 'message', e)}") from e
            raise LLMError(f"{where} failed: {type(e).__name__}: {e}") from e
        yield LLMEvent(
            output=answer.output(),
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            output_tokens=getattr(usage, "completion_tokens", None),
        )


def _import_failure(error: BaseException) -> str | None:
    """The module a local import failure inside ``error`` (or what it wraps) names, quoted; None
    if the error did not come from a failed import. LiteLLM wraps such failures as connection
    errors with status 500, which would otherwise read as the provider's answer."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ImportError):
            return repr(current.name) if current.name else f"a module ({current})"
        current = current.__cause__ or current.__context__
    found = re.search(r"No module named '([\w.]+)'", str(error))
    return repr(found.group(1)) if found else None
