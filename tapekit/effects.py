"""Effect-safe tool calls: a crash never runs a ``once`` tool twice.

A tool declares what running it again does (``Tool(fn, effect=...)`` or ``@tool(effect=...)``):

- ``"read"`` (the default): nothing; a resumed session simply runs it again.
- ``"idempotent"``: running it again with the same key is harmless *if the outside world is
  given the key*: :func:`tool_call_key` returns it (the :class:`~tapekit.dialog.ToolCall`
  step's ``metadata.id``, the same on every resume) for the tool to pass on (an
  ``Idempotency-Key`` header, a ticket's external id). Re-run on resume.
- ``"once"``: must not happen twice. When the session is stored (``main_loop(...,
  store=...)``, the batch runner, the Studio), the loop keeps a **journal** of such calls in
  the store, beside the tape:

  1. before the tool runs, the tape up to the call and an *intent* record
     (``state="started"``) are committed (``flush``: the writer has handed them to the
     database, so they survive the process being killed);
  2. the tool runs;
  3. its outcome (``"done"`` with the result, or ``"failed"`` with the error) is committed
     before the :class:`~tapekit.dialog.ToolResult` step is made.

  On resume, a ``once`` call without a result on the tape is looked up in the journal: a
  recorded outcome is reused (the tool is not called); an intent with no outcome is *in
  doubt* (the process died while the tool ran, or before its outcome was written). Then the
  tool's own ``reconcile(call)`` decides when it has one (look the payment up by its key):
  it returns :data:`NOT_DONE` (run it), :data:`UNKNOWN` (cannot tell) or the result of the
  effect that did happen. With no ``reconcile``, or :data:`UNKNOWN`, the session stops with
  :class:`InDoubtToolCall` (a kind of :class:`~tapekit.environment.ExternalObservationNeeded`:
  it waits on the outside world) until a person or the application resolves the call with
  :meth:`TapeStore.resolve_tool_effect <tapekit.store.TapeStore.resolve_tool_effect>` (done
  with a result, failed with an error, or ``retry``), in code, in the Studio or in ``tapekit
  chat``; the next resume continues from that.

Without a store nothing can be resumed from a store, so nothing is journalled and a ``once``
tool runs as any other. docs/durability.md is the contract, step kind by step kind.

Environments other than :class:`~tapekit.environment.ToolEnvironment` journal their own
``once`` effects through the same :class:`Journal` (:meth:`Journal.intend` before,
:meth:`Journal.record` after; an intent with no outcome raises :class:`InDoubtToolCall` on
resume): the browser environment does so for the web actions a task declares ``once`` (a form
submit on a real site, :mod:`tapekit.web.environment`).
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from tapekit.core import Action, Call, Tape
from tapekit.errors import ExternalObservationNeeded, TapekitError

if TYPE_CHECKING:
    from tapekit.dialog import ToolCall
    from tapekit.recording import SessionRecorder
    from tapekit.store.base import TapeStore


Effect = Literal["read", "idempotent", "once"]
"""What running a tool again does: see the module docstring."""

EFFECTS: tuple[str, ...] = ("read", "idempotent", "once")

EffectState = Literal["started", "done", "failed", "retry"]
"""A journalled call's state: ``started`` (intent committed, no outcome: running, or in doubt
after a crash), ``done`` / ``failed`` (outcome committed), ``retry`` (a person said: run it
again)."""


class Reconcile(enum.Enum):
    """What a tool's ``reconcile(call)`` answers when it cannot give the effect's result."""

    NOT_DONE = "not_done"
    """The effect did not happen: run the tool."""
    UNKNOWN = "unknown"
    """It cannot be told: wait for a person (:class:`InDoubtToolCall`)."""


NOT_DONE = Reconcile.NOT_DONE
UNKNOWN = Reconcile.UNKNOWN


class ToolEffect(BaseModel):
    """One journalled ``once`` call: its key (the ToolCall step's id), the tape it belongs to,
    the tool and arguments, its state, and its outcome (``result`` when done, ``error`` when
    failed), with the times it was first and last written."""

    key: str
    tape_id: str
    tool: str
    arguments: dict[str, Any]
    state: EffectState
    result: Any = None
    error: str | None = None
    created: float
    updated: float

    @property
    def in_doubt(self) -> bool:
        """Started and never finished: the tool may or may not have acted."""
        return self.state == "started"


class EffectInDoubt(TapekitError):
    """Raised by a ``once`` tool that cannot tell whether its effect happened (a request that
    timed out, a connection that dropped after sending): the call stays in doubt, as after a
    crash, and the session waits (:class:`InDoubtToolCall`) unless ``reconcile`` settles it on
    the next resume. A tool of another effect that raises it fails as with any exception."""


class InDoubtToolCall(ExternalObservationNeeded):
    """A ``once`` tool call that may or may not have happened (its intent is journalled, its
    outcome is not, and the tool could not reconcile it): the session waits until the call
    is resolved (done, failed or retry) with ``store.resolve_tool_effect``. A ``once`` web
    action (a form submit on a real site, :mod:`tapekit.web.environment`) waits the same way:
    then ``call`` is that action and ``effect.tool`` names it (``"browser.click"``)."""

    def __init__(self, call: Action, effect: ToolEffect, why: str = "") -> None:
        self.effect = effect
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(effect.created))
        because = f"it said: {why}" if why else "no outcome was recorded"
        what = "tool call" if call.kind == "tool_call" else "action"
        super().__init__(
            call,
            f"{what} {effect.tool!r} (key {effect.key}) may or may not have run: it started "
            f"{started} and {because}; resolve it (done, failed or retry) with "
            "store.resolve_tool_effect, the Studio or tapekit chat, then resume",
        )


class _LazyKey:
    """A call's key, worked out when first asked for (a subagent's key hashes its steps)."""

    __slots__ = ("make", "value")

    def __init__(self, make: Callable[[], str]) -> None:
        self.make = make
        self.value: str | None = None

    def get(self) -> str:
        if self.value is None:
            self.value = self.make()
        return self.value


_KEY: contextvars.ContextVar[_LazyKey | None] = contextvars.ContextVar("tapekit_tool_call_key", default=None)


def tool_call_key() -> str:
    """The idempotency key of the tool call running now: the ToolCall step's id (for a
    subagent's call in a stored session, a digest of what the subagent did since it was
    called, see :meth:`Journal.key`), the same every time the call is run or resumed. Pass it
    to the outside world (an ``Idempotency-Key`` header, an external id) so that a repeated
    request is recognised there. Raises ``LookupError`` outside a tool run by a
    :class:`~tapekit.environment.ToolEnvironment`."""
    key = _KEY.get()
    if key is None:
        raise LookupError("tool_call_key() is only available inside a tool run by a ToolEnvironment")
    return key.get()


@contextmanager
def call_key(make: Callable[[], str]) -> Iterator[_LazyKey]:
    """Make ``make()`` the :func:`tool_call_key` while the block runs, worked out only if asked
    for (the environment's side)."""
    lazy = _LazyKey(make)
    token = _KEY.set(lazy)
    try:
        yield lazy
    finally:
        _KEY.reset(token)


# --------------------------------------------------------------------------- the journal


class Journal:
    """The loop's side of the journal: the session's store and recorder (what must be durable
    before a ``once`` tool runs). :func:`journal` returns the current one."""

    __slots__ = ("recorder", "store")

    def __init__(self, store: TapeStore, recorder: SessionRecorder) -> None:
        self.store = store
        self.recorder = recorder

    def key(self, tape: Tape[Any, Any], index: int) -> str:
        """The idempotency key of the tool call at ``tape.steps[index]``.

        A call of the session's own agent is on the recorded tape (the journal makes it durable
        before a ``once`` tool runs), so its step id is the key. A subagent's call may be in a
        fork branch, whose steps reach the recorded tape later (or, for a branch resumed from
        its start, are made anew with new ids), so its key is derived from what the subagent
        did since it was called: the session, and the content of the steps from the
        :class:`~tapekit.core.Call` that started the subagent to this call (which subagent,
        its request, what it saw, the tool and arguments). A subagent that does the same again
        gets the same key; one that takes another path makes another call. The cost is one
        pass over the subagent's steps, paid by calls of ``once`` tools only."""
        call = tape.steps[index]
        path = call.metadata.agent
        if "/" not in path:
            return call.metadata.id
        caller, _, name = path.rpartition("/")
        start = index
        while start > 0:
            step = tape.steps[start]
            if isinstance(step, Call) and step.agent_name == name and step.metadata.agent == caller:
                break
            start -= 1
        digest = hashlib.sha256(f"{self.recorder.tape_id}\n{path}\n".encode())
        for i in range(start, index + 1):
            digest.update(json.dumps(tape.steps[i].llm_dict(), sort_keys=True, default=str).encode())
            digest.update(b"\n")
        return f"sub-{digest.hexdigest()[:32]}"

    def _outcome(
        self, key: str, call: ToolCall, state: EffectState, result: Any = None, error: str | None = None
    ) -> None:
        self.record(key, call.name, call.arguments, state, result, error)

    def record(
        self,
        key: str,
        name: str,
        arguments: dict[str, Any],
        state: EffectState,
        result: Any = None,
        error: str | None = None,
    ) -> None:
        """Commit the journal record of ``key`` (what ``name`` with ``arguments`` did: its
        ``state``, ``result`` or ``error``), with every save before it. It blocks until the
        database has it: call it off the event loop. For effects that are not tool calls (a
        ``once`` web action); a tool's calls go through :meth:`run_once`."""
        self.store._record_effect(key, self.recorder.tape_id, name, arguments, state, result, error)

    def intend(self, key: str, name: str, arguments: dict[str, Any]) -> None:
        """Commit the session's tape so far and the intent (``state="started"``) of ``key``:
        what must be durable before a ``once`` effect happens (blocking, as :meth:`record`)."""
        self.recorder.write_all()
        self.record(key, name, arguments, "started")

    async def run_once(
        self,
        key: str,
        call: ToolCall,
        attempt: Callable[[], Awaitable[tuple[Any, str | None]]],
        reconcile: Callable[[ToolCall], Any] | None,
        jsonable: Callable[[Any], Any],
    ) -> tuple[Any, str | None, str]:
        """Run ``attempt`` (which returns the call's ``(content, error)``) at most once for
        ``call``, journalled under ``key``: ``(content, error, how)`` where ``how`` is ``"ran"``,
        ``"reused"`` (the journal's outcome) or ``"reconciled"``. Raises
        :class:`InDoubtToolCall` for a call in doubt that ``reconcile`` cannot settle, and
        when the attempt itself raises :class:`EffectInDoubt`."""
        known = await asyncio.to_thread(self.store.tool_effect, key)
        if known is not None and known.state in ("done", "failed"):
            return known.result, known.error, "reused"
        if known is not None and known.state == "started":
            answer = await ask_reconcile(reconcile, call, known)
            if answer is not NOT_DONE:
                content = jsonable(answer)
                await asyncio.to_thread(self._outcome, key, call, "done", content)
                return content, None, "reconciled"
        self.recorder.write_all()  # the tape up to this call (queued here, on the recorder's loop)
        await asyncio.to_thread(self._outcome, key, call, "started")  # committed with it
        try:
            content, error = await attempt()
        except EffectInDoubt as e:
            effect = await asyncio.to_thread(self.store.tool_effect, key)
            assert effect is not None
            raise InDoubtToolCall(call, effect, str(e)) from e
        except ExternalObservationNeeded:
            await asyncio.to_thread(self._outcome, key, call, "retry")  # the tool says it did nothing
            raise
        state: EffectState = "failed" if error is not None else "done"
        await asyncio.to_thread(self._outcome, key, call, state, content, error)
        return content, error, "ran"


async def ask_reconcile(reconcile: Callable[..., Any] | None, call: Action, known: ToolEffect) -> Any:
    """What ``reconcile(call)`` (sync or async) says of the ``once`` call in doubt ``known``: its
    result (it happened) or :data:`NOT_DONE`; :class:`InDoubtToolCall` when there is no
    ``reconcile`` or it answers :data:`UNKNOWN`. A tool's calls and a web task's actions in doubt
    are settled through it."""
    answer: Any = UNKNOWN if reconcile is None else reconcile(call)
    if asyncio.iscoroutine(answer):
        answer = await answer
    if answer is UNKNOWN:
        raise InDoubtToolCall(call, known)
    return answer


_JOURNAL: contextvars.ContextVar[Journal | None] = contextvars.ContextVar("tapekit_journal", default=None)


def journal() -> Journal | None:
    """The journal of the stored session running in this context (None: not stored)."""
    return _JOURNAL.get()


def set_journal(value: Journal | None) -> contextvars.Token[Journal | None]:
    """Make ``value`` the current journal (the loop's side); reset with the returned token."""
    return _JOURNAL.set(value)


def reset_journal(token: contextvars.Token[Journal | None]) -> None:
    """Undo :func:`set_journal`."""
    _JOURNAL.reset(token)
