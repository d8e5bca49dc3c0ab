"""A local Hugging Face model (CPU or CUDA): the backend that training produces and evaluates.

By default it loads the embedded SmolLM2-135M-Instruct from the same GGUF file that
``LlamaCppLLM`` runs (transformers dequantizes it to full precision), so the embedded model is
also the trainable one. Any local model directory, a directory saved after fine-tuning, a peft
(LoRA) adapter directory on top of a base model, or a (model, tokenizer) pair already in memory
load the same way. Every call records its :class:`~tapekit.llm.base.TokenTrace`: the prompt ids
exactly as fed to ``generate``, the sampled ids and their sampling log-probabilities.
torch and transformers are imported on first use only.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Self

from pydantic import PrivateAttr

from tapekit._sync import iterate_in_thread
from tapekit.core import LLMOutput, Prompt
from tapekit.llm._gguf_cache import cached_checkpoint
from tapekit.llm.base import LLM, LLMError, LLMEvent, TokenTrace, TrainingText, answer_text
from tapekit.llm.llamacpp import plain_messages, smollm2_path


class TransformersLLM(LLM):
    """A causal LM run with ``transformers`` in this process.

    Where the weights come from (first match wins):

    - :meth:`from_model`: a ``(model, tokenizer)`` pair already in memory (e.g. right after
      training), used as it is (its device is kept);
    - ``model_path``: a local model directory (``save_pretrained`` output), or a directory
      holding ``gguf_file``;
    - neither: the embedded SmolLM2 GGUF.

    ``adapter_path`` puts a peft adapter directory (LoRA) on top of the base model. A GGUF file
    is converted for transformers once and kept in a local cache (``gguf_cache``, on by default;
    ``$TAPEKIT_CACHE_DIR`` or ``~/.cache/tapekit``): later loads take under a second instead of
    about 20 s (see :mod:`tapekit.llm._gguf_cache`).
    ``device`` is ``"cpu"``, ``"cuda"`` or ``"auto"``; ``dtype`` ``"float32"``, ``"bfloat16"``,
    ``"float16"`` or ``"auto"`` (the checkpoint's).

    Generation: ``temperature`` 0 is greedy decoding, above 0 samples (with ``top_p`` and
    ``top_k``); ``seed`` reseeds torch before every sampled call, so a prompt always gets the
    same sample (leave it None to draw different samples, e.g. k attempts per task);
    ``max_tokens`` bounds the answer. ``parameters`` go to ``generate`` last and override all
    of these (``{"max_new_tokens": 20, "do_sample": False}`` works as before).
    A prompt's ``response_schema`` holds the answer to that JSON schema, as llama.cpp's grammar
    does (llguidance; see :mod:`tapekit.llm._grammar`); the recorded log-probabilities are the
    model's before the schema's mask.

    Every final event carries a :class:`TokenTrace`: prompt ids as fed to ``generate`` (chat
    template applied), the sampled ids (the end-of-turn token included when the model wrote
    it), and their log-probabilities: under the sampling distribution (after temperature,
    top-p and top-k) when sampling, under the model when greedy. ``policy_version`` is copied
    into the trace.
    """

    model_name: str = "smollm2-135m-instruct"
    model_path: str | None = None
    gguf_file: str | None = None
    adapter_path: str | None = None
    device: str = "auto"
    dtype: str = "float32"
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    policy_version: str | None = None
    parameters: dict[str, Any] = {}
    gguf_cache: bool = True
    _model: Any = PrivateAttr(None)
    _tokenizer: Any = PrivateAttr(None)
    _fingerprint: str | None = PrivateAttr(None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, **settings: Any) -> Self:
        """An LLM over a model and tokenizer already in memory (e.g. a trainer's, or a
        ``peft`` model). ``settings`` are this class's fields (``temperature``, ``max_tokens``,
        ``policy_version``, ``model_name``, ...); path fields are ignored."""
        llm = cls(**settings)
        llm._model, llm._tokenizer = model, tokenizer
        return llm

    def load(self) -> tuple[Any, Any]:
        """The (model, tokenizer) pair, loaded on first use."""
        with self._lock:
            if self._model is None:
                self._model, self._tokenizer = self._load()
            return self._model, self._tokenizer

    def _load(self) -> tuple[Any, Any]:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:
            raise LLMError(
                "TransformersLLM needs torch, transformers, accelerate and gguf "
                "(scripts/install-local.sh installs them)"
            ) from e
        path, gguf = self.model_path, self.gguf_file
        if path is None:
            embedded = smollm2_path()
            path, gguf = str(embedded.parent), gguf or embedded.name
        if not os.path.isdir(path):
            raise LLMError(f"TransformersLLM: model_path {path!r} is not a directory (nothing is downloaded)")
        dtype = self.dtype if self.dtype == "auto" else getattr(torch, self.dtype, None)
        if not isinstance(dtype, str | torch.dtype):  # "auto" or a torch dtype
            raise LLMError(f"TransformersLLM: dtype {self.dtype!r} is not float32, bfloat16, float16 or auto")
        if gguf and self.gguf_cache:  # read the file's checkpoint, converted once (_gguf_cache)
            folder, name = path, gguf
            checkpoint = cached_checkpoint(
                Path(folder, name), lambda: _from_gguf(folder, name, torch.float32)
            )
            if checkpoint is not None:
                path, gguf = str(checkpoint), None
        if gguf:
            model, tokenizer = _from_gguf(path, gguf, dtype)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
        if self.adapter_path is not None:
            model = _with_adapter(model, self.adapter_path)
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return model.to(device).eval(), tokenizer  # type: ignore[arg-type]  # .to is typed by a decorator

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer (loads the model on first use)."""
        return self.load()[1]

    def tokenizer_fingerprint(self) -> str:
        """The fingerprint of the tokenizer and chat template (see :mod:`tapekit.llm.fingerprint`);
        equal to :meth:`LlamaCppLLM.tokenizer_fingerprint` for the same GGUF file."""
        if self._fingerprint is None:
            from tapekit.llm.fingerprint import hf_tokenizer_fingerprint

            self._fingerprint = hf_tokenizer_fingerprint(self.tokenizer)
        return self._fingerprint

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's tokenizer."""
        return len(self.load()[1](text, add_special_tokens=False)["input_ids"])

    def render_prompt(self, prompt: Prompt) -> str:
        """The prompt as the model reads it: its chat template with the generation prompt."""
        tokenizer = self.load()[1]
        messages = plain_messages(prompt.messages)
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The token ids ``generate`` is fed for ``prompt`` (the rendered chat template,
        tokenised with special tokens parsed and none added)."""
        return list(self.load()[1](self.render_prompt(prompt), add_special_tokens=False)["input_ids"])

    def make_training_text(self, prompt: Prompt, output: LLMOutput) -> TrainingText:
        """Chat-template text; the predicted span is the answer plus the end-of-turn token."""
        tokenizer = self.load()[1]
        completion = answer_text(output) + (tokenizer.eos_token or "")
        text = self.render_prompt(prompt) + completion
        return TrainingText(text=text, n_predicted=len(completion), prompt_id=prompt.id)

    def generate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments every ``generate`` call gets (fields, then ``parameters``)."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_tokens, "do_sample": self.temperature > 0}
        if self.temperature > 0:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k or 0)
        kwargs.update(self.parameters)
        return kwargs

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        import torch
        from transformers import TextIteratorStreamer

        model, tokenizer = self.load()
        ids = self.prompt_ids(prompt)
        input_ids = torch.tensor([ids], dtype=torch.long, device=model.device)
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs = self.generate_kwargs()
        sampling = bool(kwargs.get("do_sample"))
        constraint = None
        if prompt.response_schema is not None:
            from tapekit.llm._grammar import RowConstraints

            constraint = RowConstraints(
                tokenizer, [prompt.response_schema], sorted(_eos_ids(model, tokenizer))
            )
            kwargs["logits_processor"] = [constraint]
        temperature = float(kwargs.get("temperature") or 1.0)
        result: list[tuple[list[int], list[float]]] = []
        failure: list[BaseException] = []

        def generate() -> None:  # feeds the streamer; the streamer is read on the event loop
            try:
                with self._lock:
                    if sampling and self.seed is not None:
                        torch.manual_seed(self.seed)
                    with torch.no_grad():
                        out = model.generate(
                            input_ids=input_ids,
                            attention_mask=torch.ones_like(input_ids),
                            streamer=streamer,
                            pad_token_id=_pad_id(tokenizer),
                            return_dict_in_generate=True,
                            output_scores=sampling,
                            output_logits=not sampling or constraint is not None,
                            **kwargs,
                        )
                if constraint is not None and sampling:  # the model's distribution, before the mask
                    result.append(_sampled(out, len(ids), False, temperature))
                else:
                    result.append(_sampled(out, len(ids), sampling))
            except BaseException as e:
                failure.append(e)
                streamer.end()

        worker = threading.Thread(target=generate, name="tapekit-transformers", daemon=True)
        worker.start()
        pieces: list[str] = []
        async for piece in iterate_in_thread(lambda: streamer, "tapekit-transformers-stream"):
            if piece:
                pieces.append(piece)
                yield LLMEvent(chunk=piece)
        await asyncio.to_thread(worker.join)  # the streamer ends just before generate returns
        if failure:
            raise LLMError(f"transformers model {self.model_name!r} failed: {failure[0]}") from failure[0]
        output_ids, logprobs = result[0]
        yield self.final_event(ids, output_ids, logprobs, "".join(pieces))

    def final_event(
        self, ids: list[int], output_ids: list[int], logprobs: list[float], content: str
    ) -> LLMEvent:
        """The stream's last event: the output, its token counts and its exact token trace
        (``finish_reason`` is ``stop`` when the last sampled id ends the turn)."""
        model, tokenizer = self.load()
        finish = "stop" if output_ids and output_ids[-1] in _eos_ids(model, tokenizer) else "length"
        return LLMEvent(
            output=LLMOutput(content=content or None),
            prompt_tokens=len(ids),
            output_tokens=len(output_ids),
            tokens=TokenTrace(
                prompt_ids=ids,
                output_ids=output_ids,
                output_logprobs=logprobs,
                tokenizer=self.tokenizer_fingerprint(),
                policy_version=self.policy_version,
                finish_reason=finish,
            ),
        )


def _from_gguf(directory: str, gguf: str, dtype: Any) -> tuple[Any, Any]:
    """(model, tokenizer) read from ``directory/gguf`` by transformers (dequantized to ``dtype``),
    the model without quantization marks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, dtype=dtype, gguf_file=gguf
    )
    _as_plain_model(model)
    return model, tokenizer


