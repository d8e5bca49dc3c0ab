"""Decoding a streamed chat completion: server-sent events into chunks, chunks into one answer.

Pure code, no I/O: :class:`SSEDecoder` splits the bytes of a ``text/event-stream`` body into the
payloads of its ``data:`` lines, and :class:`ChatChunkFolder` folds the decoded chunks (plain
dicts, as the OpenAI chat-completions stream sends them) into text pieces, the final
:class:`~tapekit.core.LLMOutput`, the token usage and, when the server sends them, the token ids
and sampling log-probabilities of the call.

Token ids come from the fields that servers send today:

- vLLM (``return_token_ids: true``, vLLM >= 0.10.2): ``prompt_token_ids`` on the first chunk and
  ``token_ids`` on each choice delta;
- vLLM with ``return_tokens_as_token_ids``: log-probability entries whose ``token`` reads
  ``"token_id:1234"``;
- llama.cpp's ``llama-server``: an ``id`` on each log-probability entry (output ids only).

A trace is made only when both the prompt ids and the output ids arrived; anything less is no
trace (``None``), never a partial one.
"""

from __future__ import annotations

import json
from typing import Any

from tapekit.errors import TapekitError
from tapekit.llm.base import LLMEvent, StreamedOutput, TokenTrace

try:  # optional: used when installed, never required (the fallbacks give the same values)
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None  # type: ignore[assignment]


def encode_json(value: Any) -> bytes:
    """``value`` as compact JSON bytes (orjson when installed; json for what orjson refuses,
    such as lone surrogates or integers over 64 bits)."""
    if _orjson is not None:
        try:
            return _orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError
            pass
    return json.dumps(value, separators=(",", ":")).encode()


def decode_json(data: bytes | str) -> Any:
    """Parse JSON (orjson when installed; json for what orjson refuses, such as NaN, lone
    surrogate escapes or integers over 64 bits). Raises ValueError or RecursionError."""
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except ValueError:  # orjson.JSONDecodeError
            pass
    return json.loads(data)


class SSEDecoder:
    """Splits a ``text/event-stream`` body, fed in blocks of any size, into ``data:`` payloads.

    Lines may be split across blocks and may be of any length; comment lines (``: ping``) and
    other fields (``event:``, ``id:``) are skipped.
    """

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, block: bytes) -> list[bytes]:
        """The payloads of the ``data:`` lines completed by ``block``."""
        buffer = self._buffer
        buffer += block
        payloads: list[bytes] = []
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if buffer.startswith(b"data:", start):
                payloads.append(bytes(buffer[start + 5 : end]).strip())
            start = end + 1
        if start:
            del buffer[:start]
        return payloads

    def flush(self) -> list[bytes]:
        """The payload of a last ``data:`` line that had no line break after it."""
        line, self._buffer = bytes(self._buffer), bytearray()
        return [line[5:].strip()] if line.startswith(b"data:") else []


class StreamError(TapekitError, ValueError):
    """A chunk of the stream is not what the chat-completions API sends (or is an error event)."""


class ChatChunkFolder:
    """Folds the chunks of one streamed chat completion into its answer.

    Only choice 0 is read (tapekit asks for one completion per call). ``want_tokens`` also
    collects token ids and log-probabilities for :meth:`final_event`.
    """

    __slots__ = (
        "_answer",
        "_finish_reason",
        "_id_entries",
        "_logprobs",
        "_output_ids",
        "_prompt_ids",
        "_usage",
        "_want_tokens",
    )

    def __init__(self, want_tokens: bool = False) -> None:
        self._answer = StreamedOutput()
        self._usage: dict[str, Any] = {}
        self._finish_reason: str | None = None
        self._want_tokens = want_tokens
        self._prompt_ids: list[int] | None = None
        self._output_ids: list[int] = []
        self._logprobs: list[float] = []
        self._id_entries: list[int | None] = []

    @property
    def finished(self) -> bool:
        """Whether a finish reason arrived (a stream that ends without one was cut off)."""
        return self._finish_reason is not None

    def feed(self, data: bytes | str) -> str | None:
        """Read one ``data:`` payload (JSON); return the text it adds, if any."""
        try:
            chunk = decode_json(data)
        except (ValueError, RecursionError) as e:
            raise StreamError(f"a stream chunk is not JSON ({e}): {_preview(data)}") from None
        if not isinstance(chunk, dict):
            raise StreamError(f"a stream chunk is not a JSON object: {_preview(data)}")
        if "error" in chunk:
            raise StreamError(f"the server reported an error mid-stream: {_error_text(chunk['error'])}")
        usage = chunk.get("usage")
        if usage:
            self._usage = usage
        if self._want_tokens and chunk.get("prompt_token_ids") is not None:
            self._prompt_ids = _ids(chunk["prompt_token_ids"], "prompt_token_ids")
        text: str | None = None
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                self._answer.add_text(content)
                text = content if text is None else text + content
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                self._answer.add_tool_call(
                    call.get("index", 0), call.get("id"), function.get("name"), function.get("arguments")
                )
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
            if self._want_tokens:
                self._add_tokens(choice)
        return text

    def _add_tokens(self, choice: dict[str, Any]) -> None:
        if choice.get("token_ids"):
            self._output_ids += _ids(choice["token_ids"], "token_ids")
        logprobs = choice.get("logprobs")
        for entry in (logprobs or {}).get("content") or ():
            self._logprobs.append(float(entry["logprob"]))
            self._id_entries.append(_entry_id(entry))

    def tokens(self, tokenizer: str = "") -> TokenTrace | None:
        """The call's token trace, or None when the server did not send both id lists."""
        output_ids = self._output_ids
        if not output_ids and self._id_entries and None not in self._id_entries:
            output_ids = [i for i in self._id_entries if i is not None]
        if self._prompt_ids is None or not output_ids:
            return None
        logprobs = self._logprobs if len(self._logprobs) == len(output_ids) else None
        return TokenTrace(
            prompt_ids=self._prompt_ids,
            output_ids=output_ids,
            output_logprobs=logprobs,
            tokenizer=tokenizer,
            finish_reason=self._finish_reason,
        )

    def final_event(self, tokenizer: str = "") -> LLMEvent:
        """The last event of the call: the output, its token counts and (if asked) its tokens."""
        return LLMEvent(
            output=self._answer.output(),
            prompt_tokens=self._usage.get("prompt_tokens"),
            output_tokens=self._usage.get("completion_tokens"),
            tokens=self.tokens(tokenizer) if self._want_tokens else None,
        )


def _ids(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        raise StreamError(f"{field} is not a list of integers: {_preview(json.dumps(value))}")
    return value


def _entry_id(entry: dict[str, Any]) -> int | None:
    """The token id of one log-probability entry: llama.cpp's ``id``, or vLLM's ``token_id:N``."""
    if type(entry.get("id")) is int:
        return int(entry["id"])
    token = entry.get("token")
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[9:])
        except ValueError:
            return None
    return None


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def _preview(data: bytes | str, limit: int = 200) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= limit else text[:limit] + "..."
