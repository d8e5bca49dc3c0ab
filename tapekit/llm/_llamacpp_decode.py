"""LlamaCppLLM's decoding loop: the chat-template prompt tokenised once, then token by token
through ``Llama.generate`` with llama-cpp-python's own chat-completion sampler settings, so that
the ids fed and sampled (and their log-probabilities) are known exactly.

Prompt-prefix reuse: llama.cpp keeps the KV cache between calls, so a prompt that starts like the
previous prompt only needs its new suffix evaluated. llama.cpp computes a token's keys and values
identically whether its batch holds 2 or 200 tokens, but not when the batch holds one token (the
sampling loop feeds the sampled tokens one at a time). So only positions that were evaluated as
part of a prompt (a batch) are reused, and the suffix fed is always at least 2 tokens: the logits
and the cache are then bit for bit those of a cold evaluation of the whole prompt
(tests/llm/test_llamacpp_reuse.py checks this on real prompts).
"""

from __future__ import annotations

import codecs
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tapekit.core import Prompt
from tapekit.llm.base import LLMError, StreamedOutput

# llama-cpp-python's create_chat_completion defaults (kept so outputs do not change)
_DEFAULTS: dict[str, Any] = {
    "temperature": 0.2,
    "top_p": 0.95,
    "top_k": 40,
    "min_p": 0.05,
    "typical_p": 1.0,
    "repeat_penalty": 1.1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "max_tokens": None,
    "seed": None,
}
_PENALTY_WINDOW = 64  # Llama.last_n_tokens_size
_MIN_FED = 2  # a suffix of one token is evaluated differently from the same token inside a batch


@dataclass(frozen=True)
class _Sampled:
    """One sampled token: its id, its text ('' for end-of-generation and special tokens, or
    while a multi-byte character is incomplete) and its sampling log-probability."""

    id: int
    text: str
    logprob: float | None


@dataclass(frozen=True)
class _Finished:
    """The end of a decode: the prompt ids fed to the model and why it stopped."""

    prompt_ids: list[int]
    reason: str


def reusable_prefix(cached: Sequence[int], prompt_ids: Sequence[int], n_batch: int) -> int:
    """How many leading tokens of ``prompt_ids`` to keep from the KV cache, whose first
    ``len(cached)`` positions hold ``cached`` as a cold evaluation would: their common prefix,
    shortened so that every batch of the suffix (``Llama.eval`` feeds ``n_batch`` at a time) has
    at least two tokens (0: evaluate the whole prompt)."""
    limit = min(len(cached), len(prompt_ids) - _MIN_FED)
    n = 0
    while n < limit and cached[n] == prompt_ids[n]:
        n += 1
    if n and (len(prompt_ids) - n) % n_batch == 1:
        n -= 1
    return n


def exact_after(n_prompt: int, keep: int, n_batch: int) -> int:
    """How many leading positions of the cache hold what a cold evaluation would hold, once a
    prompt of ``n_prompt`` tokens is evaluated from position ``keep`` (a last batch of one token
    is not)."""
    return n_prompt - 1 if (n_prompt - keep) % n_batch == 1 else n_prompt


def _decode(llama: Any, llm: Any, prompt_text: str, prompt: Prompt) -> Iterator[_Sampled | _Finished]:
    """Decode ``prompt_text``; ``llm._kv_exact`` is how many leading positions of the cache hold
    batch-evaluated prompt tokens (``llama.input_ids``), kept up to date here."""
    import numpy as np

    settings = _settings(llm.parameters, llm.model_name)
    prompt_ids = [int(i) for i in llama.tokenize(prompt_text.encode("utf-8"), add_bos=False, special=True)]
    room = llama.n_ctx() - len(prompt_ids)
    if room <= 0:
        raise LLMError(
            f"the prompt has {len(prompt_ids)} tokens, more than the context (n_ctx={llama.n_ctx()})"
        )
    n_batch = llama.n_batch
    cached = llama.input_ids[: llm._kv_exact].tolist()
    keep = reusable_prefix(cached, prompt_ids, n_batch) if llm.reuse_prefix else 0
    llm._kv_exact = keep  # positions from ``keep`` on are overwritten below
    if keep:
        llama.n_tokens = keep  # Llama.eval drops the cache from here on and feeds the suffix
    else:
        llama.reset()
    limit = min(settings["max_tokens"] or room, room)
    seed = settings["seed"]
    llama.set_seed(seed if seed is not None else random.Random(llama._seed).randint(0, 2**32))
    grammar = _grammar(prompt)
    temperature = float(settings["temperature"])
    import llama_cpp

    vocab, n_vocab = llama._model.vocab, llama.n_vocab()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    history: list[int] = []
    reason = "length"
    tokens = llama.generate(
        prompt_ids[keep:],
        reset=False,  # the cache up to ``keep`` is kept, not matched again by llama-cpp-python
        top_k=settings["top_k"],
        top_p=settings["top_p"],
        min_p=settings["min_p"],
        typical_p=settings["typical_p"],
        temp=temperature,
        repeat_penalty=settings["repeat_penalty"],
        frequency_penalty=settings["frequency_penalty"],
        presence_penalty=settings["presence_penalty"],
        grammar=grammar,
    )
    for token in tokens:
        llm._kv_exact = exact_after(len(prompt_ids), keep, n_batch)  # the prompt is evaluated
        token = int(token)
        logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(-1), shape=(n_vocab,))
        logprob = _logprob(logits, token, history, settings)
        history.append(token)
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            yield _Sampled(token, decoder.decode(b"", final=True), logprob)
            reason = "stop"
            break
        last = len(history) >= limit
        yield _Sampled(token, decoder.decode(llm.piece(token, special=False), final=last), logprob)
        if last:
            break
    yield _Finished(prompt_ids, reason)


