"""JSON-schema constraints for transformers decoding: one llguidance matcher per batch row.

A prompt's ``response_schema`` holds the answer to that schema, as llama.cpp's grammar does for
:class:`~tapekit.llm.LlamaCppLLM` (and with the same JSON layout as ``json.dumps``: ``", "``
and ``": "`` separators, no other whitespace). :class:`RowConstraints` is a logits processor
for ``generate``: before each token it feeds every constrained row's previous token to that
row's matcher and sets the logits of the tokens the schema forbids to ``-inf``. Rows without a
schema are left alone; a row whose answer is complete may only end its turn.

The contract with the log-probabilities: the mask changes which tokens can be drawn, not what
is recorded. The callers record each sampled token's log-probability under the model's own
(temperature-scaled) distribution before the mask, which is what the trainer recomputes, so an
on-policy sample's importance ratio is exactly 1. (The masked distribution's log-probability
would differ by the log of the mass the schema allows, a bias the ratio would then carry.)

The llguidance tokenizer costs about half a second to build; :func:`ll_tokenizer` keeps one
per Hugging Face tokenizer object.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from tapekit.llm.base import LLMError

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""The layout the grammar allows: ``json.dumps``'s default separators and no other whitespace."""

_cache: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
    except ImportError as e:
        raise LLMError(
            "a response_schema on a transformers model needs llguidance (pip install 'tapekit[transformers]')"
        ) from e
    return llguidance


def ll_tokenizer(tokenizer: Any, stops: Sequence[int]) -> Any:
    """The llguidance tokenizer of a fast Hugging Face ``tokenizer`` whose end-of-turn ids are
    ``stops`` (cached per tokenizer object)."""
    llguidance = _llguidance()
    with _cache_lock:
        cached = _cache.get(tokenizer)
        if cached is None:
            eos = sorted(stops)
            cached = llguidance.hf.from_tokenizer(tokenizer, eos_token=eos[0] if len(eos) == 1 else eos)
            _cache[tokenizer] = cached
        return cached


class RowConstraints:
    """A ``generate`` logits processor holding row ``i`` to ``schemas[i]`` (``None``: free).

    ``tokenizer`` is the Hugging Face tokenizer, ``stops`` the end-of-turn ids. A schema
    llguidance cannot compile is an :class:`~tapekit.llm.base.LLMError` naming the problem.
    """

    def __init__(
        self, tokenizer: Any, schemas: Sequence[dict[str, Any] | None], stops: Sequence[int]
    ) -> None:
        llguidance = _llguidance()
        import llguidance.torch as llt

        self._llt = llt
        lltok = ll_tokenizer(tokenizer, stops)
        self.vocab = int(lltok.vocab_size)
        self.matchers: list[Any | None] = []
        grammars: dict[str, Any] = {}
        for schema in schemas:
            if schema is None:
                self.matchers.append(None)
                continue
            key = json.dumps(schema, sort_keys=True)
            if key not in grammars:
                try:
                    grammars[key] = llguidance.LLMatcher.grammar_from_json_schema(key, defaults=JSON_LAYOUT)
                except Exception as e:  # llguidance says what it cannot take
                    raise LLMError(f"response_schema cannot be compiled to a grammar: {e}") from e
            matcher = llguidance.LLMatcher(lltok, grammars[key])
            if matcher.is_error():
                raise LLMError(f"response_schema cannot be compiled to a grammar: {matcher.get_error()}")
            self.matchers.append(matcher)
        self.bitmask = llt.allocate_token_bitmask(len(self.matchers), self.vocab)
        self._started = False

    @property
    def active(self) -> bool:
        """Whether any row is constrained."""
        return any(m is not None for m in self.matchers)

    def _advance(self, input_ids: Any) -> None:
        """Feed each constrained row's last token (the one chosen at the previous step)."""
        last = input_ids[:, -1].tolist()
        for i, matcher in enumerate(self.matchers):
            if matcher is None or matcher.is_stopped():
                continue  # complete: only the end of turn is left (then generate's padding)
            if not matcher.consume_token(int(last[i])):
                raise LLMError(f"row {i}: the grammar refused token {last[i]}: {matcher.get_error()}")

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self._started:
            self._advance(input_ids)
        self._started = True
        scores = scores.clone()  # generate keeps the raw logits it passed in (output_logits)
        self.bitmask.fill_(-1)  # every bit set: every token allowed
        for i, matcher in enumerate(self.matchers):
            if matcher is not None:  # a complete answer allows only the end-of-turn token
                self._llt.fill_next_token_bitmask(matcher, self.bitmask, i)
        width = scores.shape[-1]
        if width > self.vocab:  # padded embedding rows beyond the tokenizer: never valid text
            scores[:, self.vocab :] = float("-inf")
            self._llt.apply_token_bitmask_inplace(scores[:, : self.vocab], self.bitmask.to(scores.device))
        else:
            self._llt.apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device))
        return scores
