"""RL log-probs with each shared prompt run through the model once.

The G rollouts of one GRPO group start from the same prompt: the same task, the same first
observation, the same system text. In a web or tool step that prompt is most of the row (a
280-token page for an 11-token action), and the plain forward and backward pass computes it G
times. :func:`shared_prefix_logprobs` groups the rows whose tokens before their first trained
token are identical, runs that prefix once (keeping its key/value cache and its last hidden
state), repeats the cache for the group's rows and runs only each row's own continuation on it.
And every prompt of an agent begins with the same system prompt: when the groups' prefixes
share at least :data:`COMMON_MIN` tokens, that common part runs once per micro-batch and each
group's prefix runs on its cache (a multi-turn episode's later turns are groups of one row,
each with its own page, all after the same system text). Each group runs at its own length, so
no padding is computed either.

The log-probs are the plain pass's, position for position (the same attention over the same
tokens; only the batching of the prefix differs, so floats differ in the last bits), and so are
the gradients: autograd sums each row's gradient into the one prefix pass through the repeated
cache. Rows without a trained token get 0.0 everywhere, as in the masked path.

Contract: the rows are right-padded (``attention_mask`` a run of ones, then zeros), as
:func:`~tapekit.training.rl.make_rl_batch` builds them; the model is a plain-head causal LM
(:func:`~tapekit.training._head_loss.plain_head_parts`). ``None`` otherwise, or when no two rows
share a prefix, and the caller takes its unshared path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tapekit.llm._kv import cache_kwarg, cache_of, common_prefix_length, kv_layers
from tapekit.training import _head_loss

COMMON_MIN = 16
"""The shortest common prefix of a micro-batch's groups worth a forward pass of its own."""


def prefix_groups(rows: Sequence[Sequence[int]], first_trained: Sequence[int]) -> list[tuple[int, list[int]]]:
    """The rows that share their prefix: ``(prefix length, row indices)`` per distinct prefix,
    in order of first appearance. Row ``i``'s prefix is ``rows[i][:first_trained[i]]`` (its
    tokens before the first one with a loss); a row with ``first_trained[i] <= 0`` (no trained
    token, or one at position 0 that nothing predicts) is left out."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (tokens, first) in enumerate(zip(rows, first_trained, strict=True)):
        if first <= 0:
            continue
        groups.setdefault(tuple(tokens[:first]), []).append(i)
    return [(len(prefix), members) for prefix, members in groups.items()]


def micro_batches(rows: Sequence[Sequence[int]], first_trained: Sequence[int], size: int) -> list[list[int]]:
    """The rows split into micro-batches of at most ``size`` rows in which the rows that share
    a prefix (:func:`prefix_groups`) sit together: the groups of several rows first, largest
    first, each put whole into the first micro-batch with room (a group larger than ``size`` is
    cut into ``size``-row parts), then the single rows, in their order, into the room left and
    then into new micro-batches; rows without a trained token last. The GRPO loss sums over
    rows and is normalised over the whole batch, so the split changes which rows meet in a
    micro-batch (what :func:`shared_prefix_logprobs` can share), not the loss or the gradient
    (but for the order of float additions)."""
    if size <= 0:
        raise ValueError(f"micro_batches: size must be > 0, got {size}")
    groups = [members for _, members in prefix_groups(rows, first_trained)]
    shared = sorted((g for g in groups if len(g) > 1), key=len, reverse=True)  # stable: ties keep order
    bins: list[list[int]] = []
    for group in shared:
        for start in range(0, len(group), size):
            part = group[start : start + size]
            target = next((b for b in bins if len(b) + len(part) <= size), None)
            if target is None:
                bins.append(list(part))
            else:
                target.extend(part)
    grouped = {i for g in groups for i in g}
    rest = [g[0] for g in groups if len(g) == 1] + [i for i in range(len(rows)) if i not in grouped]
    for b in bins:  # the room the groups left
        while len(b) < size and rest:
            b.append(rest.pop(0))
    bins += [rest[i : i + size] for i in range(0, len(rest), size)]
    return bins


def batch_micro_batches(input_ids: Any, attention_mask: Any, mask: Any, size: int) -> list[list[int]]:
    """:func:`micro_batches` of a right-padded batch's rows (the tensors that
    :func:`shared_prefix_logprobs` takes)."""
    return micro_batches(_rows(input_ids, attention_mask)[1], _first_trained(mask), size)


def _rows(input_ids: Any, attention_mask: Any) -> tuple[list[int], list[list[int]]]:
    """Each right-padded row's length and its tokens without the padding."""
    lengths = [int(n) for n in attention_mask.sum(dim=1).tolist()]
    return lengths, [input_ids[i, :n].tolist() for i, n in enumerate(lengths)]


