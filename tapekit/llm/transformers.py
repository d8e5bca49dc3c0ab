"""A local Hugging Face model (CPU or CUDA): the backend that training produces and evaluates.

By default it loads the embedded SmolLM2-135M-Instruct from the same GGUF file that
``LlamaCppLLM`` runs (transformers dequantizes it to full precision), so the embedded model is
also the trainable one. Any local model directory, or one saved after fine-tuning, loads the
same way. torch and transformers are imported on first use only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from typing import Any

from pydantic import PrivateAttr

from tapekit._sync import iterate_in_thread
from tapekit.core import LLMOutput, Prompt
from tapekit.llm.base import LLM, LLMError, LLMEvent, TrainingText, answer_text
from tapekit.llm.llamacpp import plain_messages, smollm2_path

__all__ = ["TransformersLLM"]


class TransformersLLM(LLM):
    """A causal LM run with ``transformers`` in this process.

    ``model_path`` is a local model directory (or a directory holding ``gguf_file``); both
    default to the embedded SmolLM2 GGUF. ``device`` is ``"cpu"``, ``"cuda"`` or ``"auto"``.
    ``parameters`` go to ``generate`` (default: greedy, 256 new tokens). There is no
    constrained decoding here: structured nodes fall back to parsing and validating.
    """

    model_name: str = "smollm2-135m-instruct"
    model_path: str | None = None
    gguf_file: str | None = None
    device: str = "auto"
    parameters: dict[str, Any] = {"max_new_tokens": 256, "do_sample": False}
    _model: Any = PrivateAttr(None)
    _tokenizer: Any = PrivateAttr(None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def load(self) -> tuple[Any, Any]:
        """The (model, tokenizer) pair, loaded on first use."""
        with self._lock:
            if self._model is None:
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
                local = os.path.isdir(path)
                extra: dict[str, Any] = {"gguf_file": gguf} if gguf else {}
                self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local, **extra)
                model = AutoModelForCausalLM.from_pretrained(
                    path, local_files_only=local, dtype=torch.float32, **extra
                )
                device = self.device
                if device == "auto":
                    device = "cuda" if torch.cuda.is_available() else "cpu"
                self._model = model.to(device).eval()
            return self._model, self._tokenizer

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's tokenizer."""
        return len(self.load()[1](text, add_special_tokens=False)["input_ids"])

    def render_prompt(self, prompt: Prompt) -> str:
        """The prompt as the model reads it: its chat template with the generation prompt."""
        tokenizer = self.load()[1]
        messages = plain_messages(prompt.messages)
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def make_training_text(self, prompt: Prompt, output: LLMOutput) -> TrainingText:
        """Chat-template text; the predicted span is the answer plus the end-of-turn token."""
        tokenizer = self.load()[1]
        completion = answer_text(output) + (tokenizer.eos_token or "")
        text = self.render_prompt(prompt) + completion
        return TrainingText(text=text, n_predicted=len(completion), prompt_id=prompt.id)

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        from transformers import TextIteratorStreamer

        model, tokenizer = self.load()
        text = self.render_prompt(prompt)
        inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        n_new: list[int] = []
        failure: list[BaseException] = []

        def generate() -> None:  # feeds the streamer; the streamer is read on the event loop
            try:
                with self._lock:
                    out = model.generate(
                        **inputs, streamer=streamer, pad_token_id=tokenizer.eos_token_id, **self.parameters
                    )
                n_new.append(int(out.shape[1] - inputs["input_ids"].shape[1]))
            except BaseException as e:
                failure.append(e)
                streamer.end()

        threading.Thread(target=generate, name="tapekit-transformers", daemon=True).start()
        pieces: list[str] = []
        async for piece in iterate_in_thread(lambda: streamer, "tapekit-transformers-stream"):
            if piece:
                pieces.append(piece)
                yield LLMEvent(chunk=piece)
        if failure:
            raise LLMError(f"transformers model {self.model_name!r} failed: {failure[0]}") from failure[0]
        content = "".join(pieces)
        yield LLMEvent(
            output=LLMOutput(content=content or None),
            prompt_tokens=int(inputs["input_ids"].shape[1]),
            output_tokens=n_new[0] if n_new else self.count_tokens(content),
        )
