"""The compact form of :class:`~tapekit.llm.base.TokenTrace` in the store's ``llm_calls`` table.

``token_data`` (BLOB in SQLite, BYTEA in PostgreSQL) holds the prompt ids and output ids as
little-endian int32, then the output log-probabilities as little-endian float32;
``token_meta`` (TEXT) is a short JSON object with the counts and the strings (tokenizer
fingerprint, policy version, finish reason). A call without ids has NULL in both.
Encoding and decoding are one ``array`` conversion each: no per-token Python work.
"""

from __future__ import annotations

import json
import sys
from array import array
from typing import Any

from tapekit.llm.base import TokenTrace

__all__ = ["decode_tokens", "encode_tokens"]

_SWAP = sys.byteorder != "little"


def _bytes(values: array[Any]) -> bytes:
    if _SWAP:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def encode_tokens(trace: TokenTrace | None) -> tuple[str | None, bytes | None]:
    """``(token_meta, token_data)`` for a trace (``(None, None)`` for none)."""
    if trace is None:
        return None, None
    ids = array("i", trace.prompt_ids)
    ids.extend(trace.output_ids)
    data = _bytes(ids)
    logprobs = trace.output_logprobs
    if logprobs is not None:
        data += _bytes(array("f", logprobs))
    meta = {
        "n_prompt": len(trace.prompt_ids),
        "n_output": len(trace.output_ids),
        "logprobs": logprobs is not None,
        "tokenizer": trace.tokenizer,
        "policy_version": trace.policy_version,
        "finish_reason": trace.finish_reason,
    }
    return json.dumps(meta, separators=(",", ":")), data


def decode_tokens(meta: str | None, data: Any) -> TokenTrace | None:
    """The trace stored as ``(token_meta, token_data)``; None when there is none."""
    if meta is None or data is None:
        return None
    info = json.loads(meta)
    n_prompt, n_output = info["n_prompt"], info["n_output"]
    raw = bytes(data)
    ids = array("i")
    ids.frombytes(raw[: 4 * (n_prompt + n_output)])
    logprobs: list[float] | None = None
    if info["logprobs"]:
        values = array("f")
        values.frombytes(raw[4 * (n_prompt + n_output) :])
        if _SWAP:
            values.byteswap()
        logprobs = values.tolist()
    if _SWAP:
        ids.byteswap()
    return TokenTrace.model_construct(
        prompt_ids=ids[:n_prompt].tolist(),
        output_ids=ids[n_prompt:].tolist(),
        output_logprobs=logprobs,
        tokenizer=info["tokenizer"],
        policy_version=info["policy_version"],
        finish_reason=info["finish_reason"],
    )
