"""``tapekit chat``: talk to an agent in the terminal, in sessions stored in a tape store.

A session is one stored tape. When the agent waits (a message for you, a tool call that needs
your approval, or a ``once`` tool call a crash left in doubt) the tape is saved and tagged
``waiting``; ``tapekit chat --tape ID`` in any
later process shows the conversation so far and carries on.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tapekit._cli.common import CliError, fail, load_target, pick_tape

if TYPE_CHECKING:
    from tapekit.core import Step, Tape
    from tapekit.environment import Environment
    from tapekit.human import Waiting
    from tapekit.store import TapeStore


QUIT = {"/quit", "/exit", "/q"}


def _short(value: Any, width: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def chat_line(step: Step, verbose: bool = False) -> str | None:
    """How the chat shows a step (None: not shown unless ``verbose``)."""
    from tapekit.dialog import AssistantStep, ToolCall, ToolResult, UserStep
    from tapekit.human import ApprovalDecision
    from tapekit.rendering import render_step

    if isinstance(step, UserStep):
        return f"you> {step.content}"
    if isinstance(step, AssistantStep):
        who = step.metadata.agent or "assistant"
        return f"{who}> {step.content}"
    if isinstance(step, ToolCall):
        return f"  [tool call] {step.name} {_short(step.arguments)}"
    if isinstance(step, ToolResult):
        return f"  [tool error] {step.error}" if step.error else f"  [tool result] {_short(step.content)}"
    if isinstance(step, ApprovalDecision):
        edited = f" with {_short(step.arguments)}" if step.arguments is not None else ""
        reason = f" ({step.reason})" if step.reason else ""
        return f"  [{step.decision}] {step.name}{edited}{reason}"
    return f"  · {render_step(step)}" if verbose else None


def _show(steps: Any, verbose: bool) -> None:
    for step in steps:
        line = chat_line(step, verbose)
        if line is not None:
            typer.echo(line)


class _Inputs:
    """Where the person's answers come from: the queued --message/--decision values, or the
    terminal (stdin) when none were given."""

    def __init__(self, messages: list[str], decisions: list[str]) -> None:
        self.scripted = bool(messages or decisions)
        self.messages = deque(messages)
        self.decisions = deque(decisions)

    def _ask(self, prompt: str) -> str | None:
        typer.echo(prompt, nl=False)
        line = sys.stdin.readline()
        if not line:
            typer.echo("")
            return None
        return line.rstrip("\n")

    def message(self) -> str | None:
        if self.scripted:
            return self.messages.popleft() if self.messages else None
        while True:
            text = self._ask("you> ")
            if text is None or text.strip() in QUIT:
                return None
            if text.strip():
                return text

    def in_doubt(self, effect: Any) -> str | None:
        if self.scripted:
            return self.decisions.popleft() if self.decisions else None
        typer.echo(
            f"{effect.tool} {_short(effect.arguments)} may or may not have run (key {effect.key}): "
            "check the outside world"
        )
        while True:
            answer = self._ask("[d]one (it happened) / [f]ailed / [r]etry (run it again): ")
            if answer is None or answer.strip() in QUIT:
                return None
            word = answer.strip().lower()
            if word in ("d", "done"):
                result = self._ask("its result (optional): ")
                return f"done {result or ''}".strip()
            if word in ("f", "failed"):
                reason = self._ask("why (optional): ")
                return f"failed {reason or ''}".strip()
            if word in ("r", "retry"):
                return "retry"

    def decision(self, call: Any) -> str | None:
        if self.scripted:
            return self.decisions.popleft() if self.decisions else None
        question = f"approve {call.name} {_short(call.arguments)}? [y]es / [n]o / [e]dit: "
        while True:
            answer = self._ask(question)
            if answer is None or answer.strip() in QUIT:
                return None
            answer = answer.strip().lower()
            if answer in ("y", "yes"):
                return "approve"
            if answer in ("n", "no"):
                reason = self._ask("reason (optional): ")
                return f"reject {reason or ''}".strip()
            if answer in ("e", "edit"):
                arguments = self._ask("arguments as JSON: ")
                return None if arguments is None else f"edit {arguments}"


def _apply_decision(tape: Tape[Any, Any], call: Any, text: str, environment: Environment | None) -> Any:
    """The tape with the decision ``text`` (``approve``, ``reject [REASON]``, ``edit JSON``)."""
    from tapekit.human import approve, reject

    word, _, rest = text.strip().partition(" ")
    word = word.lower().rstrip(":")
    if word in ("approve", "yes", "y"):
        return approve(tape, call, environment=environment)
    if word in ("reject", "no", "n"):
        return reject(tape, call, reason=rest.strip(), environment=environment)
    if word == "edit":
        try:
            arguments = json.loads(rest)
        except json.JSONDecodeError as e:
            raise CliError(f"--decision edit: the arguments are not JSON ({e}): {rest!r}") from None
        if not isinstance(arguments, dict):
            raise CliError(f"--decision edit: the arguments must be a JSON object, not {rest!r}")
        return approve(tape, call, arguments=arguments, environment=environment)
    raise CliError(f"decision {text!r}: write 'approve', 'reject [REASON]' or 'edit {{JSON arguments}}'")


def _answer(
    tape: Tape[Any, Any],
    waiting: Waiting | None,
    inputs: _Inputs,
    environment: Environment | None,
    store: TapeStore | None = None,
) -> Tape[Any, Any] | None:
    """The tape with the person's answer to what it waits for (None: no answer, stop)."""
    from tapekit.human import reply, resolve_in_doubt

    if waiting is not None and waiting.kind == "in_doubt" and store is not None:
        for effect in waiting.effects:
            text = inputs.in_doubt(effect)
            if text is None:
                return None
            word, _, rest = text.strip().partition(" ")
            try:
                resolve_in_doubt(store, effect.key, word.rstrip(":"), rest)
            except ValueError as e:
                raise CliError(
                    f"--decision {text!r}: {e} (write 'done [RESULT]', 'failed REASON' or 'retry')"
                ) from None
            typer.echo(f"[{effect.tool} marked {word.lower()}]")
        return tape
    if waiting is not None and waiting.kind == "approval":
        for call in waiting.calls:
            text = inputs.decision(call)
            if text is None:
                return None
            tape = _apply_decision(tape, call, text, environment)
            _show(tape.steps[-1:], False)
        return tape
    text = inputs.message()
    if text is None:
        return None
    if inputs.scripted:
        typer.echo(f"you> {text}")
    return reply(tape, text)


