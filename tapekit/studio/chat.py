"""The Studio's chat pages: a person answers sessions that wait for them.

- ``/chat``: the sessions waiting for a person (tagged ``waiting``), and a form to start one
  with a registered agent;
- ``/chat/{id}``: the conversation, and what the session waits for: a message box, for each
  tool call that needs approval a form to approve it, reject it (with a reason) or edit its
  arguments, and for each ``once`` tool call left in doubt (:mod:`tapekit.effects`) a form to
  say it happened (with its result), it failed, or it may run again.

Answers continue the stored session under its own id (the same tape grows, as with
``tapekit chat``): the person's step is appended, the agent runs until it waits again, and
every step and LLM call is stored as it happens. Each form carries the tape's length; an
answer to a session that has moved on since the page was loaded is refused (409).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, RedirectResponse, Response

from tapekit.core import Step, Tape
from tapekit.dialog import AssistantStep, ToolCall, ToolResult, UserStep
from tapekit.human import (
    WAITING_TAG,
    ApprovalDecision,
    Waiting,
    approve,
    arun_session,
    reject,
    reply,
    resolve_in_doubt,
    waiting_on,
)
from tapekit.store import TapeFilter, TapeStore
from tapekit.studio.data import root_agent_name
from tapekit.studio.pages import PageError, Studio, StudioDep, read_form
from tapekit.studio.runs import RegisteredAgent

router = APIRouter()
"""``/chat`` (the sessions waiting for a person, a form to start one), ``/chat/{id}`` and the
answers posted to it."""

CHAT_TAG = "chat"
AGENT_TAG = "chat-agent:"  # + the registered agent's name


@dataclass(frozen=True, slots=True)
class ChatLine:
    """One line of the conversation: ``who`` (user, assistant, tool, result, decision), the
    step's index and text, and for tool calls their pretty arguments."""

    who: str
    index: int
    text: str
    detail: str = ""
    error: bool = False


def _pretty(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)


def chat_lines(steps: list[Step]) -> list[ChatLine]:
    """The conversation in ``steps``: messages, tool calls, results and decisions (the agent's
    inner steps are left out; the tape page shows them)."""
    lines = []
    for i, step in enumerate(steps):
        if isinstance(step, UserStep):
            lines.append(ChatLine("user", i, step.content))
        elif isinstance(step, AssistantStep):
            lines.append(ChatLine("assistant", i, step.content, step.metadata.agent or "assistant"))
        elif isinstance(step, ToolCall):
            lines.append(ChatLine("tool", i, step.name, _pretty(step.arguments)))
        elif isinstance(step, ToolResult):
            text = step.error if step.error else _pretty(step.content)
            lines.append(ChatLine("result", i, text or "", step.name, error=bool(step.error)))
        elif isinstance(step, ApprovalDecision):
            edited = _pretty(step.arguments) if step.arguments is not None else ""
            text = f"{step.decision} {step.name}" + (f": {step.reason}" if step.reason else "")
            lines.append(ChatLine("decision", i, text, edited, error=step.decision == "rejected"))
    return lines


def registered_for(studio: Studio, tape_id: str, tags: list[str], tape: Tape[Any, Any]) -> RegisteredAgent:
    """The registered agent that continues session ``tape_id`` (named by its tag, else found by
    the tape's root agent, else the only one); a 409 page when there is none, or it has no
    environment."""
    named = next((t[len(AGENT_TAG) :] for t in tags if t.startswith(AGENT_TAG)), None)
    found = studio.agents.get(named) if named else studio.agent_for_root(root_agent_name(tape.steps))
    if found is None and len(studio.agents) == 1:
        found = next(iter(studio.agents.values()))
    if found is None:
        raise PageError(
            409,
            "No agent for this session",
            f"Session {tape_id!r} was made by an agent that is not registered; start the Studio with "
            "--agent module:attr for it.",
        )
    if found.environment is None:
        raise PageError(409, "No environment", f"Agent {found.name!r} was registered without an environment.")
    return found


def waiting_for(
    tape: Tape[Any, Any], tags: list[str], reg: RegisteredAgent | None, store: TapeStore | None = None
) -> Waiting | None:
    """What the session waits for (tool calls in doubt, approvals, a message), or None."""
    waiting = waiting_on(tape, reg.environment if reg else None, store)
    if waiting is None and WAITING_TAG in tags:
        return Waiting("external", message="the session waits for a message")
    return waiting


@router.get("/chat", response_class=HTMLResponse)
def chat_list(request: Request, studio: StudioDep) -> Response:
    """The sessions waiting for a person, and the recent chats."""
    waiting = studio.store.list_tape_infos(TapeFilter(tag=WAITING_TAG), limit=100)
    recent = studio.store.list_tape_infos(TapeFilter(tag=CHAT_TAG), limit=20)
    return studio.render(request, "chat_list.html", waiting=waiting, recent=recent)


