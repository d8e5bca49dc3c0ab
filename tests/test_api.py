"""The public API: importable from the package root, documented, and light to import."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import tapekit


def test_every_public_name_is_exported_and_documented() -> None:
    missing = []
    for name in tapekit.__all__:
        obj = getattr(tapekit, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (
                    inspect.isfunction(member) or isinstance(member, classmethod | property)
                ):
                    continue
                target = member.__func__ if isinstance(member, classmethod) else member
                target = target.fget if isinstance(target, property) else target
                if not (target.__doc__ or "").strip():
                    missing.append(f"{name}.{attr}")
    assert missing == []


def test_import_pulls_no_heavy_dependencies() -> None:
    code = (
        "import sys, tapekit; heavy = {'torch', 'transformers', 'litellm', 'fastapi', 'uvicorn', 'openai'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_evaluation_and_optimisation_load_on_first_use() -> None:
    """``import tapekit`` leaves ``tapekit.evaluate`` and ``tapekit.optimize`` unloaded; the first
    use of one of their names loads it."""
    code = (
        "import json, sys, tapekit\n"
        "before = sorted(m for m in sys.modules if m.startswith(('tapekit.evaluate', 'tapekit.optimize')))\n"
        "task = tapekit.Task\n"
        "print(json.dumps([before, 'tapekit.evaluate' in sys.modules, 'tapekit.optimize' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [[], True, False]


def test_functions_named_as_their_subpackage_stay_functions() -> None:
    """``tapekit.evaluate`` and ``tapekit.optimize`` are the functions, also after code imports
    the subpackages of the same names (made lazy, the first such import left the module there)."""
    code = (
        "import json, tapekit.evaluate, tapekit.optimize, tapekit\n"
        "from tapekit import evaluate, optimize\n"
        "print(json.dumps([callable(tapekit.evaluate), callable(evaluate), callable(optimize)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [True, True, True]


def test_import_does_not_load_the_migration_tool_and_generic_steps_still_load() -> None:
    step = {"kind": "generic_action", "original_kind": "x_action", "fields": {"a": 1}}
    code = (
        "import json, sys, tapekit\n"
        f"tape = tapekit.Tape.model_validate({{'steps': [{step!r}]}})\n"
        "migrate = sorted(m for m in sys.modules if m.startswith('tapekit.migrate'))\n"
        "print(json.dumps([type(tape.steps[0]).__module__, migrate]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["tapekit.core", []]


# The public names of `tapekit`, pinned: adding or removing one is an API change. To export a new
# name, add it here (one sorted list) as well as to tapekit/__init__.py.
EXPORTED = sorted(
    [
        "Action",
        "Demo",  # tapekit.frameworks
        "FunctionTermination",  # tapekit.frameworks
        "InputField",  # tapekit.frameworks
        "LLMFunction",  # tapekit.frameworks
        "LLMFunctionNode",  # tapekit.frameworks
        "MaxTurns",  # tapekit.frameworks
        "MonoAgent",  # tapekit.frameworks
        "MonoNode",  # tapekit.frameworks
        "OutputField",  # tapekit.frameworks
        "StepSource",  # tapekit.frameworks
        "TeamAgent",  # tapekit.frameworks
        "TextMention",  # tapekit.frameworks
        "AddDemos",
        "BootstrapFewShot",
        "InstructionSearch",
        "Reflective",
        "optimize",
        "LiteLLM",  # lazy: loaded from tapekit.llm on first access
        "LlamaCppLLM",  # lazy: loaded from tapekit.llm on first access
        "OpenAICompatibleLLM",  # lazy: loaded from tapekit.llm on first access
        "TransformersLLM",  # lazy: loaded from tapekit.llm on first access
        "Agent",
        "AgentError",
        "AgentEvent",
        "AgentStream",
        "AssistantStep",
        "AssistantThought",
        "AsyncAgentStream",
        "AsyncMainLoopStream",
        "Attachment",
        "Branch",
        "Call",
        "ControlStep",
        "ENVIRONMENT_FAILURE",
        "Environment",
        "EvalReport",
        "ExternalObservationNeeded",
        "InDoubtToolCall",
        "Fork",
        "FunctionLLM",
        "LLM",
        "LLMCall",
        "LLMOutput",
        "LLMOutputParsingFailure",
        "LLMStream",
        "MainLoopEvent",
        "MainLoopStream",
        "Node",
        "NodeRun",
        "Observation",
        "PartialStep",
        "Prompt",
        "ReconstructionError",
        "ReplayLLM",
        "ReplayResult",
        "Respond",
        "Score",
        "ScriptedLLM",
        "SetNextNode",
        "Step",
        "StepMetadata",
        "StepPresentation",
        "StepSequence",
        "StepParsingError",
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
        "Thought",
        "Tool",
        "ToolCall",
        "ToolCallRequest",
        "ToolCallingNode",
        "ToolEnvironment",
        "ToolResult",
        "TrainingText",
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
        "parse_steps",
        "reconstruct_llm_calls",
        "render_tape",
        "replay_tape",
        "rescore",
        "step_summary",
        "steps_schema",
        "tool_calls_from_output",
        "tool",
        "tool_call_key",
        "unanswered_actions",
        "view_to_messages",
    ]
)


def test_exported_names_are_pinned() -> None:
    exported = set(tapekit.__all__)
    added, removed = sorted(exported - set(EXPORTED)), sorted(set(EXPORTED) - exported)
    assert (added, removed) == ([], []), (
        f"tapekit.__all__ changed: added {added}, removed {removed}; update EXPORTED in tests/test_api.py"
    )
    assert len(tapekit.__all__) == len(exported), "a name is listed twice in tapekit.__all__"


def test_every_public_name_of_the_root_is_exported() -> None:
    """Names defined in tapekit's own modules and bound at the root are in ``__all__`` (the
    submodules themselves and the version aside)."""
    import types

    public = {
        name
        for name, value in vars(tapekit).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", "").startswith("tapekit")
    }
    assert sorted(public - set(tapekit.__all__)) == []


def test_every_tapekit_exception_derives_from_tapekit_error() -> None:
    """One root above every exception class defined in tapekit's modules (imported here, so
    optional backends whose dependencies are missing are skipped), keeping builtin bases."""
    import importlib
    import pkgutil

    import tapekit.errors

    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(tapekit.__path__, "tapekit."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # an optional extra that is not installed
            continue
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    assert len(found) >= 13
    assert sorted(name for name, cls in found.items() if not issubclass(cls, tapekit.TapekitError)) == []
    assert issubclass(tapekit.TapeNotFoundError, KeyError)
    assert issubclass(tapekit.AgentError, RuntimeError)
    assert tapekit.errors.TapekitError is tapekit.TapekitError


def test_amain_loop_sits_beside_the_other_async_entry_points() -> None:
    assert tapekit.async_main_loop is tapekit.amain_loop
    assert inspect.signature(tapekit.main_loop).parameters.keys() == (
        inspect.signature(tapekit.amain_loop).parameters.keys()
    )
