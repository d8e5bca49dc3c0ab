"""The environment: the only part of the loop that acts on the world.

``environment.react(tape)`` finds the actions at the tape's end that have no observation yet
and appends one observation for each. :class:`ToolEnvironment` does that for plain Python
functions: their JSON schemas come from type hints and docstrings, sync functions run in a
thread pool, async ones on the loop, and a tool that raises becomes an error observation.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from tapekit._sync import run_sync
from tapekit.core import Action, Observation, Tape
from tapekit.dialog import AssistantStep, ToolCall, ToolResult
from tapekit.effects import EFFECTS, Effect, EffectInDoubt, call_key
from tapekit.effects import journal as current_journal
from tapekit.errors import ExternalObservationNeeded, TapekitError

ENVIRONMENT_FAILURE = "environment_failure"
"""The ``metadata.other`` key under which an environment says, on the observation that ends an
episode, that the episode ended because the environment failed (a browser that crashed and
could not replay, a page that never loaded or stopped answering), not because of the agent."""


class UnknownActionError(TapekitError, TypeError):
    """The environment was given an action it has no handler for (a configuration error)."""


def unanswered_actions(tape: Tape[Any, Any]) -> list[Action]:
    """The actions after the tape's last observation: what the environment must answer."""
    actions: list[Action] = []
    for step in reversed(tape.steps):
        if isinstance(step, Observation):
            break
        if isinstance(step, Action):
            actions.append(step)
    actions.reverse()
    return actions


def unanswered_indices(tape: Tape[Any, Any]) -> list[int]:
    """The indices in ``tape.steps`` of :func:`unanswered_actions`."""
    steps = tape.steps
    at: list[int] = []
    for i in range(len(steps) - 1, -1, -1):
        step = steps[i]
        if isinstance(step, Observation):
            break
        if isinstance(step, Action):
            at.append(i)
    at.reverse()
    return at


def environment_failure(tape: Tape[Any, Any]) -> str | None:
    """Why the environment ended ``tape``'s episode by failing (the message of its last
    observation marked with :data:`ENVIRONMENT_FAILURE`), or ``None``. Such an episode says
    nothing about the agent: RL leaves it out of its groups, as it would a rollout that raised."""
    for step in reversed(tape.steps):
        if isinstance(step, Observation):
            why = step.metadata.other.get(ENVIRONMENT_FAILURE)
            return str(why) if why else None
    return None