@router.get("/chat/{tape_id}", response_class=HTMLResponse)
def chat_page(request: Request, tape_id: str, studio: StudioDep) -> Response:
    """The conversation, and a form for what it waits for."""
    info = studio.info(tape_id)
    tape = studio.tape(info)
    try:
        reg: RegisteredAgent | None = registered_for(studio, tape_id, info.tags, tape)
    except PageError:
        reg = None
    waiting = waiting_for(tape, info.tags, reg, studio.store)
    return studio.render(
        request,
        "chat.html",
        info=info,
        lines=chat_lines(list(tape.steps)),
        waiting=waiting,
        registered=reg,
        pretty=_pretty,
    )


Answer = Callable[[Tape[Any, Any], RegisteredAgent], Tape[Any, Any]]
"""Makes the answered tape from the session's tape and its agent (ValueError: a bad answer)."""


async def continue_session(studio: Studio, tape_id: str, form: dict[str, str], answer: Answer) -> Response:
    """Answer the session (unless it moved on since the page showed it: 409) and run its agent
    until it waits again; one answer at a time per session."""
    lock = studio.locks.setdefault(tape_id, asyncio.Lock())
    async with lock:
        info = await run_in_threadpool(studio.info, tape_id)
        if form.get("n_steps") != str(info.n_steps):
            raise PageError(
                409,
                "The session has moved on",
                f"Session {tape_id!r} has {info.n_steps} steps now, not the {form.get('n_steps')} "
                "this page showed. Reload the page and answer again.",
            )
        tape = await run_in_threadpool(studio.store.get_tape, tape_id)
        reg = registered_for(studio, tape_id, info.tags, tape)
        try:
            answered = answer(tape, reg)
        except (ValueError, TypeError) as e:
            raise PageError(400, "Invalid answer", str(e)) from None
        assert reg.environment is not None  # registered_for refuses agents without one
        await arun_session(
            reg.agent, reg.environment, answered, store=studio.store, max_loops=studio.max_run_loops
        )
    return RedirectResponse(f"/chat/{tape_id}#end", status_code=303)


@router.post("/chat/{tape_id}/message")
async def chat_message(request: Request, tape_id: str, studio: StudioDep) -> Response:
    """The person's message."""
    form = await read_form(request)
    text = form.get("message", "")
    return await continue_session(studio, tape_id, form, lambda tape, reg: reply(tape, text))


def decision(form: dict[str, str]) -> Answer:
    """The posted decision on a tool call (approve, reject, or edit its arguments) as an answer."""
    choice, step_id, reason = form.get("decision", ""), form.get("step_id", ""), form.get("reason", "")

    def decide(tape: Tape[Any, Any], reg: RegisteredAgent) -> Tape[Any, Any]:
        env = reg.environment
        if choice == "approve":
            return approve(tape, step_id, reason=reason, environment=env)
        if choice == "reject":
            return reject(tape, step_id, reason=reason, environment=env)
        if choice == "edit":
            try:
                arguments = json.loads(form.get("arguments", ""))
            except json.JSONDecodeError as e:
                raise ValueError(f"the edited arguments are not JSON: {e}") from None
            if not isinstance(arguments, dict):
                raise ValueError("the edited arguments must be a JSON object")
            return approve(tape, step_id, arguments=arguments, reason=reason, environment=env)
        raise ValueError(f"decision must be approve, reject or edit, not {choice!r}")

    return decide


@router.post("/chat/{tape_id}/decision")
async def chat_decision(request: Request, tape_id: str, studio: StudioDep) -> Response:
    """The person's decision on a tool call that needs approval."""
    form = await read_form(request)
    return await continue_session(studio, tape_id, form, decision(form))


@router.post("/chat/{tape_id}/effect")
async def chat_effect(request: Request, tape_id: str, studio: StudioDep) -> Response:
    """The person's word on a tool call in doubt (it happened, it failed, run it again); the
    session then runs on from it."""
    form = await read_form(request)
    key, choice, text = form.get("key", ""), form.get("decision", ""), form.get("text", "")
    known = await run_in_threadpool(studio.store.tool_effect, key) if key else None
    if known is None or known.tape_id != tape_id:
        raise PageError(404, "No such tool call", f"Session {tape_id!r} has no tool call {key!r} in doubt.")

    def settle(tape: Tape[Any, Any], reg: RegisteredAgent) -> Tape[Any, Any]:
        resolve_in_doubt(studio.store, key, choice, text)
        return tape

    return await continue_session(studio, tape_id, form, settle)


@router.post("/chat")
async def chat_new(request: Request, studio: StudioDep) -> Response:
    """Start a session with a registered agent and the person's first message."""
    form = await read_form(request)
    name, text = form.get("agent", ""), form.get("message", "")
    if name not in studio.agents:
        known = ", ".join(sorted(studio.agents)) or "none: start the Studio with --agent"
        raise PageError(400, "Unknown agent", f"No agent {name!r} is registered (registered: {known}).")
    reg = studio.agents[name]
    if reg.environment is None:
        raise PageError(409, "No environment", f"Agent {name!r} was registered without an environment.")
    try:
        start = reply(Tape(), text)
    except ValueError as e:
        raise PageError(400, "Invalid answer", str(e)) from None
    tags = [CHAT_TAG, AGENT_TAG + name]
    await arun_session(
        reg.agent, reg.environment, start, store=studio.store, tags=tags, max_loops=studio.max_run_loops
    )
    return RedirectResponse(f"/chat/{start.metadata.id}#end", status_code=303)
