"""LLM clients: the interface agents call, deterministic test LLMs, and replay."""

from tapekit.core import LLMOutput, Prompt, ToolCallRequest
from tapekit.llm.base import LLM, LLMCall, LLMError, LLMEvent, LLMStream, TokenTrace, TrainingText
from tapekit.llm.cached import CachedLLM
from tapekit.llm.replay import ReplayLLM, ReplayMissError
from tapekit.llm.scripted import FunctionLLM, ScriptedLLM

__all__ = [
    "LLM",
    "CachedLLM",
    "FunctionLLM",
    "LLMCall",
    "LLMError",
    "LLMEvent",
    "LLMOutput",
    "LLMStream",
    "TokenTrace",
    "Prompt",
    "ReplayLLM",
    "ReplayMissError",
    "ScriptedLLM",
    "ToolCallRequest",
    "TrainingText",
]
