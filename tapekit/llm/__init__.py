"""LLM clients: the interface agents call, deterministic test LLMs, replay, and the backends.

The backends (``OpenAICompatibleLLM``, ``LlamaCppLLM``, ``TransformersLLM``, ``LiteLLM``; and
``BatchedTransformersLLM``, ``ServerPoolLLM``, which the RL rollouts sample from) are loaded on
first access (module ``__getattr__``), so importing this package stays light.
:class:`WrapperLLM` is the base of LLMs in front of another one (:class:`CachedLLM`, the
batch runner's concurrency limit).
"""

import importlib
from typing import Any

from tapekit.core import LLMOutput, Prompt, ToolCallRequest
from tapekit.llm.base import (
    LLM,
    LLMCall,
    LLMError,
    LLMEvent,
    LLMStream,
    TokenTrace,
    TrainingText,
    llm_calls_of,
)
from tapekit.llm.cached import CachedLLM
from tapekit.llm.fingerprint import hf_tokenizer_fingerprint
from tapekit.llm.replay import ReplayLLM, ReplayMissError
from tapekit.llm.scripted import FunctionLLM, ScriptedLLM
from tapekit.llm.wrapper import WrapperLLM

# backend name (or a backend's helper) -> the module that defines it, imported on first access
_BACKENDS = {
    "BatchedTransformersLLM": "tapekit.llm.batched",
    "ServerPoolLLM": "tapekit.llm.server_pool",
    "LiteLLM": "tapekit.llm.litellm",
    "LlamaCppLLM": "tapekit.llm.llamacpp",
    "OpenAICompatibleLLM": "tapekit.llm.openai_compat",
    "TransformersLLM": "tapekit.llm.transformers",
    "export_lora_gguf": "tapekit.llm.gguf_lora",
    "export_model_gguf": "tapekit.llm.gguf_model",
    # the llama.cpp backend's helpers: the SmolLM2 GGUF file, and messages as plain text
    "plain_messages": "tapekit.llm.llamacpp",
    "smollm2_path": "tapekit.llm.llamacpp",
}


def __getattr__(name: str) -> Any:
    """The backend classes (and their helpers), imported when first asked for."""
    module = _BACKENDS.get(name)
    if module is None:
        raise AttributeError(f"module 'tapekit.llm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_BACKENDS})


__all__ = [
    "LLM",
    "BatchedTransformersLLM",
    "CachedLLM",
    "FunctionLLM",
    "LLMCall",
    "LLMError",
    "LLMEvent",
    "LLMOutput",
    "LLMStream",
    "LiteLLM",
    "LlamaCppLLM",
    "OpenAICompatibleLLM",
    "Prompt",
    "ReplayLLM",
    "ReplayMissError",
    "ScriptedLLM",
    "ServerPoolLLM",
    "TokenTrace",
    "ToolCallRequest",
    "TrainingText",
    "TransformersLLM",
    "WrapperLLM",
    "export_lora_gguf",
    "export_model_gguf",
    "hf_tokenizer_fingerprint",
    "llm_calls_of",
    "plain_messages",
    "smollm2_path",
]
