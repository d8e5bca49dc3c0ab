"""One view of "the training tokenizer" over a Hugging Face tokenizer, a ``TransformersLLM`` or a
``LlamaCppLLM``: its fingerprint, encode/decode, and chat-template rendering with the checks
that make the assistant span findable."""

from __future__ import annotations

import hashlib
from typing import Any

from tapekit.errors import TrainingError
from tapekit.llm.base import answer_text
from tapekit.llm.llamacpp import plain_messages


class ChatTokenizer:
    """The training tokenizer: wraps a Hugging Face tokenizer, a ``TransformersLLM`` or a
    ``LlamaCppLLM`` (anything with ``tokenizer_fingerprint()``)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._hf: Any = None
        self._llama: Any = None
        if hasattr(source, "apply_chat_template"):
            self._hf = source
        elif type(source).__name__ == "TransformersLLM" or hasattr(source, "prompt_ids"):
            self._hf = source.tokenizer
        elif hasattr(source, "piece") and hasattr(source, "tokenizer_fingerprint"):
            self._llama = source
        else:
            raise TrainingError(
                f"cannot use {type(source).__name__} as the training tokenizer: give a Hugging Face "
                "tokenizer, a TransformersLLM or a LlamaCppLLM"
            )
        self._fingerprint: str | None = None

    @property
    def template(self) -> str:
        """The chat template text ('' when there is none)."""
        if self._hf is not None:
            value = getattr(self._hf, "chat_template", None)
            return value if isinstance(value, str) else ""
        return str(self._llama.load().metadata.get("tokenizer.chat_template") or "")

    @property
    def template_name(self) -> str:
        """A short name for the template in error messages: ``chat template sha256:<12 hex>``."""
        return f"chat template sha256:{hashlib.sha256(self.template.encode()).hexdigest()[:12]}"

    def fingerprint(self) -> str:
        """The tokenizer fingerprint (see :mod:`tapekit.llm.fingerprint`)."""
        if self._fingerprint is None:
            if self._hf is not None:
                from tapekit.llm.fingerprint import hf_tokenizer_fingerprint

                self._fingerprint = hf_tokenizer_fingerprint(self._hf)
            else:
                self._fingerprint = self._llama.tokenizer_fingerprint()
        return self._fingerprint

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens parsed, none added)."""
        if self._hf is not None:
            return [int(i) for i in self._hf(text, add_special_tokens=False)["input_ids"]]
        llama = self._llama.load()
        return [int(i) for i in llama.tokenize(text.encode(), add_bos=False, special=True)]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens written out."""
        if self._hf is not None:
            return str(self._hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
        return str(self._llama.detokenize(ids, special=True))

    @property
    def eos(self) -> str:
        """The end-of-turn token text."""
        if self._hf is not None:
            return str(self._hf.eos_token or "")
        llama = self._llama.load()
        return str(self._llama.detokenize([llama.token_eos()], special=True))

    def render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        """The chat template applied to ``messages`` (tool calls and results written as text,
        as the local backends show them)."""
        plain = plain_messages(messages)
        if self._hf is not None:
            if not self.template:
                raise TrainingError("the training tokenizer has no chat template: cannot render prompts")
            gen = generation_prompt
            return str(self._hf.apply_chat_template(plain, tokenize=False, add_generation_prompt=gen))
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        llama = self._llama.load()
        bos = self._llama.detokenize([llama.token_bos()], special=True)
        formatter = Jinja2ChatFormatter(
            template=self.template, eos_token=self.eos, bos_token=bos, add_generation_prompt=generation_prompt
        )
        return str(formatter(messages=plain).prompt)  # type: ignore[arg-type]

    def render_call(self, messages: list[dict[str, Any]], output: Any) -> tuple[list[int], list[int]]:
        """(prompt ids, completion ids) of one LLM call re-rendered with the chat template: the
        prompt with the generation prompt, the completion as the answer text plus end-of-turn.

        The template must mark the assistant turn: rendering with the generation prompt must
        add something, and the whole conversation with the answer as an assistant message must
        begin with prompt + answer. Otherwise the assistant span cannot be found, which is an
        error naming the template (never a mask over everything).
        """
        prompt_text = self.render(messages, True)
        if prompt_text == self.render(messages, False):
            raise TrainingError(
                f"{self.template_name} has no assistant marker (add_generation_prompt adds nothing): "
                "the assistant spans cannot be found"
            )
        answer = answer_text(output)
        full = self.render([*messages, {"role": "assistant", "content": answer}], False)
        if not full.startswith(prompt_text + answer):
            raise TrainingError(
                f"{self.template_name} does not render an assistant turn as the generation prompt "
                f"followed by the answer (rendered: {full[max(0, len(prompt_text) - 40) :][:100]!r}): "
                "the assistant spans cannot be found"
            )
        return self.encode(prompt_text), self.encode(answer + self.eos)