def _first_trained(mask: Any) -> list[int]:
    """Per row, the position of the first token with a loss (0 when there is none)."""
    has = mask.bool()
    first = has.int().argmax(dim=1)
    return [int(f) if bool(h) else 0 for f, h in zip(first.tolist(), has.any(dim=1).tolist(), strict=True)]


def shared_prefix_logprobs(
    model: Any, input_ids: Any, attention_mask: Any, mask: Any, temperature: float = 1.0
) -> Any:
    """Per-token log-probs of ``input_ids`` ([B, T]) at ``temperature`` where ``mask`` is 1 (0.0
    elsewhere), each shared prefix computed once; ``None`` when the model is not a plain-head
    model or no two rows share a prefix (see the module's docstring)."""
    import torch

    if temperature <= 0:
        raise ValueError(f"shared_prefix_logprobs: temperature must be > 0, got {temperature}")
    parts = _head_loss.plain_head_parts(model)
    if parts is None:
        return None
    lengths, rows = _rows(input_ids, attention_mask)
    groups = prefix_groups(rows, _first_trained(mask))
    common = common_prefix_length([rows[members[0]][:length] for length, members in groups])
    if common < COMMON_MIN or len(groups) < 2:
        common = 0
    if not common and not any(len(members) > 1 for _, members in groups):
        return None
    decoder, head = parts
    base: tuple[int, list[tuple[Any, Any]]] | None = None
    if common:  # the groups' common prefix (the system prompt), once
        first = groups[0][1][0]
        cache = _output_cache(decoder(input_ids=input_ids[first : first + 1, :common], use_cache=True))
        base = (common, kv_layers(cache))
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    for length, members in groups:
        _group_logprobs(decoder, head, input_ids, lengths, mask, length, members, temperature, out, base)
    return out


def _output_cache(output: Any) -> Any:
    """The key/value cache a decoder returned (``cache`` or, before, ``past_key_values``)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _group_logprobs(
    decoder: Any,
    head: Any,
    input_ids: Any,
    lengths: list[int],
    mask: Any,
    length: int,
    members: list[int],
    temperature: float,
    out: Any,
    base: tuple[int, list[tuple[Any, Any]]] | None = None,
) -> None:
    """One prefix group: the prefix once (on ``base``, the cache of the micro-batch's common
    prefix and its length, when given), the rows' continuations on its repeated cache; their
    log-probs written into ``out`` in place (each row's positions ``length`` … its end)."""
    import torch

    device = input_ids.device
    first = members[0]
    if base is None:
        prefix = decoder(input_ids=input_ids[first : first + 1, :length], use_cache=True)
    else:
        common, layers = base
        on_base = {cache_kwarg(decoder): cache_of(layers)}  # a new cache: base stays as it is
        prefix = decoder(input_ids=input_ids[first : first + 1, common:length], use_cache=True, **on_base)
    last = prefix.last_hidden_state[:, -1:]  # predicts each row's first trained token
    # each row's own tokens after the prefix, but its last (which predicts nothing)
    tails = [int(lengths[i]) - length - 1 for i in members]
    width = max(tails)
    k = len(members)
    if width > 0:
        cache = _output_cache(prefix)
        cache.batch_repeat_interleave(k)
        ids = torch.zeros((k, width), dtype=input_ids.dtype, device=device)
        own = torch.zeros((k, width), dtype=torch.long, device=device)
        for j, i in enumerate(members):
            ids[j, : tails[j]] = input_ids[i, length : length + tails[j]]
            own[j, : tails[j]] = 1
        attention = torch.cat([torch.ones((k, length), dtype=torch.long, device=device), own], dim=1)
        on_cache = {cache_kwarg(decoder): cache}
        hidden = decoder(input_ids=ids, attention_mask=attention, **on_cache).last_hidden_state
        hidden = torch.cat([last.expand(k, 1, -1), hidden], dim=1)  # [k, width + 1, H]
    else:
        hidden = last.expand(k, 1, -1)
    span = hidden.shape[1]  # row j's token length + t is predicted by hidden[j, t]
    targets = torch.zeros((k, span), dtype=input_ids.dtype, device=device)
    keep = torch.zeros((k, span), dtype=torch.bool, device=device)
    for j, i in enumerate(members):
        n = tails[j] + 1
        targets[j, :n] = input_ids[i, length : length + n]
        keep[j, :n] = mask[i, length : length + n].bool()
    logits = head(hidden[keep]).float() / temperature
    picked = logits.gather(-1, targets[keep].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    rows = torch.tensor(members, device=device).unsqueeze(1).expand(k, span)
    cols = length + torch.arange(span, device=device).unsqueeze(0).expand(k, span)
    out.index_put_((rows[keep], cols[keep]), picked)
