"""A transformers key/value cache as plain tensors and back, across transformers releases.

Prefix sharing (the batched LLM's prefill, GRPO's shared-prefix pass) runs a prefix once and
reuses its keys and values: :func:`common_prefix_length` finds what the rows share,
:func:`kv_layers` reads each layer's ``(keys, values)`` out of a ``DynamicCache`` (``[rows,
heads, positions, head_dim]``), :func:`cache_of` makes a new cache holding given tensors (the
tensors are used as they are: autograd flows through them), and :func:`cache_kwarg` names the
argument a model takes its cache by.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """The length of the longest prefix every row shares, leaving each row at least one token
    of its own (the one whose hidden state predicts what follows the row); 0 for no rows."""
    if not rows:
        return 0
    most = min(len(r) for r in rows) - 1
    n = 0
    while n < most and all(r[n] == rows[0][n] for r in rows):
        n += 1
    return n


def kv_layers(cache: Any) -> list[tuple[Any, Any]]:
    """Each layer's ``(keys, values)`` of a ``DynamicCache``."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def cache_of(layers: list[tuple[Any, Any]]) -> Any:
    """A new ``DynamicCache`` holding ``layers`` (each layer's keys and values)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def cache_kwarg(model: Any) -> str:
    """The name under which ``model``'s forward (and ``generate``) takes a key/value cache:
    ``cache`` in the transformers releases that renamed it, ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    return _cache_kwarg_of(base.__class__)


@functools.cache
def _cache_kwarg_of(model_class: Any) -> str:
    """:func:`cache_kwarg` for a model class (its signature read once)."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"
