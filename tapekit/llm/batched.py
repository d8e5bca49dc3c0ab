"""A ``TransformersLLM`` that answers concurrent requests with one batched ``generate``.

The batch runner runs many tapes at once, and each asks the LLM for one completion at a time.
Generating them one by one leaves a small model's matrix products tiny (and a CPU mostly
idle); :class:`BatchedTransformersLLM` collects the requests in flight and decodes them
together (left padding, one ``generate`` call), the way vLLM batches dynamically.

Each request keeps its own exact tokens: the prompt ids it was conditioned on, the ids sampled
for its row (up to and including its end-of-turn token), and their log-probabilities under the
row's sampling distribution (the processed scores ``generate`` drew from), so the RL loss
takes its importance ratio against what was really sampled. A prompt's ``response_schema``
holds its row's answer to that schema (:mod:`tapekit.llm._grammar`); the mask decides what can
be drawn, and the recorded log-probabilities are the model's before it (what the trainer
recomputes).

When to decode:

- **lockstep** (the RL rollouts use it): :meth:`RequestBatcher.expect` says how many sessions
  are active and :meth:`RequestBatcher.finished` when one ends; a batch is decoded as soon as
  every active session waits on the LLM (in chunks of at most ``max_batch`` rows, one after
  the other). The rows are sorted by prompt ids, so the batches (and, with ``seed``, the
  samples) are the same from run to run whatever the timing: identical prompts get the same
  outputs, only perhaps in another order (the rollouts then sort each task's attempts by
  content);
- **window** (anything else, e.g. an evaluation): a batch is decoded ``max_wait_s`` after its
  first request, or at once when ``max_batch`` requests wait.

Either way one batch decodes at a time: the requests that arrive while it decodes wait, and go
together in the next batch as soon as it ends. (Batches decoded side by side, each in its own
thread with all of torch's threads, oversubscribed the CPU: an evaluation of 56 MiniWob++
episodes decoded batches of 3.3 requests on average, 977 s of ``generate`` in 209 s of wall
time on 2 cores.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import PrivateAttr

from tapekit.core import Prompt
from tapekit.llm._kv import cache_kwarg, cache_of, common_prefix_length, kv_layers
from tapekit.llm.base import LLMError, LLMEvent
from tapekit.llm.transformers import TransformersLLM, _eos_ids, _pad_id


@dataclass
class BatcherStats:
    """What the batcher did: batches decoded, requests, sampled tokens, seconds in ``generate``."""

    batches: int = 0
    requests: int = 0
    output_tokens: int = 0
    generate_s: float = 0.0
    largest_batch: int = 0

    @property
    def mean_batch(self) -> float:
        """Requests per batch."""
        return self.requests / self.batches if self.batches else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Sampled tokens per second of ``generate``."""
        return self.output_tokens / self.generate_s if self.generate_s else 0.0


@dataclass
class _Request:
    ids: list[int]
    future: asyncio.Future[tuple[list[int], list[float]]]
    loop: asyncio.AbstractEventLoop
    schema: dict[str, Any] | None = None