class Environment:
    """Base class: override :meth:`areact` (async) or :meth:`react` (sync), not both."""

    name: str = "environment"

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """The tape with observations for its unanswered actions appended."""
        if type(self).react is Environment.react:
            raise NotImplementedError(f"{type(self).__name__} implements neither react nor areact")
        return await asyncio.to_thread(self.react, tape)

    def react(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """Sync version of :meth:`areact`."""
        return run_sync(self.areact(tape))

    def _continued(self, tape: Tape[Any, Any], observations: Sequence[Observation]) -> Tape[Any, Any]:
        return tape.with_new_steps(observations, author=self.name)


_SECTION = re.compile(r"^(args|arguments|parameters|params|returns?|raises|yields|examples?|notes?):$", re.I)
_GOOGLE_PARAM = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[\w\[\], |.]+\s+)?(\w+)\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph and the per-parameter help of a Google- or Sphinx-style docstring."""
    description: list[str] = []
    params: dict[str, str] = {}
    section, current, param_indent = "description", None, None
    for line in inspect.cleandoc(doc or "").splitlines():
        text = line.strip()
        indent = len(line) - len(line.lstrip())
        if header := _SECTION.match(text):
            is_args = header.group(1).lower() in {"args", "arguments", "parameters", "params"}
            section, current, param_indent = ("args" if is_args else "other"), None, None
        elif sphinx := _SPHINX_PARAM.match(text):
            section, current, param_indent = "args", sphinx.group(1), indent
            params[current] = sphinx.group(2).strip()
        elif text.startswith(":"):
            section = "other"
        elif section == "description":
            description.append(text)
        elif section == "args" and text:
            google = _GOOGLE_PARAM.match(text)
            if google and (param_indent is None or indent <= param_indent):
                param_indent, current = indent, google.group(1)
                params[current] = google.group(2).strip()
            elif current:
                params[current] = f"{params[current]} {text}".strip()
    paragraphs = "\n".join(description).strip().split("\n\n")
    return " ".join(paragraphs[0].split()), params


class Tool:
    """A Python function offered to the LLM: its name, JSON schema and argument validation.

    ``effect`` says what running it again does (:mod:`tapekit.effects`): ``"read"`` (the
    default) and ``"idempotent"`` are run again when a session resumes (an idempotent tool
    passes :func:`~tapekit.effects.tool_call_key` on to the outside world); a ``"once"`` tool
    runs at most once per call in a stored session, and ``reconcile(call)`` (optional, sync or
    async) answers for a call that a crash left in doubt: the effect's result,
    :data:`~tapekit.effects.NOT_DONE` or :data:`~tapekit.effects.UNKNOWN`.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        *,
        effect: Effect = "read",
        reconcile: Callable[[ToolCall], Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"a tool must be callable, got {fn!r}")
        if effect not in EFFECTS:
            raise ValueError(f"a tool's effect is one of {', '.join(map(repr, EFFECTS))}, not {effect!r}")
        if reconcile is not None and effect != "once":
            raise ValueError(f"reconcile= is for tools with effect='once' (this one is {effect!r})")
        if reconcile is not None and not callable(reconcile):
            raise TypeError(f"reconcile must be callable, got {reconcile!r}")
        self.effect: Effect = effect
        self.reconcile = reconcile
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", type(fn).__name__))
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__ if not inspect.isroutine(fn) else None
        )
        self.description, param_help = _parse_docstring(fn.__doc__ or "")
        fields: dict[str, Any] = {}
        hints = _type_hints(fn)
        self._positional_only: list[str] = []
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if param.kind is param.POSITIONAL_ONLY:
                self._positional_only.append(pname)
            annotation = hints.get(pname, param.annotation)
            if annotation is inspect.Parameter.empty or isinstance(annotation, str):
                annotation = Any  # unresolvable forward reference: accept any JSON value
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (annotation, Field(default, description=param_help.get(pname)))
        self.arguments_model: type[BaseModel] = create_model(  # type: ignore[call-overload]
            f"{self.name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        self._schema: str | None = None

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema (``{"type": "function", "function": {...}}``).

        Built once (pydantic's JSON-schema generation costs about a millisecond, and nodes ask
        for the schemas on every prompt); each call returns a fresh copy that is safe to edit.
        """
        if self._schema is None:
            parameters = self.arguments_model.model_json_schema()
            parameters.pop("title", None)
            for prop in parameters.get("properties", {}).values():
                prop.pop("title", None)
            function = {"name": self.name, "description": self.description, "parameters": parameters}
            self._schema = json.dumps({"type": "function", "function": function})
        return json.loads(self._schema)

    def bind(self, arguments: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Validate ``arguments`` against the signature (``ValidationError`` if they do not fit)
        and return the positional and keyword arguments to call the function with."""
        values = self.arguments_model.model_validate(arguments)
        args = [getattr(values, name) for name in self._positional_only]
        kwargs = {k: getattr(values, k) for k in type(values).model_fields if k not in self._positional_only}
        return args, kwargs

    async def acall(self, arguments: dict[str, Any]) -> Any:
        """Validate ``arguments`` against the signature and run the tool."""
        return await self.invoke(*self.bind(arguments))

    async def invoke(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run the tool on arguments already bound by :meth:`bind`: async tools on the loop,
        sync ones in a worker thread."""
        if self.is_async:
            return await self.fn(*args, **kwargs)
        return await asyncio.to_thread(self.fn, *args, **kwargs)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    effect: Effect = "read",
    reconcile: Callable[[ToolCall], Any] | None = None,
) -> Any:
    """Declare a :class:`Tool` where the function is written: ``@tool`` or
    ``@tool(effect="once", reconcile=look_up)``. Returns the Tool (callable like the function)."""

    def make(f: Callable[..., Any]) -> Tool:
        return Tool(f, name, effect=effect, reconcile=reconcile)

    return make if fn is None else make(fn)


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Resolved parameter types; if one cannot be resolved, the others still are."""
    import typing

    try:
        return typing.get_type_hints(fn)
    except Exception:
        pass
    hints: dict[str, Any] = {}
    namespace = getattr(fn, "__globals__", {})
    for name, param in inspect.signature(fn).parameters.items():
        annotation = param.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # what get_type_hints does, per parameter
            except Exception:
                continue
        if annotation is not inspect.Parameter.empty:
            hints[name] = annotation
    return hints


_ANY = TypeAdapter(Any)


def _jsonable(value: Any) -> Any:
    """A tool's return value as JSON data: models, dataclasses, dates and nested containers of
    them are converted; anything else unserialisable becomes its ``str``."""
    try:
        return _ANY.dump_python(value, mode="json")
    except Exception:
        return str(value)


ActionHandler = Callable[[Any], Observation | Awaitable[Observation]]


class ToolEnvironment(Environment):
    """Answers :class:`~tapekit.dialog.ToolCall` actions by calling Python functions.

    - A tool that raises, an unknown tool name or arguments that do not fit the signature give a
      :class:`ToolResult` with ``error`` set: the LLM made the mistake, so the agent sees it.
    - Several calls at the tape's end run concurrently; results keep the calls' order.
    - ``handlers`` maps your own action classes to functions returning an observation.
    - An :class:`~tapekit.dialog.AssistantStep` (a message to the user) raises
      :class:`ExternalObservationNeeded`; so does any handler that raises it.
    - Any other action is a configuration error: :class:`UnknownActionError`.
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any] | Tool] = (),
        handlers: dict[type[Action], ActionHandler] | None = None,
        name: str = "environment",
    ) -> None:
        self.tools: dict[str, Tool] = {}
        for item in tools:
            tool = item if isinstance(item, Tool) else Tool(item)
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.handlers = dict(handlers or {})
        self.name = name

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The schemas of all tools, to put in a prompt's ``tools``."""
        return [tool.schema() for tool in self.tools.values()]

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """Answer every unanswered action at the tape's end, concurrently, in their order."""
        at = unanswered_indices(tape)
        steps = tape.steps
        observations = await asyncio.gather(*(self._answer(steps[i], tape, i) for i in at))
        return self._continued(tape, observations)

    async def _answer(self, action: Action, tape: Tape[Any, Any], index: int) -> Observation:
        for cls, handler in self.handlers.items():
            if isinstance(action, cls):
                result = handler(action)
                if inspect.isawaitable(result):
                    result = await result
                if not isinstance(result, Observation):
                    raise TypeError(
                        f"handler for {cls.__name__} returned {type(result).__name__}, not an Observation"
                    )
                return result
        if isinstance(action, ToolCall):
            return await self._call_tool(action, tape, index)
        if isinstance(action, AssistantStep):
            raise ExternalObservationNeeded(action, "the assistant's message waits for the user")
        known = ["tool_call", *(c.__name__ for c in self.handlers)]
        raise UnknownActionError(
            f"{self.name} cannot answer action {action.kind!r} ({type(action).__name__}); "
            f"it handles: {', '.join(known)}"
        )

    async def _call_tool(self, call: ToolCall, tape: Tape[Any, Any], index: int) -> ToolResult:
        result = ToolResult(call_id=call.call_id, name=call.name)
        tool = self.tools.get(call.name)
        if tool is None:
            result.error = f"unknown tool {call.name!r}; available tools: {', '.join(self.tools) or 'none'}"
            return result
        try:
            args, kwargs = tool.bind(call.arguments)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in e.errors()
            )
            result.error = f"invalid arguments for {call.name}: {problems}"
            return result

        async def attempt() -> tuple[Any, str | None]:
            try:
                return _jsonable(await tool.invoke(args, kwargs)), None
            except (ExternalObservationNeeded, EffectInDoubt):
                raise
            except Exception as e:
                return None, f"{type(e).__name__}: {e}"

        return await self._run_effect(call, tape, index, tool.effect, attempt, tool.reconcile)

    async def _run_effect(
        self,
        call: ToolCall,
        tape: Tape[Any, Any],
        index: int,
        effect: Effect,
        attempt: Callable[[], Awaitable[tuple[Any, str | None]]],
        reconcile: Callable[[ToolCall], Any] | None = None,
    ) -> ToolResult:
        """The result of ``call`` by ``attempt`` (which answers ``(content, error)``), run with
        the call's key (:func:`~tapekit.effects.tool_call_key`) and, for a ``once`` effect in a
        stored session, at most once (:mod:`tapekit.effects`)."""
        result = ToolResult(call_id=call.call_id, name=call.name)
        journal = current_journal()

        def key() -> str:  # worked out only if asked for: a subagent's key hashes its steps
            return call.metadata.id if journal is None else journal.key(tape, index)

        with call_key(key) as lazy:
            if journal is not None and effect == "once":
                result.content, result.error, how = await journal.run_once(
                    lazy.get(), call, attempt, reconcile, _jsonable
                )
                if how != "ran":
                    result.metadata.other["effect"] = how
                return result
            try:
                result.content, result.error = await attempt()
            except EffectInDoubt as e:
                result.error = f"EffectInDoubt: {e}"
        return result
