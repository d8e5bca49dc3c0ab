"""A person in the loop: sessions that wait for someone, and tools that need their approval.

A session stops when the environment raises :class:`~tapekit.environment.ExternalObservationNeeded`:
the agent sent the user a message (an :class:`~tapekit.dialog.AssistantStep`), or wants to run
a tool marked with :func:`approval_required`. With a store, :func:`run_session` saves the tape as
it runs and tags it ``waiting``; any other process, hours later, loads it with
:func:`load_session`, adds the person's answer (:func:`reply`, :func:`approve`, :func:`reject`)
and calls :func:`run_session` again. Nothing but the tape is needed to resume.

An approval is recorded on the tape as an :class:`ApprovalDecision` step (with the edited
arguments, if the person changed them) **before** the tool runs; :class:`ApprovalEnvironment`
then runs the tool with those arguments, or answers a rejection with a :class:`ToolResult`
whose ``error`` says so, which the agent sees like any tool error. A call takes one decision:
:func:`approve` and :func:`reject` refuse a call that already has one, and should a tape hold
two anyway, the environment acts on the first.

A ``once`` tool call that a crash (or the tool itself) left in doubt (:mod:`tapekit.effects`)
also waits for a person: :func:`waiting_on` with the store names it, and
:func:`resolve_in_doubt` records what became of it (done, failed, retry) before the session
runs on.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tapekit._sync import run_sync
from tapekit.agent import Agent
from tapekit.core import Action, ControlStep, Observation, Step, StepMetadata, Tape
from tapekit.dialog import AssistantStep, ToolCall, ToolResult, UserStep
from tapekit.effects import InDoubtToolCall, ToolEffect
from tapekit.environment import (
    Environment,
    ExternalObservationNeeded,
    Tool,
    ToolEnvironment,
    unanswered_actions,
    unanswered_indices,
)
from tapekit.orchestrator import amain_loop
from tapekit.store.base import TapeStore

__all__ = [
    "WAITING_TAG",
    "ApprovalDecision",
    "ApprovalEnvironment",
    "ApprovalNeeded",
    "ApprovalTool",
    "SessionTurn",
    "Waiting",
    "approval_required",
    "approve",
    "arun_session",
    "load_session",
    "pending_approvals",
    "reject",
    "reply",
    "resolve_in_doubt",
    "run_session",
    "waiting_on",
]

WAITING_TAG = "waiting"
PERSON = "person"

_approved: contextvars.ContextVar[bool] = contextvars.ContextVar("tapekit_approved", default=False)


class ApprovalDecision(ControlStep):
    """A person's decision on a tool call that needed approval, recorded before the tool runs.

    ``step_id`` is the id of the :class:`ToolCall` step decided on (``call_id`` and ``name``
    repeat its call id and tool for readers); ``decision`` is ``approved``, ``rejected`` or
    ``edited`` (approved with ``arguments`` in place of the call's own); ``reason`` is the
    person's comment, shown to the agent on a rejection.
    """

    kind: Literal["approval_decision"] = "approval_decision"
    step_id: str
    call_id: str = ""
    name: str = ""
    decision: Literal["approved", "rejected", "edited"]
    arguments: dict[str, Any] | None = None
    reason: str = ""


class ApprovalTool(Tool):
    """A tool that only runs after a person approved the call (see :func:`approval_required`).

    Under a plain :class:`ToolEnvironment` it never runs: the call gets an error result that
    says an :class:`ApprovalEnvironment` is needed.
    """

    requires_approval = True

    async def invoke(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run the tool, if this call was approved through an :class:`ApprovalEnvironment`."""
        if not _approved.get():
            raise PermissionError(
                f"tool {self.name!r} needs a person's approval; run it in an ApprovalEnvironment"
            )
        return await super().invoke(args, kwargs)


def approval_required(fn: Callable[..., Any] | Tool, name: str | None = None) -> ApprovalTool:
    """``fn`` (a function or a :class:`Tool`) as a tool that waits for a person's approval
    before each call: ``ApprovalEnvironment([search, approval_required(send_email)])``."""
    if isinstance(fn, Tool):
        return ApprovalTool(fn.fn, name=name or fn.name)
    return ApprovalTool(fn, name=name)


class ApprovalNeeded(ExternalObservationNeeded):
    """The environment stopped because ``calls`` wait for a person's approval."""

    def __init__(self, calls: Sequence[ToolCall]) -> None:
        self.calls = list(calls)
        names = ", ".join(f"{c.name}({c.call_id or c.metadata.id})" for c in self.calls)
        super().__init__(self.calls[0], f"tool calls wait for a person's approval: {names}")


def _decisions(tape: Tape[Any, Any]) -> dict[str, ApprovalDecision]:
    """The decisions recorded since the tape's last observation, by the id of the call step.

    A call takes one decision: :func:`approve` and :func:`reject` refuse a call that has one.
    Should a tape hold two for the same call anyway (steps appended by hand, or by an older
    version), the **first** counts, so a rejection can never be overturned by a later approval.
    """
    out: dict[str, ApprovalDecision] = {}
    for step in reversed(tape.steps):
        if isinstance(step, Observation):
            break
        if isinstance(step, ApprovalDecision):
            out[step.step_id] = step  # walking backwards: the earliest decision is written last
    return out


def _needs_approval(environment: Environment | None, call: ToolCall) -> bool:
    tools = getattr(environment, "tools", {})
    return bool(getattr(tools.get(call.name), "requires_approval", False))


def pending_approvals(tape: Tape[Any, Any], environment: Environment | None) -> list[ToolCall]:
    """The tool calls at the tape's end that wait for a person's decision (their tool needs
    approval in ``environment`` and no :class:`ApprovalDecision` names them yet)."""
    decided = _decisions(tape)
    return [
        a
        for a in unanswered_actions(tape)
        if isinstance(a, ToolCall) and _needs_approval(environment, a) and a.metadata.id not in decided
    ]


class ApprovalEnvironment(ToolEnvironment):
    """A :class:`ToolEnvironment` that stops with :class:`ApprovalNeeded` before running a tool
    made with :func:`approval_required`, and once an :class:`ApprovalDecision` is on the tape
    runs it (with any edited arguments) or answers that the person rejected it."""

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """Answer the unanswered actions, or stop if some tool calls still need approval."""
        pending = pending_approvals(tape, self)
        if pending:
            raise ApprovalNeeded(pending)
        decided = _decisions(tape)
        steps = tape.steps
        observations = await asyncio.gather(
            *(
                self._decided(steps[i], decided.get(steps[i].metadata.id), tape, i)
                for i in unanswered_indices(tape)
            )
        )
        return self._continued(tape, observations)

    async def _decided(
        self, action: Action, decision: ApprovalDecision | None, tape: Tape[Any, Any], index: int
    ) -> Observation:
        if decision is None or not isinstance(action, ToolCall):
            return await self._answer(action, tape, index)
        if decision.decision == "rejected":
            why = f": {decision.reason}" if decision.reason else ""
            return ToolResult(
                call_id=action.call_id, name=action.name, error=f"the person rejected this call{why}"
            )
        call = action
        if decision.arguments is not None:
            call = action.model_copy(update={"arguments": decision.arguments})
        token = _approved.set(True)  # this task's context only: other calls stay unapproved
        try:
            return await self._call_tool(call, tape, index)
        finally:
            _approved.reset(token)


# --------------------------------------------------------------------------- the person's answers


def _added(tape: Tape[Any, Any], steps: list[Step]) -> Tape[Any, Any]:
    """The tape with ``steps`` appended and its metadata (id included) kept: the same session."""
    return tape.model_copy(update={"steps": tape.steps.appended(steps)})


def reply(tape: Tape[Any, Any], text: str) -> Tape[Any, Any]:
    """The session with the person's message appended as a :class:`UserStep`."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a reply must be non-empty text")
    return _added(tape, [UserStep(content=text, metadata=StepMetadata(other={"author": PERSON}))])


def _described(call: ToolCall, decision: ApprovalDecision) -> str:
    """``call`` and the decision it already has, for error messages."""
    why = f", {decision.reason!r}" if decision.reason else ""
    return f"{call.name}({call.call_id or call.metadata.id}): {decision.decision}{why}"


def _call(tape: Tape[Any, Any], call: ToolCall | str | None, environment: Environment | None) -> ToolCall:
    """The tool call that a new decision is for: ``call`` (a :class:`ToolCall`, its call id or
    its step id), or the first undecided call at the tape's end; with ``environment``, only
    calls whose tool needs approval there. A call that already has a decision is refused."""
    decided = _decisions(tape)
    waiting = [
        a
        for a in unanswered_actions(tape)
        if isinstance(a, ToolCall) and (environment is None or _needs_approval(environment, a))
    ]
    undecided = [c for c in waiting if c.metadata.id not in decided]
    if call is None:
        if undecided:
            return undecided[0]
        done = "; ".join(_described(c, decided[c.metadata.id]) for c in waiting)
        if done:
            raise ValueError(
                "no tool call waits for a decision at the end of this tape: every one already has "
                f"a decision ({done}), and a call takes only one"
            )
        raise ValueError("no tool call waits for a decision at the end of this tape")
    named = (
        [call] if isinstance(call, ToolCall) else [c for c in waiting if call in (c.metadata.id, c.call_id)]
    )
    for c in named:
        if c.metadata.id in decided:
            raise ValueError(
                f"tool call {c.call_id or c.metadata.id!r} already has a decision "
                f"({_described(c, decided[c.metadata.id])}); a call takes only one, so this one is refused"
            )
    if isinstance(call, ToolCall):
        return call
    for c in undecided:
        if call in (c.metadata.id, c.call_id):
            return c
    names = ", ".join(c.call_id or c.metadata.id for c in undecided) or "none"
    raise ValueError(f"no pending tool call {call!r} at the end of this tape (pending: {names})")


def _decide(
    tape: Tape[Any, Any],
    call: ToolCall | str | None,
    decision: Literal["approved", "rejected", "edited"],
    arguments: dict[str, Any] | None,
    reason: str,
    environment: Environment | None,
) -> Tape[Any, Any]:
    target = _call(tape, call, environment)
    step = ApprovalDecision(
        step_id=target.metadata.id,
        call_id=target.call_id,
        name=target.name,
        decision=decision,
        arguments=arguments,
        reason=reason,
        metadata=StepMetadata(other={"author": PERSON}),
    )
    return _added(tape, [step])


def approve(
    tape: Tape[Any, Any],
    call: ToolCall | str | None = None,
    *,
    arguments: dict[str, Any] | None = None,
    reason: str = "",
    environment: Environment | None = None,
) -> Tape[Any, Any]:
    """The session with an approval of ``call`` appended (a :class:`ToolCall`, its call id or
    step id; default: the first call at the tape's end that has no decision yet). With
    ``arguments`` the tool runs with those instead (``decision="edited"``). ``environment``
    limits the choice to calls that need approval there.

    A call takes one decision: a call that already has one (approved, edited or rejected) is
    refused with :class:`ValueError`, as is a tape where no call waits for one."""
    if arguments is not None and not isinstance(arguments, dict):
        raise TypeError(f"edited arguments must be a JSON object (a dict), not {type(arguments).__name__}")
    decision: Literal["approved", "edited"] = "approved" if arguments is None else "edited"
    return _decide(tape, call, decision, arguments, reason, environment)


def reject(
    tape: Tape[Any, Any],
    call: ToolCall | str | None = None,
    *,
    reason: str = "",
    environment: Environment | None = None,
) -> Tape[Any, Any]:
    """The session with a rejection of ``call`` appended (see :func:`approve`, which picks and
    refuses calls the same way); the agent gets a tool result whose error says the person
    rejected it, with ``reason``."""
    return _decide(tape, call, "rejected", None, reason, environment)


# --------------------------------------------------------------------------- running and waiting


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a session waits for: ``message`` (the person's reply to ``action``), ``approval``
    (decisions on ``calls``), ``in_doubt`` (a person to say what became of the ``once`` tool
    calls in ``effects``, see :func:`resolve_in_doubt`), or ``external`` (another observation
    for ``action``)."""

    kind: Literal["message", "approval", "in_doubt", "external"]
    action: Action | None = None
    calls: list[ToolCall] = field(default_factory=list)
    message: str = ""
    effects: list[ToolEffect] = field(default_factory=list)


def waiting_on(
    tape: Tape[Any, Any], environment: Environment | None, store: TapeStore | None = None
) -> Waiting | None:
    """What the session waits for, judged from the tape (and, with ``store``, the journal of
    its ``once`` tool calls) alone (None: it can run on).

    Tool calls in doubt come first (with ``store``: a crash or a tool left them so, see
    :mod:`tapekit.effects`), then pending approvals; then an unanswered
    :class:`AssistantStep` waits for a reply. An action that some other handler can only answer
    from outside is only known by running the environment (see :attr:`SessionTurn.waiting`).
    """
    if store is not None and unanswered_actions(tape):
        doubt = store.tool_effects(tape.metadata.id, in_doubt=True)
        if doubt:
            return Waiting(
                "in_doubt", message=f"{len(doubt)} tool call(s) may or may not have run", effects=doubt
            )
    calls = pending_approvals(tape, environment)
    if calls:
        return Waiting("approval", calls[0], calls, f"{len(calls)} tool call(s) need approval")
    actions = unanswered_actions(tape)
    message = next((a for a in reversed(actions) if isinstance(a, AssistantStep)), None)
    if message is not None:
        return Waiting("message", message, message="the assistant waits for a reply")
    return None


@dataclass(frozen=True, slots=True)
class SessionTurn:
    """The outcome of :func:`run_session`: the tape, the steps this turn added, and why it
    stopped: ``waiting`` (see ``waiting``), ``done``, ``error`` or ``max loops``."""

    tape: Tape[Any, Any]
    added: list[Step]
    stopped: Literal["waiting", "done", "error", "max loops"]
    waiting: Waiting | None = None


def _waiting_from(external: ExternalObservationNeeded, tape: Tape[Any, Any], env: Environment) -> Waiting:
    if isinstance(external, ApprovalNeeded):
        return Waiting("approval", external.calls[0], external.calls, str(external))
    if isinstance(external, InDoubtToolCall):
        return Waiting("in_doubt", external.action, message=str(external), effects=[external.effect])
    known = waiting_on(tape, env)
    if known is not None:
        return known
    return Waiting("external", external.action, message=str(external))


async def arun_session(
    agent: Agent,
    environment: Environment,
    tape: Tape[Any, Any],
    *,
    store: TapeStore | None = None,
    tags: Sequence[str] = (),
    max_loops: int = 50,
    on_event: Callable[[Any], None] | None = None,
) -> SessionTurn:
    """Run the session until it waits for the person, is done, fails or ran ``max_loops``
    rounds.

    With ``store`` every step and LLM call is saved as it happens, under the tape's own id
    (one stored tape per session, growing turn by turn), and the tape is tagged ``waiting``
    while it waits (the tag is removed once it runs on). ``on_event`` sees every main-loop
    event (to print steps as they come).
    """
    final, external, last = tape, None, "agent"
    events = amain_loop(agent, tape, environment, max_loops, store=store, tags=tags if store else ())
    async for event in events:
        if on_event is not None:
            on_event(event)
        if event.tape is not None:
            final = event.tape
            last = "agent" if event.agent_tape is not None else "environment"
        if event.external is not None:
            external = event.external
    error = final.metadata.error
    final = final.model_copy(update={"metadata": tape.metadata.model_copy(update={"error": error})})
    added = list(final.steps[len(tape) :])
    waiting = _waiting_from(external, final, environment) if external is not None else None
    stopped: Literal["waiting", "done", "error", "max loops"]
    if waiting is not None:
        stopped = "waiting"
    elif error:
        stopped = "error"
    elif last == "agent" and not unanswered_actions(final):
        stopped = "done"
    else:  # the loop ended after the environment answered, or before it could answer
        stopped = "max loops"
    if store is not None:
        tape_id = tape.metadata.id
        if waiting is not None:
            store.add_tags(tape_id, [WAITING_TAG])
        else:
            store.remove_tags(tape_id, [WAITING_TAG])
        store.flush()
    return SessionTurn(final, added, stopped, waiting)


def resolve_in_doubt(store: TapeStore, key: str, decision: str, text: str = "") -> ToolEffect:
    """Settle the ``once`` tool call ``key`` left in doubt, as a person says: ``done`` (it
    happened; ``text`` is its result, read as JSON when it is JSON, else kept as text),
    ``failed`` (``text`` says why) or ``retry`` (it did not happen: run it again). The next
    resume of the session goes on from that (:meth:`TapeStore.resolve_tool_effect`)."""
    choice = decision.strip().lower()
    if choice == "done":
        try:
            result: Any = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            result = text
        return store.resolve_tool_effect(key, result=result if result is not None else "done")
    if choice == "failed":
        return store.resolve_tool_effect(key, error=text.strip() or "the person said it failed")
    if choice == "retry":
        return store.resolve_tool_effect(key, retry=True)
    raise ValueError(f"a call in doubt is resolved as done, failed or retry, not {decision!r}")


def run_session(
    agent: Agent,
    environment: Environment,
    tape: Tape[Any, Any],
    *,
    store: TapeStore | None = None,
    tags: Sequence[str] = (),
    max_loops: int = 50,
    on_event: Callable[[Any], None] | None = None,
) -> SessionTurn:
    """Sync version of :func:`arun_session`."""
    return run_sync(
        arun_session(agent, environment, tape, store=store, tags=tags, max_loops=max_loops, on_event=on_event)
    )


def load_session(store: TapeStore, tape_id: str) -> Tape[Any, Any]:
    """The stored session ``tape_id``, ready for :func:`reply`/:func:`approve` and
    :func:`run_session` (which keep its id, so the stored tape grows)."""
    return store.get_tape(tape_id)
