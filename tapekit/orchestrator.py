"""The orchestrator: alternate the agent and the environment on a tape, and replay tapes.

``main_loop`` resumes from any tape with no other state: if the tape ends in the middle of a
node run the agent finishes that run; if it ends with unanswered actions the environment
answers them first; otherwise the agent continues. ``replay_tape`` re-runs an agent with the
recorded LLM outputs and observations and says whether it makes the same tape.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tapekit._diff import diff_text, first_divergence, signatures
from tapekit._engine.loop import alternate
from tapekit._sync import run_sync
from tapekit.agent import Agent
from tapekit.core import Action, Observation, Step, Tape
from tapekit.effects import Journal, reset_journal, set_journal
from tapekit.environment import Environment, ExternalObservationNeeded, unanswered_actions
from tapekit.events import AsyncMainLoopStream, MainLoopEvent, MainLoopStream
from tapekit.llm.base import LLMCall
from tapekit.llm.replay import ReplayLLM
from tapekit.reconstruction import rebuilt_runs
from tapekit.recording import SessionRecorder
from tapekit.store.base import TapeStore


def amain_loop(
    agent: Agent,
    tape: Tape[Any, Any],
    environment: Environment | None = None,
    max_loops: int | None = None,
    *,
    store: TapeStore | None = None,
    tape_id: str | None = None,
    tags: Iterable[str] = (),
    recorder: SessionRecorder | None = None,
) -> AsyncMainLoopStream:
    """Alternate agent turns and environment reactions on ``tape`` until the agent is done
    (no action to answer), an error is recorded on the tape, an action waits on the outside
    world, or ``max_loops`` agent/environment rounds have run.

    Without an ``environment`` nothing answers the agent's actions: the loop stops at the
    first one as if it waited on the outside world (an ``external`` event saying so), and a
    fork branch that makes one fails. The loop is :func:`tapekit._engine.alternate`, the one
    that runs fork branches too.

    With a ``store`` (a tapekit store), the session is persisted as it runs, under ``tape_id``
    (default: the start tape's id) with ``tags``: every step as soon as it is made, every LLM
    call when it completes, the metadata after each turn, and the final tape when the loop
    ends (see :mod:`tapekit.recording`). A crash loses at most what the store's writer had not
    committed yet, and the stored tape is a resume point. ``recorder`` is a
    :class:`~tapekit.recording.SessionRecorder` configured by hand instead (the batch runner's
    way of storing a tape one step behind).
    """
    if store is not None:
        if recorder is not None:
            raise ValueError("pass either store= or recorder=, not both")
        recorder = SessionRecorder(store, tape, tape_id, tags=tags)
    elif tape_id is not None or tuple(tags):
        raise ValueError("tape_id= and tags= say how to store the session: pass store= too")
    events = alternate(agent, tape, environment, max_loops)
    if recorder is not None:
        events = _recorded(events, recorder)
    return AsyncMainLoopStream(events, tape)


async_main_loop = amain_loop
"""The former name of :func:`amain_loop` (kept as an alias)."""


def main_loop(
    agent: Agent,
    tape: Tape[Any, Any],
    environment: Environment | None = None,
    max_loops: int | None = None,
    *,
    store: TapeStore | None = None,
    tape_id: str | None = None,
    tags: Iterable[str] = (),
    recorder: SessionRecorder | None = None,
) -> MainLoopStream:
    """Sync version of :func:`amain_loop`."""
    stream = amain_loop(
        agent, tape, environment, max_loops, store=store, tape_id=tape_id, tags=tags, recorder=recorder
    )
    return MainLoopStream(stream.__aiter__(), tape)


async def _recorded(
    events: AsyncIterator[MainLoopEvent], recorder: SessionRecorder
) -> AsyncIterator[MainLoopEvent]:
    """The loop's events, each handed to ``recorder`` before the caller sees it; the final
    tape is written when the loop ends, and whatever was made when it is stopped early."""
    await recorder.astart()
    journal = None if recorder.store is None else Journal(recorder.store, recorder)
    try:
        while True:
            # the environment's once tools find the session's journal here (tapekit.effects)
            token = set_journal(journal)
            try:
                event = await anext(events)
            except StopAsyncIteration:
                break
            finally:
                reset_journal(token)
            await recorder.record(event)
            yield event
    except BaseException:  # cancelled, closed early, or failed: keep every step made so far
        with contextlib.suppress(Exception):
            recorder.write_all()
        raise
    recorder.finish()


# --------------------------------------------------------------------------- replay


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The outcome of :func:`replay_tape`: ``ok`` if the agent made the recorded tape again.

    ``tape`` is the tape the replay made; ``diff`` a unified diff of the two (one JSON line per
    step, ids left out) and ``first_divergence`` the first differing step index, when not ok.
    """

    ok: bool
    tape: Tape[Any, Any]
    diff: str = ""
    first_divergence: int | None = None
    error: str | None = None

    def __bool__(self) -> bool:
        return self.ok


class _ReplayEnvironment(Environment):
    """Answers each group of actions with the observations that followed the same actions on
    the recorded tape. Looked up by content, not position, so the concurrent branches of a
    fork (which see their own tapes) are answered too; equal action groups are answered in
    the recorded order."""

    name = "replay"

    def __init__(self, recorded: Tape[Any, Any]) -> None:
        self.recorded = recorded
        self._answers: dict[str, deque[list[Step]]] = {}
        steps = recorded.steps
        actions: list[Step] = []
        i = 0
        while i < len(steps):
            if steps[i].metadata.agent:
                if isinstance(steps[i], Action):
                    actions.append(steps[i])
                i += 1
                continue
            group = []
            while i < len(steps) and not steps[i].metadata.agent:
                group.append(steps[i])
                i += 1
            self._answers.setdefault(_actions_key(actions), deque()).append(group)
            if any(isinstance(s, Observation) for s in group):
                actions = []

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        actions = unanswered_actions(tape)
        answers = self._answers.get(_actions_key(actions))
        if not answers:
            said = ", ".join(f"{a.kind} {json.dumps(a.llm_dict(), sort_keys=True)[:120]}" for a in actions)
            raise ExternalObservationNeeded(
                actions[-1] if actions else tape.steps[-1],  # type: ignore[arg-type]
                f"the recorded tape has no observations answering these actions: {said or 'none'}",
            )
        return tape.with_new_steps(answers.popleft(), author=self.name)


def _actions_key(actions: Sequence[Step]) -> str:
    return json.dumps([a.llm_dict() for a in actions], sort_keys=True, default=str)


def reconstruct_llm_calls(agent: Agent, tape: Tape[Any, Any]) -> list[LLMCall]:
    """The LLM calls behind a tape, rebuilt with each node's ``make_prompt`` and
    ``make_llm_output`` (for replay when the calls were not stored)."""
    runs = rebuilt_runs(agent, tape)
    return [LLMCall(prompt=r.prompt, output=r.output, model="reconstructed") for r in runs]


def _replaying(agent: Agent, llm: ReplayLLM) -> Agent:
    clone = agent.clone()
    stack = [clone]
    while stack:
        member = stack.pop()
        member.llms = {key: llm for key in member.llms} or {"default": llm}
        stack.extend(member.subagents)
    return clone


async def areplay_tape(
    agent: Agent,
    tape: Tape[Any, Any],
    llm_calls: list[LLMCall] | None = None,
    start_tape: Tape[Any, Any] | None = None,
) -> ReplayResult:
    """Re-run ``agent`` from the start of ``tape`` with recorded LLM outputs and observations.

    ``llm_calls`` are the recorded calls (rebuilt from the tape with ``make_llm_output`` when
    omitted); ``start_tape`` defaults to the steps before the first one an agent made. The
    agent's own LLMs are not called.
    """
    if start_tape is None:
        n = next((i for i, s in enumerate(tape.steps) if s.metadata.agent), len(tape))
        start_tape = tape[:n]
    calls = llm_calls if llm_calls is not None else reconstruct_llm_calls(agent, tape)
    replayer = _replaying(agent, ReplayLLM(calls=calls))
    made = await amain_loop(replayer, start_tape, _ReplayEnvironment(tape)).get_final_tape()
    expected, actual = signatures(tape.steps), signatures(made.steps)
    index = first_divergence(expected, actual)
    error = made.metadata.error
    if index is None and error is None:
        return ReplayResult(ok=True, tape=made)
    diff = diff_text(expected, actual, ("recorded", "replayed"))
    return ReplayResult(ok=False, tape=made, diff=diff, first_divergence=index, error=error)


def replay_tape(
    agent: Agent,
    tape: Tape[Any, Any],
    llm_calls: list[LLMCall] | None = None,
    start_tape: Tape[Any, Any] | None = None,
) -> ReplayResult:
    """Sync version of :func:`areplay_tape`."""
    return run_sync(areplay_tape(agent, tape, llm_calls, start_tape))