def chat_command(
    db: Annotated[str, typer.Option("--db", help="the tape store: an SQLite file or a postgresql:// URL")],
    agent: Annotated[
        str,
        typer.Option("--agent", help="module:attr giving (agent, environment), or a function returning it"),
    ],
    tape: Annotated[
        str,
        typer.Option("--tape", help="new, a tape id (or unique prefix), latest, or waiting (newest waiting)"),
    ] = "new",
    message: Annotated[
        list[str] | None, typer.Option("--message", "-m", help="send this message (repeatable; no prompts)")
    ] = None,
    decision: Annotated[
        list[str] | None,
        typer.Option(
            "--decision",
            "-d",
            help="answer an approval (approve | reject [REASON] | edit JSON) or a tool call in doubt "
            "(done [RESULT] | failed REASON | retry)",
        ),
    ] = None,
    max_loops: Annotated[int, typer.Option("--max-loops", help="agent/environment rounds per turn")] = 50,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="show every step, not just the chat")
    ] = False,
) -> None:
    """Chat with an agent in a session stored in --db; resume any waiting session later.

    The conversation so far is shown, then you answer what the session waits for: a message
    (type it; /quit or end of input stops) or a tool call that needs approval ([y]es, [n]o
    with a reason, or [e]dit its arguments as JSON), or a tool call left in doubt by a crash
    ([d]one with its result, [f]ailed, or [r]etry: see docs/durability.md). Every step is
    stored as it happens; a waiting session is tagged 'waiting' and can be resumed by any
    later process. With
    --message/--decision the answers are taken from the command line instead of the terminal.

    Examples:

    $ tapekit chat --db chat.db --agent tapekit.testing.analyst:team -m "Tell me about Vulcan in 3 sentences"

    $ tapekit chat --db chat.db --agent tapekit.testing.analyst:team --tape waiting -m "And Acme?"

    $ tapekit chat --db mail.db --agent tapekit.testing.mailer:assistant -m "email bob@example.com: lunch?"

    $ tapekit chat --db mail.db --agent tapekit.testing.mailer:assistant --tape waiting -d approve

    $ tapekit chat --db mail.db --agent tapekit.testing.mailer:assistant --tape latest -v
    """
    try:
        _chat(db, agent, tape, message or [], decision or [], max_loops, verbose)
    except CliError as e:
        raise fail(str(e)) from None


def _chat(
    db: str,
    target: str,
    tape_arg: str,
    messages: list[str],
    decisions: list[str],
    max_loops: int,
    verbose: bool,
) -> None:
    from tapekit.core import Tape
    from tapekit.human import run_session, waiting_on
    from tapekit.store import open_store

    agent, environment = load_target(target)
    if environment is None:
        raise CliError(f"{target!r} gives no environment; chat needs (agent, environment)")
    inputs = _Inputs(messages, decisions)
    with open_store(db) as store:
        if tape_arg == "new":
            session: Tape[Any, Any] = Tape()
            typer.echo(f"new session {session.metadata.id} in {db}")
        else:
            session = store.get_tape(pick_tape(store, tape_arg))
            typer.echo(f"session {session.metadata.id} in {db} ({len(session)} steps)")
            _show(session.steps, verbose)
        while True:
            waiting = waiting_on(session, environment, store)
            if waiting is not None or "waiting" in _tags(store, session) or not _can_run(agent, session):
                answered = _answer(session, waiting, inputs, environment, store)
                if answered is None:
                    break
                session = answered
            turn = run_session(agent, environment, session, store=store, tags=["chat"], max_loops=max_loops)
            _show(turn.added, verbose)
            if turn.waiting is not None and turn.waiting.kind == "in_doubt":
                typer.echo(f"[waits: {turn.waiting.message}]")
            session = turn.tape
            if turn.stopped != "waiting":
                error = session.metadata.error
                typer.echo(f"[session {turn.stopped}{': ' + error if error else ''}]")
                break
        _say_how_to_resume(store, session, db, target)


def _can_run(agent: Any, session: Any) -> bool:
    """Whether the agent or the environment has something to do without the person: the
    tape ends with an observation, an action to answer, or a node run cut short."""
    from tapekit.core import Observation
    from tapekit.environment import unanswered_actions

    if len(session) == 0:
        return False
    if isinstance(session.steps[-1], Observation) or unanswered_actions(session):
        return True
    return bool(agent.compute_view(session).top.run_open)


def _tags(store: TapeStore, session: Tape[Any, Any]) -> list[str]:
    from tapekit.store import TapeNotFoundError

    try:
        return list(store.get_tape_info(session.metadata.id).tags)
    except TapeNotFoundError:
        return []


def _say_how_to_resume(store: TapeStore, session: Tape[Any, Any], db: str, target: str) -> None:
    if "waiting" in _tags(store, session):
        typer.echo(
            f"session {session.metadata.id} waits; resume it with: "
            f"tapekit chat --db {db} --agent {target} --tape {session.metadata.id}"
        )
