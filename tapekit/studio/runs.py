"""What the Studio does to tapes: register agents, advance a tape by one step or to the end, and
edit, delete or append steps. Every function returns a **new** tape whose ``parent_id`` is the
tape it came from; nothing here changes a stored tape.

This module has no web code, so the same operations are easy to test and to script.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from tapekit._engine.moves import next_move
from tapekit.agent import Agent
from tapekit.core import Step, StepMetadata, Tape, TapeMetadata, find_step_class, new_id, step_kinds
from tapekit.environment import Environment, unanswered_actions
from tapekit.errors import TapekitError
from tapekit.llm.base import LLMCall
from tapekit.orchestrator import amain_loop
from tapekit.recording import SessionRecorder
from tapekit.store.base import TapeStore

AgentSource = str | Agent | tuple[Agent, Environment] | Callable[[], Agent | tuple[Agent, Environment | None]]
"""What may register an agent: ``"module:attr"``, an agent, ``(agent, environment)``, or a
callable returning either."""

STUDIO_AUTHOR = "studio"


class StepInputError(TapekitError, ValueError):
    """A step typed into the Studio is not valid JSON or not a valid step (the message says why)."""


class NothingToDoError(TapekitError, RuntimeError):
    """Advancing the tape would add nothing: it waits for the outside world, or has no agent."""


@dataclass(frozen=True, slots=True)
class RegisteredAgent:
    """An agent the Studio can run, with the environment that answers its actions (if any)."""

    name: str
    agent: Agent
    environment: Environment | None
    source: str


def _resolve(source: AgentSource) -> tuple[Any, str]:
    if isinstance(source, str):
        from tapekit.batch import load_object

        return load_object(source), source
    return source, getattr(source, "__qualname__", type(source).__name__)


def load_agents(
    sources: Iterable[AgentSource] | Mapping[str, AgentSource] | None,
) -> dict[str, RegisteredAgent]:
    """Resolve agent sources into registered agents, by name (a mapping's keys name them,
    otherwise the agent's own name). Raises ``ValueError`` naming the source that is wrong."""
    if sources is None:
        return {}
    items = list(sources.items()) if isinstance(sources, Mapping) else [(None, s) for s in sources]
    out: dict[str, RegisteredAgent] = {}
    for key, source in items:
        obj, label = _resolve(source)
        if callable(obj) and not isinstance(obj, Agent):
            try:
                obj = obj()
            except Exception as e:
                raise ValueError(f"agent {label}: calling it failed: {type(e).__name__}: {e}") from e
        environment = None
        if isinstance(obj, tuple) and len(obj) == 2:
            obj, environment = obj
        if not isinstance(obj, Agent) or not (environment is None or isinstance(environment, Environment)):
            raise ValueError(
                f"agent {label}: expected an Agent or (Agent, Environment), got {type(obj).__name__}"
            )
        if obj.manager is not None:
            raise ValueError(f"agent {label}: {obj.full_name!r} is a subagent; register its root agent")
        name = key or obj.name
        if name in out:
            raise ValueError(f"two registered agents are named {name!r} ({out[name].source} and {label})")
        out[name] = RegisteredAgent(name=name, agent=obj, environment=environment, source=label)
    return out


# --------------------------------------------------------------------------- advancing a tape


@dataclass(frozen=True, slots=True)
class RunResult:
    """A tape advanced by the Studio: the new tape (a child of the old one), how many steps it
    added, and why it stopped (``node run``, ``environment``, ``done``, ``waiting``, ``error``,
    ``max loops``)."""

    tape: Tape[Any, Any]
    added: int
    stopped: str


async def advance(
    registered: RegisteredAgent,
    tape: Tape[Any, Any],
    mode: Literal["step", "run"],
    on_llm_call: Callable[[LLMCall], None] | None = None,
    max_loops: int = 100,
    *,
    store: TapeStore | None = None,
) -> RunResult:
    """Continue ``tape`` with the agent and its environment, and return the child tape.

    ``step`` stops after one node run (the step whose ``metadata.run_end`` is true) or after one
    environment reaction: both leave a valid resume point. ``run`` goes on until the agent is
    done, waits on the outside world, fails, or has run ``max_loops`` rounds; an agent registered
    without an environment waits at its first action (nothing answers it). With a ``store``,
    the child is stored as it grows (every step and LLM call, through the main loop's recorder),
    under the id the result carries; each completed LLM call also goes to ``on_llm_call``.
    Raises :class:`NothingToDoError` when nothing could be added (e.g. the last action waits
    for the user).
    """
    environment = registered.environment
    loops = 1 if mode == "step" else max_loops
    child_id = new_id()
    recorder = SessionRecorder(store, tape, child_id, parent_id=tape.metadata.id, write_start=False)
    stopped, waiting, error = "done", "", None
    stream = amain_loop(registered.agent, tape, environment, max_loops=loops, recorder=recorder)
    events = stream.__aiter__()
    n_rounds = 0
    try:
        async for event in events:
            if event.llm_call is not None and on_llm_call is not None:
                on_llm_call(event.llm_call)
            if event.step is not None and mode == "step" and event.step.metadata.run_end:
                stopped = "node run"
                break
            if event.tape is not None:
                error = event.tape.metadata.error
                if error:
                    stopped = "error"
                    break
                if event.env_tape is not None:
                    n_rounds += 1
                    if mode == "step":
                        stopped = "environment"
                        break
            elif event.external is not None:
                stopped, waiting = "waiting", str(event.external)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    if mode == "run" and stopped == "done" and n_rounds >= loops:
        stopped = "max loops"
    steps = recorder.tape.steps
    added = len(steps) - len(tape)
    if added == 0 and not error:
        raise NothingToDoError(
            f"nothing to do: {waiting}" if waiting else "nothing to do: the agent added no steps"
        )
    made_by_agent = any(s.metadata.agent for s in steps[len(tape) :])
    meta = TapeMetadata(
        id=child_id,
        parent_id=tape.metadata.id,
        author=registered.agent.name if made_by_agent or environment is None else environment.name,
        n_added_steps=added,
        error=error,
    )
    return RunResult(
        tape=tape.model_copy(update={"steps": steps, "metadata": meta}), added=added, stopped=stopped
    )


# --------------------------------------------------------------------------- editing steps


def parse_step(text: str, metadata: StepMetadata | None = None) -> Step:
    """A step from its JSON (as the Studio shows it): the ``kind`` picks the class. Without a
    ``"metadata"`` field the step gets ``metadata`` (an edit keeps who made the step).

    Raises :class:`StepInputError` with a readable reason: bad JSON (with line and column), not
    an object, no or unknown ``kind`` (listing the known ones), or fields that do not validate.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise StepInputError(f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise StepInputError(f"a step must be a JSON object, got {type(data).__name__}")
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise StepInputError('the step has no "kind" (a string naming its step class)')
    cls = find_step_class(kind)  # a loaded class, or one from the module registered for the kind
    if cls is None:
        known = ", ".join(sorted(step_kinds()))
        raise StepInputError(f"unknown step kind {kind!r}; known kinds: {known}")
    if "metadata" not in data and metadata is not None:
        data = {**data, "metadata": metadata.model_dump()}
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or kind}: {err['msg']}" for err in e.errors()
        )
        raise StepInputError(f"invalid {kind} step: {problems}") from None


def _child(tape: Tape[Any, Any], steps: list[Step] | Any, added: int) -> Tape[Any, Any]:
    meta = TapeMetadata(
        parent_id=tape.metadata.id, author=STUDIO_AUTHOR, author_tape_id=tape.metadata.id, n_added_steps=added
    )
    return tape.model_copy(update={"steps": steps, "metadata": meta})


def _check_index(tape: Tape[Any, Any], index: int) -> None:
    if not 0 <= index < len(tape):
        raise IndexError(f"step {index} is out of range: the tape has {len(tape)} steps")


def edited_tape(tape: Tape[Any, Any], index: int, step: Step, keep_rest: bool = False) -> Tape[Any, Any]:
    """A child tape with step ``index`` replaced by ``step``.

    By default the steps after it are dropped (they were made from the old step) and the new
    step closes its node run (``run_end``), so the child is a clean resume point. With
    ``keep_rest`` the later steps stay. The new step gets a fresh id and remembers the old one
    in ``metadata.other["edited_from"]``.
    """
    _check_index(tape, index)
    old = tape.steps[index]
    other = {**step.metadata.other, "edited_from": old.metadata.id}
    update: dict[str, Any] = {"id": new_id(), "other": other}
    if not keep_rest and step.metadata.prompt_id:
        update["run_end"] = True
    new = step.model_copy(update={"metadata": step.metadata.model_copy(update=update)})
    rest = list(tape.steps[index + 1 :]) if keep_rest else []
    steps = tape.steps[:index].appended([new, *rest])
    return _child(tape, steps, 1 + len(rest))


def truncated_tape(tape: Tape[Any, Any], index: int) -> Tape[Any, Any]:
    """A child tape without step ``index`` and the steps after it: resume it to make them anew.

    Cutting inside a node run leaves that run open; resuming finishes it by asking the LLM
    again (see ``Agent.arun``).
    """
    _check_index(tape, index)
    return _child(tape, tape.steps[:index], 0)


def appended_tape(tape: Tape[Any, Any], step: Step) -> Tape[Any, Any]:
    """A child tape with ``step`` added at the end (e.g. the user's answer to an assistant)."""
    return _child(tape, tape.steps.appended([step]), 1)


def next_actor(tape: Tape[Any, Any], root_name: str | None) -> str:
    """Who moves next on ``tape`` (:func:`tapekit._engine.next_move`), in words; without the
    team's root name only the environment's turn is known."""
    if root_name is None:
        waiting = unanswered_actions(tape)
        return "the environment (answering " + waiting[-1].kind + ")" if waiting else "an agent"
    return next_move(tape, root_name).describe()
