"""The compact form of :class:`~tapekit.llm.base.TokenTrace` in the store's ``llm_calls`` table.

``token_data`` (BLOB in SQLite, BYTEA in PostgreSQL) holds the prompt ids and output ids as
little-endian unsigned 16-bit integers when every id fits (vocabularies of up to 65,536 tokens)
and as little-endian int32 otherwise, then the output log-probabilities as little-endian
float32; ``token_meta`` (TEXT) is a short JSON object with the counts, the width of an id
(``id_bytes``: 2 or 4; rows written before it existed have int32 ids and no such key) and the
strings (tokenizer fingerprint, policy version, finish reason). A call without ids has NULL in
both. Encoding is one ``struct.pack`` of the ids (about twice as fast as filling an ``array``
from a list) and decoding one ``array`` conversion: no per-token Python work.

A call saved now keeps its prompt ids as prompt parts (``_prompts.py``: a conversation's calls,
whose prompt ids grow turn by turn, share them): ``token_meta`` then has a ``prompt_node`` key
naming their last node (null for no ids) and ``token_data`` holds the output ids and the
log-probabilities only (:func:`encode_tokens_apart`). Rows without that key hold the prompt ids
in ``token_data`` (:func:`encode_tokens`, the earlier form) and read as before.
"""

from __future__ import annotations

import base64
import json
import struct
import sys
from array import array
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from tapekit.llm.base import TokenTrace

_SWAP = sys.byteorder != "little"
_ID_TYPES = {2: "H", 4: "i"}  # id_bytes -> array typecode


def _bytes(values: array[Any]) -> bytes:
    if _SWAP:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def ids_body(ids: Sequence[int]) -> str:
    """A prompt part's body for token ids: ``t2:`` or ``t4:`` (little-endian uint16 when every
    id fits, else int32) and the bytes in base64 (no newline, and never starts like JSON); a
    ``ValueError`` for an id that fits neither."""
    try:
        return "t2:" + base64.b64encode(struct.pack(f"<{len(ids)}H", *ids)).decode()
    except struct.error:
        pass
    try:
        return "t4:" + base64.b64encode(struct.pack(f"<{len(ids)}i", *ids)).decode()
    except struct.error as e:
        raise ValueError(f"its token ids cannot be stored: every id must be an int32 ({e})") from None


def ids_of(node: str | None, parts: Mapping[str, tuple[str | None, str]], n: int) -> list[int]:
    """The ``n`` token ids that end with the prompt part ``node`` (None: none), from ``parts``
    (``{hash: (prev, body)}``)."""
    chunks: list[str] = []
    try:
        while node is not None:
            node, body = parts[node]
            chunks.append(body)
    except KeyError as e:
        raise LookupError(f"stored token ids refer to the part {e.args[0]} which the store lacks") from None
    out: list[int] = []
    for body in reversed(chunks):
        values = array("H" if body.startswith("t2:") else "i")
        values.frombytes(base64.b64decode(body[3:]))
        if _SWAP:
            values.byteswap()
        out.extend(values)
    if len(out) != n:
        raise LookupError(f"stored token ids: {len(out)} prompt ids, not {n}")
    return out


def _pack_ids(trace: TokenTrace) -> tuple[int, bytes]:
    """The prompt ids then the output ids, little-endian: ``(2, uint16 bytes)`` when they all
    fit, else ``(4, int32 bytes)``; a ``ValueError`` for an id that fits neither."""
    n = len(trace.prompt_ids) + len(trace.output_ids)
    try:
        return 2, struct.pack(f"<{n}H", *trace.prompt_ids, *trace.output_ids)
    except struct.error:  # an id >= 65,536 (or negative)
        pass
    try:
        return 4, struct.pack(f"<{n}i", *trace.prompt_ids, *trace.output_ids)
    except struct.error as e:
        raise ValueError(f"its token ids cannot be stored: every id must be an int32 ({e})") from None


@lru_cache(maxsize=256)
def _meta_tail(tokenizer: str | None, policy_version: str | None, finish_reason: str | None) -> str:
    """The strings of ``token_meta`` as the end of its JSON object (they repeat from call to
    call, so they are encoded once)."""
    strings = {"tokenizer": tokenizer, "policy_version": policy_version, "finish_reason": finish_reason}
    return json.dumps(strings, separators=(",", ":"))[1:]