def _as_plain_model(model: Any) -> None:
    """transformers dequantizes a GGUF file's tensors to the requested dtype but still marks the
    model quantized, and its Trainer then refuses full fine-tuning ("purely quantized models")
    and ``save_pretrained`` writes a GGUF quantization config. The weights are plain tensors:
    drop the marks."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _with_adapter(model: Any, adapter_path: str) -> Any:
    if not os.path.isdir(adapter_path):
        raise LLMError(f"TransformersLLM: adapter_path {adapter_path!r} is not a directory")
    try:
        from peft import PeftModel
    except ImportError as e:
        raise LLMError("TransformersLLM with adapter_path needs peft (pip install 'tapekit[train]')") from e
    return PeftModel.from_pretrained(model, adapter_path)


def _pad_id(tokenizer: Any) -> int | None:
    pad = tokenizer.pad_token_id
    return int(pad) if pad is not None else tokenizer.eos_token_id


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids


def _sampled(
    out: Any, n_prompt: int, sampling: bool, temperature: float = 1.0
) -> tuple[list[int], list[float]]:
    """The sampled ids of a ``generate`` result and their log-probabilities: from the processed
    scores the sampler drew from when sampling, else from the raw logits divided by
    ``temperature`` (greedy; or sampling under a response schema, whose mask is not counted)."""
    import torch

    ids = out.sequences[0, n_prompt:]
    rows = out.scores if sampling else out.logits
    if not len(ids):
        return [], []
    table = torch.stack([r[0] for r in rows[: len(ids)]]).float()
    if not sampling and temperature != 1.0:
        table = table / temperature
    logprobs = torch.log_softmax(table, dim=-1).gather(1, ids.view(-1, 1).to(table.device)).view(-1)
    return [int(i) for i in ids.tolist()], [float(x) for x in logprobs.tolist()]
