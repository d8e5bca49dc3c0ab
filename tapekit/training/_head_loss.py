"""The causal-LM loss with the LM head applied only where there is a label.

A model's own loss multiplies every position's hidden state by the output embedding (hidden x
vocabulary) and then throws away the logits of every position whose label is -100: the prompt,
the tool results, the other agents' text. In token-exact agent samples those are most of the
tokens, and on a small model the LM head is a large share of the compute. :func:`labelled_loss`
runs the model's decoder, keeps the hidden states of the positions that predict a labelled token,
and applies the head to those alone: the same loss and the same gradients, without the wasted
logits.

It applies only to architectures whose logits are exactly ``lm_head(final hidden state)``
(:data:`PLAIN_HEAD_MODELS`, no logit scaling or soft-capping); for any other model it returns
``None`` and the caller uses the model's own loss.
"""

from __future__ import annotations

from typing import Any

# model types whose causal-LM forward is logits = lm_head(decoder(...).last_hidden_state)
PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def plain_head_parts(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` of ``model`` (a transformers causal LM, possibly a peft model), or
    ``None`` when its logits are not a plain head over the decoder's output or it is wrapped
    (``DistributedDataParallel``: calling its decoder directly would skip the gradient sync)."""
    if hasattr(model, "module"):
        # DistributedDataParallel (or another wrapper): its forward is what syncs the gradients,
        # so the decoder must not be called around it
        return None
    inner = model
    if hasattr(inner, "get_base_model"):  # peft: the LoRA layers live inside the base model
        inner = inner.get_base_model()
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODELS:
        return None
    if getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        return None
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if decoder is None or head is None:
        return None
    return decoder, head


def _kept_logits(model: Any, forward: dict[str, Any], keep: Any) -> Any:
    """float32 logits of the positions ``keep`` ([B, T-1], position t predicting token t+1):
    the decoder over ``forward`` and the head on those hidden states only; ``None`` when
    ``model`` is not a plain-head model."""
    parts = plain_head_parts(model)
    if parts is None:
        return None
    decoder, head = parts
    hidden = decoder(**forward, use_cache=False).last_hidden_state
    return head(hidden[:, :-1][keep]).float()


def labelled_loss(model: Any, inputs: dict[str, Any], num_items: Any = None) -> Any:
    """The next-token cross-entropy of ``inputs`` (``input_ids``, ``labels`` with -100 where
    there is no loss, and ``attention_mask`` and/or ``position_ids``) computed with the LM head
    on labelled positions only; ``None`` when ``model`` is not a plain-head model.

    The reduction is the model's own: the sum over labelled tokens divided by ``num_items``
    when given (the Trainer's token count over the accumulated batch), else the mean.
    """
    import torch.nn.functional as F

    targets = inputs["labels"][:, 1:]
    keep = targets != -100
    forward = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "position_ids")}
    logits = _kept_logits(model, forward, keep)
    if logits is None:
        return None
    total = F.cross_entropy(logits, targets[keep], reduction="sum")
    if num_items is None:
        return total / keep.sum().clamp(min=1)
    return total / num_items


def masked_token_logprobs(
    model: Any, input_ids: Any, attention_mask: Any, mask: Any, temperature: float = 1.0
) -> Any:
    """``token_logprobs`` of ``input_ids`` ([B, T]) computed with the LM head only where
    ``mask`` ([B, T]) is 1 (the tokens whose log-probs the RL loss uses); 0.0 elsewhere.
    ``None`` when ``model`` is not a plain-head model (the caller takes the full logits)."""
    import torch

    if temperature <= 0:
        raise ValueError(f"masked_token_logprobs: temperature must be > 0, got {temperature}")
    keep = mask[:, 1:].bool()  # token t+1 is predicted at position t
    logits = _kept_logits(model, {"input_ids": input_ids, "attention_mask": attention_mask}, keep)
    if logits is None:
        return None
    logits = logits / temperature
    targets = input_ids[:, 1:][keep]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    out = torch.zeros(input_ids.shape, dtype=picked.dtype, device=picked.device)
    out[:, 1:][keep] = picked
    return out
