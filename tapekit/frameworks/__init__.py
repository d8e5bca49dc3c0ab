"""Low-code mini-frameworks built on nodes and agents (the paper's section 3.1).

- :class:`MonoAgent` / :class:`MonoNode`: one prompt made of the tape and the step schemas;
- :class:`TeamAgent`: an AutoGen-style team (initiator, manager, workers) on one tape;
- :class:`LLMFunction` / :class:`LLMFunctionNode`: function-style prompt templates with demos.

Nodes with ``instruction`` and ``demos`` fields (:class:`Demo`) are what optimisers tune.
"""

from tapekit.frameworks.demo import Demo, DemoPick, pick_demos
from tapekit.frameworks.function import (
    InputField,
    LLMFunction,
    LLMFunctionError,
    LLMFunctionNode,
    OutputField,
    StepSource,
)
from tapekit.frameworks.mono import MonoAgent, MonoNode, estimate_tokens, token_counter
from tapekit.frameworks.team import (
    AllOf,
    AnyOf,
    FunctionTermination,
    InitiatorNode,
    ManagerNode,
    MaxTurns,
    TeamAgent,
    TeamMessage,
    TeamTerminated,
    Termination,
    TextMention,
    WorkerNode,
    conversation,
)

__all__ = [
    "AllOf",
    "AnyOf",
    "Demo",
    "DemoPick",
    "FunctionTermination",
    "InitiatorNode",
    "InputField",
    "LLMFunction",
    "LLMFunctionError",
    "LLMFunctionNode",
    "ManagerNode",
    "MaxTurns",
    "MonoAgent",
    "MonoNode",
    "OutputField",
    "StepSource",
    "TeamAgent",
    "TeamMessage",
    "TeamTerminated",
    "Termination",
    "TextMention",
    "WorkerNode",
    "conversation",
    "estimate_tokens",
    "pick_demos",
    "token_counter",
]