@dataclass
class RequestBatcher:
    """Collects requests and decodes them in batches (see the module docstring)."""

    max_batch: int = 256
    max_wait_s: float = 0.01
    seed: int | None = None
    stats: BatcherStats = field(default_factory=BatcherStats)
    _pending: list[_Request] = field(default_factory=list)
    _active: int | None = None
    _flushes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _timer: asyncio.TimerHandle | None = None
    _llm: Any = None
    _decoding: bool = False

    def expect(self, sessions: int, seed: int | None = None) -> None:
        """Lockstep mode for ``sessions`` concurrent sessions; ``seed`` reseeds the sampling
        (the k-th batch after this call is sampled with ``seed + k``)."""
        if sessions < 0:
            raise ValueError(f"RequestBatcher.expect: sessions must be >= 0, got {sessions}")
        with self._lock:
            self._active = sessions
            self._flushes = 0
            if seed is not None:
                self.seed = seed

    def finished(self) -> None:
        """One lockstep session ended (it will send no more requests)."""
        with self._lock:
            if self._active is None or self._active <= 0:
                raise RuntimeError("RequestBatcher.finished: no active session (call expect first)")
            self._active -= 1
        self._maybe_flush()

    def release(self) -> None:
        """Back to window mode."""
        with self._lock:
            self._active = None
        self._maybe_flush()

    async def submit(
        self, llm: BatchedTransformersLLM, ids: list[int], schema: dict[str, Any] | None = None
    ) -> tuple[list[int], list[float]]:
        """Queue one prompt (its answer held to the JSON ``schema``, if one is given); returns
        its sampled ids and their log-probabilities."""
        loop = asyncio.get_running_loop()
        request = _Request(ids, loop.create_future(), loop, schema)
        with self._lock:
            self._pending.append(request)
            self._llm = llm
            first = len(self._pending) == 1
        if first and self._active is None:
            self._timer = loop.call_later(self.max_wait_s, self._maybe_flush, True)
        self._maybe_flush()
        return await request.future

    def _ready(self, timed_out: bool) -> bool:
        n = len(self._pending)
        if n == 0:
            return False
        if self._active is not None:  # lockstep: wait for every session, whatever max_batch
            return n >= self._active
        return n >= self.max_batch or timed_out

    def _maybe_flush(self, timed_out: bool = False) -> None:
        with self._lock:
            if self._decoding or not self._ready(timed_out):
                return  # a batch is decoding: what arrives meanwhile goes in the next one
            if self._active is None:  # window: the first max_batch to arrive
                taken, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            else:  # lockstep: every waiting session, in chunks of an order that ignores arrival
                taken, self._pending = self._pending, []
            taken.sort(key=lambda r: r.ids)  # rows in an order that does not depend on arrival
            chunks = []
            for start in range(0, len(taken), self.max_batch):
                seed = None if self.seed is None else self.seed + self._flushes
                self._flushes += 1
                chunks.append((taken[start : start + self.max_batch], seed))
            llm = self._llm
            self._decoding = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer_loop = taken[0].loop
            timer_loop.call_soon_threadsafe(timer.cancel)
        thread = threading.Thread(target=self._decode, args=(llm, chunks), daemon=True)
        thread.start()

    def _decode(self, llm: BatchedTransformersLLM, chunks: list[tuple[list[_Request], int | None]]) -> None:
        try:
            self._decode_chunks(llm, chunks)
        finally:
            with self._lock:
                self._decoding = False
            self._maybe_flush(timed_out=True)  # the requests that came in while this batch decoded

    def _decode_chunks(
        self, llm: BatchedTransformersLLM, chunks: list[tuple[list[_Request], int | None]]
    ) -> None:
        for batch, seed in chunks:
            started = time.perf_counter()
            try:
                schemas = [r.schema for r in batch]
                prompts = [r.ids for r in batch]
                if any(s is not None for s in schemas):
                    results = llm.generate_batch(prompts, seed, schemas)
                else:
                    results = llm.generate_batch(prompts, seed)
            except BaseException as e:
                for r in batch:
                    r.loop.call_soon_threadsafe(_fail, r.future, e)
                continue
            elapsed = time.perf_counter() - started
            with self._lock:
                self.stats.batches += 1
                self.stats.requests += len(batch)
                self.stats.output_tokens += sum(len(ids) for ids, _ in results)
                self.stats.generate_s += elapsed
                self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            for r, result in zip(batch, results, strict=True):
                r.loop.call_soon_threadsafe(_resolve, r.future, result)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class BatchedTransformersLLM(TransformersLLM):
    """:class:`~tapekit.llm.transformers.TransformersLLM` whose concurrent requests are decoded
    together by its :attr:`batcher` (one per LLM; the settings of this LLM apply to every row).

    ``generate_lock`` (optional, shared with a trainer) is held while a batch decodes, so the
    weights never change under a running ``generate``. Streaming gives one chunk per request
    (the whole answer).
    """

    share_prompts: bool = True
    """Prefill what a batch's prompts share once: identical prompts, and the common prefix (the
    system prompt) of all of them (:func:`shared_prompt_cache`)."""

    _batcher: RequestBatcher = PrivateAttr(default_factory=RequestBatcher)
    _generate_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def batcher(self) -> RequestBatcher:
        """The request batcher of this LLM."""
        return self._batcher

    def use_generate_lock(self, lock: threading.Lock) -> None:
        """Hold ``lock`` while decoding (share it with whatever updates the weights)."""
        self._generate_lock = lock

    def generate_batch(
        self,
        prompts: list[list[int]],
        seed: int | None = None,
        schemas: list[dict[str, Any] | None] | None = None,
    ) -> list[tuple[list[int], list[float]]]:
        """Decode ``prompts`` (token ids) in one left-padded ``generate``; for each, the sampled
        ids (cut after its first end-of-turn token) and their sampling log-probabilities.
        ``schemas[i]`` holds row ``i``'s answer to a JSON schema (see :mod:`tapekit.llm._grammar`:
        the mask decides what can be drawn; the log-probabilities are the model's, before it)."""
        import torch

        if not prompts or any(not p for p in prompts):
            raise LLMError("BatchedTransformersLLM.generate_batch: empty batch or empty prompt")
        if schemas is not None and len(schemas) != len(prompts):
            raise LLMError(
                f"BatchedTransformersLLM.generate_batch: {len(schemas)} schemas for {len(prompts)} prompts"
            )
        model, tokenizer = self.load()
        pad = _pad_id(tokenizer)
        if pad is None:
            raise LLMError("BatchedTransformersLLM: the tokenizer has neither a pad nor an eos token")
        width = max(len(p) for p in prompts)
        kwargs = self.generate_kwargs()
        sampling = bool(kwargs.pop("do_sample", False))
        stops = _eos_ids(model, tokenizer)
        constraint = None
        if schemas is not None and any(s is not None for s in schemas):
            from tapekit.llm._grammar import RowConstraints

            constraint = RowConstraints(tokenizer, schemas, sorted(stops))
        sampler = _sampler(kwargs, seed, constraint) if sampling else None
        processors = [sampler] if sampler else [constraint] if constraint else None
        with self._generate_lock, torch.no_grad():
            if self.share_prompts:
                input_ids, attention, cache = shared_prompt_cache(model, prompts, pad)
                if cache is not None:
                    kwargs[cache_kwarg(model)] = cache
            else:
                input_ids, attention = left_pad(prompts, pad)
            input_ids, attention = input_ids.to(model.device), attention.to(model.device)
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                pad_token_id=pad,
                return_dict_in_generate=True,
                output_logits=not sampling,
                do_sample=False,  # with a sampler, greedy takes the one token it leaves
                logits_processor=processors,
                **kwargs,
            )
        sequences = out.sequences[:, width:].cpu()
        if sampler is not None:
            table = sampler.logprobs()  # (rows, steps): each sampled token's log-prob
        elif out.logits:
            raw = torch.log_softmax(torch.stack(list(out.logits), dim=1).float(), dim=-1).cpu()
            table = raw.gather(2, sequences[:, : raw.shape[1]].unsqueeze(-1)).squeeze(-1)
        else:
            table = None
        results: list[tuple[list[int], list[float]]] = []
        for i in range(len(prompts)):
            ids = [int(t) for t in sequences[i].tolist()]
            end = next((k + 1 for k, t in enumerate(ids) if t in stops), len(ids))
            ids = ids[:end]
            picked = [] if table is None else table[i, : len(ids)].tolist()
            results.append((ids, [float(x) for x in picked]))
        return results

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        tokenizer = self.load()[1]
        ids = self.prompt_ids(prompt)
        output_ids, logprobs = await self._batcher.submit(self, ids, prompt.response_schema)
        content = tokenizer.decode(output_ids, skip_special_tokens=True)
        if content:
            yield LLMEvent(chunk=content)
        yield self.final_event(ids, output_ids, logprobs, content)


