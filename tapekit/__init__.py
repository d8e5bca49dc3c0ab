"""tapekit: build, debug, evaluate and optimise LLM agents around the tape.

The tape is a typed, granular log of an agent session that is also its resumable state.
Everything a user needs is re-exported here; submodules hold the implementation.
"""

import sys
import types
from typing import TYPE_CHECKING

from tapekit._engine.runs import node_run_steps
from tapekit._version import __version__ as __version__
from tapekit.agent import Agent, Node, NodeRun
from tapekit.core import (
    Action,
    Attachment,
    Branch,
    Call,
    ControlStep,
    Fork,
    LLMOutput,
    Observation,
    PartialStep,
    Prompt,
    Respond,
    SetNextNode,
    Step,
    StepMetadata,
    StepPresentation,
    StepSequence,
    StopStep,
    Tape,
    TapeMetadata,
    Thought,
    ToolCallRequest,
    UnknownStepKindError,
)
from tapekit.dialog import (
    AssistantStep,
    AssistantThought,
    SystemStep,
    ToolCall,
    ToolResult,
    UserStep,
    tool_calls_from_output,
    view_to_messages,
)
from tapekit.effects import InDoubtToolCall, tool_call_key
from tapekit.environment import (
    ENVIRONMENT_FAILURE,
    Environment,
    ExternalObservationNeeded,
    Tool,
    ToolEnvironment,
    UnknownActionError,
    tool,
    unanswered_actions,
)
from tapekit.errors import AgentError, ReconstructionError, TapekitError
from tapekit.events import AgentEvent, AgentStream, AsyncAgentStream
from tapekit.llm import LLM, FunctionLLM, LLMCall, LLMStream, ReplayLLM, ScriptedLLM, TrainingText
from tapekit.nodes import ToolCallingNode
from tapekit.orchestrator import (
    AsyncMainLoopStream,
    MainLoopEvent,
    MainLoopStream,
    ReplayResult,
    amain_loop,
    areplay_tape,
    async_main_loop,
    main_loop,
    reconstruct_llm_calls,
    replay_tape,
)
from tapekit.rendering import render_tape, step_summary
from tapekit.store import TapeFilter, TapeInfo, TapeNotFoundError, TapeStore, open_store
from tapekit.structured import (
    LLMOutputParsingFailure,
    StepParsingError,
    StructuredNode,
    parse_steps,
    steps_schema,
)
from tapekit.views import TapeView, TapeViewStack, cached_fold

if TYPE_CHECKING:  # what type checkers see of the names loaded lazily below
    from tapekit.evaluate import EvalReport, Score, Task, aevaluate, evaluate, rescore
    from tapekit.frameworks import (
        Demo,
        FunctionTermination,
        InputField,
        LLMFunction,
        LLMFunctionNode,
        MaxTurns,
        MonoAgent,
        MonoNode,
        OutputField,
        StepSource,
        TeamAgent,
        TextMention,
    )
    from tapekit.llm import LiteLLM, LlamaCppLLM, OpenAICompatibleLLM, TransformersLLM
    from tapekit.optimize import AddDemos, BootstrapFewShot, InstructionSearch, Reflective, optimize

# names loaded from their module on first access, so that `import tapekit` stays light: the LLM
# backends (tapekit.llm), the low-code frameworks (tapekit.frameworks), evaluation and prompt
# optimisation. `evaluate` and `optimize` are functions named as their own subpackages: the
# package's class below keeps the import system from binding the subpackage over the name.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("EvalReport", "Score", "Task", "aevaluate", "evaluate", "rescore"), "tapekit.evaluate"),
    **dict.fromkeys(
        ("AddDemos", "BootstrapFewShot", "InstructionSearch", "Reflective", "optimize"), "tapekit.optimize"
    ),
    **dict.fromkeys(("LiteLLM", "LlamaCppLLM", "OpenAICompatibleLLM", "TransformersLLM"), "tapekit.llm"),
    **dict.fromkeys(
        (
            "Demo",
            "FunctionTermination",
            "InputField",
            "LLMFunction",
            "LLMFunctionNode",
            "MaxTurns",
            "MonoAgent",
            "MonoNode",
            "OutputField",
            "StepSource",
            "TeamAgent",
            "TextMention",
        ),
        "tapekit.frameworks",
    ),
}