def _settings(parameters: dict[str, Any], model: str) -> dict[str, Any]:
    unknown = sorted(set(parameters) - set(_DEFAULTS))
    if unknown:
        raise LLMError(
            f"LlamaCppLLM {model!r}: unsupported parameters {unknown} (supported: {sorted(_DEFAULTS)})"
        )
    return {**_DEFAULTS, **parameters}


def _grammar(prompt: Prompt) -> Any:
    if prompt.response_schema is None:
        return None
    from llama_cpp.llama_chat_format import _grammar_for_response_format

    return _grammar_for_response_format({"type": "json_object", "schema": prompt.response_schema})


def _logprob(logits: Any, token: int, history: list[int], settings: dict[str, Any]) -> float | None:
    """The log-probability of ``token``: under the model for greedy decoding; under the sampler's
    distribution (penalties, top-k, top-p, min-p, temperature, as llama.cpp chains them) when
    sampling. Under a grammar the token is drawn from the masked distribution but its log-prob
    is read from the unmasked one, as ``BatchedTransformersLLM`` records it and as a trainer
    recomputes it (it sees no grammar). None under typical-p (its mask is not visible) or when
    the token is outside the unmasked top-k/top-p/min-p set."""
    import numpy as np

    x = logits.astype(np.float64)
    temperature = float(settings["temperature"])
    if temperature <= 0:
        return float(x[token] - _logsumexp(x))
    if settings["typical_p"] < 1.0:
        return None
    x = _penalised(x.copy(), history, settings)
    order = np.argsort(-x, kind="stable")
    if settings["top_k"] > 0:
        order = order[: settings["top_k"]]
    cand = x[order]
    if settings["top_p"] < 1.0:
        p = np.exp(cand - _logsumexp(cand))
        keep = int(np.searchsorted(np.cumsum(p), settings["top_p"])) + 1
        order, cand = order[:keep], cand[:keep]
    if settings["min_p"] > 0:
        keep_mask = cand >= cand[0] + np.log(settings["min_p"])
        keep_mask[0] = True
        order, cand = order[keep_mask], cand[keep_mask]
    cand = cand / temperature
    where = np.flatnonzero(order == token)
    return float(cand[where[0]] - _logsumexp(cand)) if len(where) else None


def _penalised(x: Any, history: list[int], settings: dict[str, Any]) -> Any:
    import numpy as np

    repeat, freq = settings["repeat_penalty"], settings["frequency_penalty"]
    presence = settings["presence_penalty"]
    recent = history[-_PENALTY_WINDOW:]
    if not recent or (repeat == 1.0 and not freq and not presence):
        return x
    ids, counts = np.unique(np.array(recent), return_counts=True)
    v = x[ids]
    v = np.where(v <= 0, v * repeat, v / repeat)
    x[ids] = v - counts * freq - presence
    return x


def _logsumexp(x: Any) -> Any:
    import numpy as np

    m = x.max()
    return m + np.log(np.exp(x - m).sum())


def _add_chunk(answer: StreamedOutput, chunk: dict[str, Any]) -> None:
    """Merge one chat-completion stream chunk (the no-template fallback) into ``answer``."""
    for choice in chunk.get("choices", []):
        delta = choice.get("delta") or {}
        if delta.get("content"):
            answer.add_text(delta["content"])
        for tc in delta.get("tool_calls") or []:
            function = tc.get("function") or {}
            name, arguments = function.get("name"), function.get("arguments")
            answer.add_tool_call(tc.get("index", 0), tc.get("id"), name, arguments)