SHARED_PREFIX_MIN = 16
"""The shortest common prefix worth a forward pass of its own (tokens)."""


def shared_prompt_cache(model: Any, prompts: list[list[int]], pad: int) -> tuple[Any, Any, Any]:
    """``(input_ids, attention_mask, cache)`` for ``generate`` over ``prompts``, with every
    prompt token that two rows share run through ``model`` once and no padding run at all;
    ``cache`` is ``None`` (and the batch plainly left-padded) when the rows share nothing.

    What is shared: a GRPO step samples a group of attempts at each task, so its first turn
    asks each prompt ``group_size`` times (each distinct prompt is prefilled once and its cache
    copied to its rows); and an agent's prompts all begin with the same system prompt (the
    batch's common prefix, when it is at least :data:`SHARED_PREFIX_MIN` tokens, is prefilled
    once). Each distinct prompt's rest is then prefilled alone, at its own length: a left-padded
    batch ran every row to the longest prompt's length (a batch of MiniWob++ pages of 160 to 880
    tokens computed 60 % more positions than it had tokens).

    The batch handed to ``generate`` puts the padding between the prefix and the rest of each
    row (``prefix, pads, rest``), so the prefix sits in the same columns in every row; the
    attention mask hides the pads and the positions are counted over real tokens, as
    ``generate`` counts them, so each row's model sees exactly its prompt. The cache covers all
    but the last column; ``generate`` runs that one, and the sampled distribution is a full
    prefill's up to floating-point rounding.
    """
    import torch

    firsts: dict[tuple[int, ...], int] = {}
    rows = [firsts.setdefault(tuple(p), len(firsts)) for p in prompts]
    common = common_prefix_length(prompts)
    if common < SHARED_PREFIX_MIN:
        common = 0
    if common == 0 and len(firsts) == len(prompts):
        return (*left_pad(prompts, pad), None)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, :common] = torch.tensor(p[:common], dtype=torch.long)
        input_ids[i, width - len(p) + common :] = torch.tensor(p[common:], dtype=torch.long)
        attention[i, :common] = 1
        attention[i, width - len(p) + common :] = 1
    device = model.device
    prefix: list[tuple[Any, Any]] = []
    if common:  # the common prefix, once
        prefix = _prefill(model, torch.tensor([prompts[0][:common]], device=device), [])
    distinct = list(firsts)
    layers: list[tuple[Any, Any]] = []
    for u, prompt in enumerate(distinct):  # each distinct prompt's rest but its last token, alone
        rest = list(prompt[common:-1])
        kv = _prefill(model, torch.tensor([rest], device=device), prefix) if rest else prefix
        if not layers:
            layers = [
                (
                    k.new_zeros((len(distinct), *k.shape[1:2], width - 1, k.shape[3])),
                    v.new_zeros((len(distinct), *v.shape[1:2], width - 1, v.shape[3])),
                )
                for k, v in kv
            ]
        for (keys, values), (k, v) in zip(layers, kv, strict=True):
            keys[u, :, :common], values[u, :, :common] = k[0, :, :common], v[0, :, :common]
            if rest:
                keys[u, :, width - 1 - len(rest) :] = k[0, :, common:]
                values[u, :, width - 1 - len(rest) :] = v[0, :, common:]
    where = torch.tensor(rows, device=device)
    cache = cache_of([(k.index_select(0, where), v.index_select(0, where)) for k, v in layers])
    return input_ids, attention, cache