def encode_tokens(trace: TokenTrace | None) -> tuple[str | None, bytes | None]:
    """``(token_meta, token_data)`` for a trace (``(None, None)`` for none); a ``ValueError``
    for an id outside int32, which the stored form cannot hold."""
    if trace is None:
        return None, None
    width, data = _pack_ids(trace)
    logprobs = trace.output_logprobs
    if logprobs is not None:
        data += _bytes(array("f", logprobs))
    meta = (
        f'{{"n_prompt":{len(trace.prompt_ids)},"n_output":{len(trace.output_ids)},'
        f'"logprobs":{"true" if logprobs is not None else "false"},"id_bytes":{width},'
        + _meta_tail(trace.tokenizer, trace.policy_version, trace.finish_reason)
    )
    return meta, data


def encode_tokens_apart(trace: TokenTrace) -> Callable[[str | None], tuple[str, bytes]]:
    """``trace``'s output ids checked and packed now (a ``ValueError`` for an id outside
    int32), and the function that makes its ``(token_meta, token_data)`` once its prompt ids
    are stored as prompt parts ending at a node (``_prompts.py``): then ``token_meta`` has the
    ``prompt_node`` key and ``token_data`` holds the output ids (and log-probabilities) only, so
    a conversation's calls, whose prompt ids grow turn by turn, do not store them again."""
    try:
        width, data = 2, struct.pack(f"<{len(trace.output_ids)}H", *trace.output_ids)
    except struct.error:
        try:
            width, data = 4, struct.pack(f"<{len(trace.output_ids)}i", *trace.output_ids)
        except struct.error as e:
            raise ValueError(f"its token ids cannot be stored: every id must be an int32 ({e})") from None
    logprobs = trace.output_logprobs
    if logprobs is not None:
        data += _bytes(array("f", logprobs))

    def finish(prompt_node: str | None) -> tuple[str, bytes]:
        meta = (
            f'{{"n_prompt":{len(trace.prompt_ids)},"n_output":{len(trace.output_ids)},'
            f'"logprobs":{"true" if logprobs is not None else "false"},"id_bytes":{width},'
            f'"prompt_node":{json.dumps(prompt_node)},'
            + _meta_tail(trace.tokenizer, trace.policy_version, trace.finish_reason)
        )
        return meta, data

    return finish


def prompt_node_of(meta: str | None) -> str | None:
    """The node of the prompt ids that ``token_meta`` refers to (None: the ids are in
    ``token_data``, or there are none)."""
    if meta is None or '"prompt_node":"' not in meta:
        return None
    node: str | None = json.loads(meta).get("prompt_node")
    return node


def decode_tokens(
    meta: str | None, data: Any, parts: Mapping[str, tuple[str | None, str]] | None = None
) -> TokenTrace | None:
    """The trace stored as ``(token_meta, token_data)``; None when there is none. With a
    ``prompt_node`` in ``token_meta``, the prompt ids come from ``parts`` (``{hash: (prev,
    body)}``, see ``_prompts.py``)."""
    if meta is None or data is None:
        return None
    info = json.loads(meta)
    n_prompt, n_output = info["n_prompt"], info["n_output"]
    apart = "prompt_node" in info
    prompt_ids: list[int] | None = None
    if apart:
        prompt_ids = ids_of(info["prompt_node"], parts or {}, n_prompt)
        n_prompt = 0
    width = info.get("id_bytes", 4)
    if width not in _ID_TYPES:
        raise ValueError(f"token_meta has id_bytes={width!r}; expected 2 or 4")
    raw = bytes(data)
    n_ids = width * (n_prompt + n_output)
    ids = array(_ID_TYPES[width])
    ids.frombytes(raw[:n_ids])
    logprobs: list[float] | None = None
    if info["logprobs"]:
        values = array("f")
        values.frombytes(raw[n_ids:])
        if _SWAP:
            values.byteswap()
        logprobs = values.tolist()
    if _SWAP:
        ids.byteswap()
    return TokenTrace.model_construct(
        prompt_ids=ids[:n_prompt].tolist() if prompt_ids is None else prompt_ids,
        output_ids=ids[n_prompt:].tolist(),
        output_logprobs=logprobs,
        tokenizer=info["tokenizer"],
        policy_version=info["policy_version"],
        finish_reason=info["finish_reason"],
    )