def __getattr__(name: str) -> object:
    """``tapekit.OpenAICompatibleLLM``, ``tapekit.MonoAgent`` …: imported when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tapekit' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


_SHADOWED = frozenset({"evaluate", "optimize"})


class _Package(types.ModuleType):
    """``tapekit`` itself: importing ``tapekit.evaluate`` (the subpackage) does not rebind the
    name ``tapekit.evaluate``, which stays the function (the same for ``optimize``)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return  # the import system binding the subpackage: the name is the function's
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "ENVIRONMENT_FAILURE",
    "LLM",
    "Action",
    "AddDemos",
    "Agent",
    "AgentError",
    "AgentEvent",
    "AgentStream",
    "AssistantStep",
    "AssistantThought",
    "AsyncAgentStream",
    "AsyncMainLoopStream",
    "Attachment",
    "BootstrapFewShot",
    "Branch",
    "Call",
    "ControlStep",
    "Demo",  # tapekit.frameworks
    "Environment",
    "EvalReport",
    "ExternalObservationNeeded",
    "Fork",
    "FunctionLLM",
    "FunctionTermination",  # tapekit.frameworks
    "InDoubtToolCall",
    "InputField",  # tapekit.frameworks
    "InstructionSearch",
    "LLMCall",
    "LLMFunction",  # tapekit.frameworks
    "LLMFunctionNode",  # tapekit.frameworks
    "LLMOutput",
    "LLMOutputParsingFailure",
    "LLMStream",
    "LiteLLM",
    "LlamaCppLLM",
    "MainLoopEvent",
    "MainLoopStream",
    "MaxTurns",  # tapekit.frameworks
    "MonoAgent",  # tapekit.frameworks
    "MonoNode",  # tapekit.frameworks
    "Node",
    "NodeRun",
    "Observation",
    "OpenAICompatibleLLM",
    "OutputField",  # tapekit.frameworks
    "PartialStep",
    "Prompt",
    "ReconstructionError",
    "Reflective",
    "ReplayLLM",
    "ReplayResult",
    "Respond",
    "Score",
    "ScriptedLLM",
    "SetNextNode",
    "Step",
    "StepMetadata",
    "StepParsingError",
    "StepPresentation",
    "StepSequence",
    "StepSource",  # tapekit.frameworks
    "StopStep",
    "StructuredNode",
    "SystemStep",
    "Tape",
    "TapeFilter",
    "TapeInfo",
    "TapeMetadata",
    "TapeNotFoundError",
    "TapeStore",
    "TapeView",
    "TapeViewStack",
    "TapekitError",
    "Task",
    "TeamAgent",  # tapekit.frameworks
    "TextMention",  # tapekit.frameworks
    "Thought",
    "Tool",
    "ToolCall",
    "ToolCallRequest",
    "ToolCallingNode",
    "ToolEnvironment",
    "ToolResult",
    "TrainingText",
    "TransformersLLM",
    "UnknownActionError",
    "UnknownStepKindError",
    "UserStep",
    "aevaluate",
    "amain_loop",
    "areplay_tape",
    "async_main_loop",
    "cached_fold",
    "evaluate",
    "main_loop",
    "node_run_steps",
    "open_store",
    "optimize",
    "parse_steps",
    "reconstruct_llm_calls",
    "render_tape",
    "replay_tape",
    "rescore",
    "step_summary",
    "steps_schema",
    "tool",
    "tool_call_key",
    "tool_calls_from_output",
    "unanswered_actions",
    "view_to_messages",
]