def _prefill(model: Any, ids: Any, prefix: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Each layer's (keys, values) after running the one row ``ids`` on ``prefix`` (the keys
    and values of the tokens before it, one row; empty for none)."""
    import torch

    cache = cache_of(prefix)
    start = prefix[0][0].shape[2] if prefix else 0
    positions = torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)
    model(
        input_ids=ids,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,  # only the cache is wanted: the head over every position cost as much again
        **{cache_kwarg(model): cache},
    )
    return kv_layers(cache)


def left_pad(prompts: list[list[int]], pad: int) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)`` of ``prompts`` left-padded with ``pad`` to the longest
    (CPU tensors; a batch for ``generate``)."""
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attention[i, width - len(p) :] = 1
    return input_ids, attention


def _sampler(kwargs: dict[str, Any], seed: int | None, constraint: Any = None) -> Any:
    """A logits processor that samples each row's next token itself and records its log-prob.

    It takes ``temperature``, ``top_p`` and ``top_k`` out of ``kwargs`` and applies them with
    transformers' own warpers (the order ``generate`` uses when it samples), so the
    distribution is the one ``generate(do_sample=True)`` would draw from. It then draws one
    uniform number per row and inverts the cumulative distribution. ``generate``'s own
    sampling calls ``torch.multinomial`` over the whole vocabulary, which on a CPU took about
    a quarter of each decoding step of a tiny model (bench/rollouts.py). The returned scores
    keep only the drawn token, so ``generate`` run greedily emits it. With a ``constraint``
    (:class:`~tapekit.llm._grammar.RowConstraints`) the token is drawn from the masked
    distribution and its log-prob read from the unmasked one.
    """
    import torch
    from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers: list[Any] = []
    temperature = float(kwargs.pop("temperature", 1.0) or 1.0)
    top_k, top_p = kwargs.pop("top_k", 0) or 0, kwargs.pop("top_p", 1.0)
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(int(top_k)))
    if top_p is not None and float(top_p) < 1.0:
        warpers.append(TopPLogitsWarper(float(top_p)))
    generator = torch.Generator()  # unseeded: seeded from torch's global RNG (torch.manual_seed)
    generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, (1,))))

    class Sampler(LogitsProcessor):  # type: ignore[misc]
        def __init__(self) -> None:
            self.picked: list[Any] = []

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            masked = None if constraint is None else constraint(input_ids, scores.float())
            for warp in warpers:  # the mask goes first, so top-k/top-p keep some allowed token
                scores = warp(input_ids, scores)
                masked = None if masked is None else warp(input_ids, masked)
            logp = torch.log_softmax(scores.float(), dim=-1)
            drawn = logp if masked is None else torch.log_softmax(masked, dim=-1)
            cdf = drawn.exp().cumsum(dim=-1)
            u = torch.rand((scores.shape[0], 1), generator=generator).to(cdf.device) * cdf[:, -1:]
            # the first token whose cumulative probability exceeds u: never one of probability 0
            token = torch.searchsorted(cdf, u, right=True).clamp_(max=scores.shape[-1] - 1)
            self.picked.append(logp.gather(1, token))  # on the model's device until the end
            return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)

        def logprobs(self) -> Any:
            return torch.cat(self.picked, dim=1).cpu() if self.picked else None

    return Sampler()
