"""Nodes and agents: the pure, configurable part of an agentic system.

A :class:`Node` turns a tape into a prompt and an LLM output into steps. An :class:`Agent` is a
pydantic model of LLMs, templates, nodes and subagents; ``agent.arun(tape)`` picks the active
(sub)agent from the tape view stack, lets it pick its node, calls the LLM, appends the node's
steps, and repeats until a node run produces an action. The agent never looks at anything but
the tape, so any tape is a resume point.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SerializeAsAny

from tapekit._diff import diff_text
from tapekit._sync import iterate_sync, run_sync
from tapekit.core import (
    Action,
    Call,
    Fork,
    LLMOutput,
    PartialStep,
    Prompt,
    Respond,
    SetNextNode,
    Step,
    StepMetadata,
    StepSequence,
    StopStep,
    Tape,
    TapeMetadata,
    new_id,
)
from tapekit.llm.base import LLM, LLMCall, LLMEvent, LLMStream, TrainingText
from tapekit.views import TapeView, TapeViewStack

if TYPE_CHECKING:
    from tapekit.environment import Environment

__all__ = [
    "Agent",
    "AgentError",
    "AgentEvent",
    "AgentStream",
    "AsyncAgentStream",
    "Node",
    "NodeRun",
    "ReconstructionError",
    "node_run_steps",
]

logger = logging.getLogger(__name__)


class AgentError(RuntimeError):
    """The agent's configuration or the tape does not let it continue (named in the message)."""


class ReconstructionError(ValueError):
    """A node's ``make_llm_output`` does not reproduce the steps on the tape (diff included)."""


class Node(BaseModel):
    """One LLM call and the processing of its output. Subclass it and keep the methods pure.

    ``name`` defaults to the class name; ``llm`` picks one of the agent's ``llms`` by key ('' is
    fine when the agent has a single LLM).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = ""
    llm: str = ""

    def model_post_init(self, context: Any, /) -> None:
        """Default the name to the class name."""
        if not self.name:
            self.name = type(self).__name__

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt | None:
        """The prompt for this node run, or None for a node that calls no LLM."""
        return None

    def generate_steps(
        self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream
    ) -> Iterator[Step | PartialStep]:
        """Steps (and optionally partial steps) made from the LLM output (empty stream if no
        prompt). Must yield at least one step."""
        raise NotImplementedError(f"node {self.name!r} ({type(self).__name__}) has no generate_steps")

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The LLM output that would make this node produce the steps at ``tape[index:]``.

        Needed for training text, ``Agent.reuse`` and replay without recorded LLM calls.
        """
        raise NotImplementedError(
            f"node {self.name!r} ({type(self).__name__}) does not implement make_llm_output, "
            "so its runs cannot be turned into training data or reused"
        )


class NodeRun(NamedTuple):
    """A node run found on a tape: the node and the index of the run's first step."""

    node: Node
    index: int


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """One thing that happened while the agent ran; exactly one field is set.

    ``chunk``: LLM text as it streams; ``llm_call``: a completed LLM call (prompt and output);
    ``partial_step``: a step being formed; ``step``: a step just added to the tape;
    ``final_tape``: the agent's resulting tape (last event; ``metadata.error`` set on failure).
    """

    chunk: str | None = None
    llm_call: LLMCall | None = None
    partial_step: PartialStep | None = None
    step: Step | None = None
    final_tape: Tape[Any, Any] | None = None


class AsyncAgentStream:
    """The events of one ``agent.arun``: ``async for`` them, or await :meth:`get_final_tape`."""

    def __init__(self, events: AsyncIterator[AgentEvent]) -> None:
        self._events = events

    def __aiter__(self) -> AsyncIterator[AgentEvent]:
        return self._events

    async def get_final_tape(self) -> Tape[Any, Any]:
        """Run to the end and return the final tape."""
        final = None
        async for event in self._events:
            if event.final_tape is not None:
                final = event.final_tape
        if final is None:
            raise AgentError("the agent stream ended without a final tape")
        return final


class AgentStream:
    """The events of one ``agent.run`` (sync): iterate them, or call :meth:`get_final_tape`."""

    def __init__(self, events: AsyncIterator[AgentEvent]) -> None:
        self._events = events
        self._iter: Iterator[AgentEvent] | None = None

    def __iter__(self) -> Iterator[AgentEvent]:
        if self._iter is None:
            self._iter = iterate_sync(self._events)
        return self._iter

    def get_final_tape(self) -> Tape[Any, Any]:
        """Run to the end and return the final tape."""
        return run_sync(AsyncAgentStream(self._events).get_final_tape())

    def get_steps(self) -> list[Step]:
        """Run to the end and return the steps the agent added."""
        return [e.step for e in self if e.step is not None]


class Agent(BaseModel):
    """A configurable, optimisable agent: LLMs, prompt templates, nodes and subagents.

    Use :meth:`create` to build one. An agent object belongs to one team: to use the same
    agent under two managers, pass ``agent.clone()`` to the second.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    llms: dict[str, SerializeAsAny[LLM]] = Field(default_factory=dict)
    templates: dict[str, Any] = Field(default_factory=dict)
    nodes: list[SerializeAsAny[Node]] = Field(default_factory=list)
    subagents: list[SerializeAsAny[Agent]] = Field(default_factory=list)
    max_iterations: int = 100

    _manager: Agent | None = PrivateAttr(None)

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(
        cls,
        name: str,
        llms: LLM | dict[str, LLM] | None = None,
        nodes: list[Node] | None = None,
        subagents: list[Agent] | None = None,
        templates: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Self:
        """Build an agent; a single LLM is stored under the key ``"default"``."""
        if isinstance(llms, LLM):
            llms = {"default": llms}
        return cls(
            name=name,
            llms=llms or {},
            nodes=nodes or [],
            subagents=subagents or [],
            templates=templates or {},
            **kwargs,
        )

    def model_post_init(self, context: Any, /) -> None:
        """Check names and adopt the subagents (each agent belongs to one manager)."""
        if not self.name or "/" in self.name:
            raise ValueError(f"agent name {self.name!r} must be non-empty and contain no '/'")
        _check_unique([n.name for n in self.nodes], f"agent {self.name!r} has two nodes named")
        _check_unique([a.name for a in self.subagents], f"agent {self.name!r} has two subagents named")
        for sub in self.subagents:
            if sub._manager is not None and sub._manager is not self:
                raise ValueError(
                    f"agent {sub.name!r} already belongs to {sub._manager.full_name!r}; "
                    "pass a .clone() to a second manager"
                )
            sub._manager = self

    def clone(self) -> Self:
        """A deep copy of the configuration (nodes, templates, subagents), detached from any
        manager. LLM clients are shared, not copied: they hold connections, not configuration."""
        return self.model_copy(
            update={
                "nodes": [n.model_copy(deep=True) for n in self.nodes],
                "templates": copy.deepcopy(self.templates),
                "subagents": [s.clone() for s in self.subagents],
                "llms": dict(self.llms),
            }
        )._relinked()

    def _relinked(self) -> Self:
        self._manager = None
        for sub in self.subagents:
            sub._manager = self
        return self

    # ------------------------------------------------------------------ the team tree

    @property
    def manager(self) -> Agent | None:
        """The agent this one is a subagent of (None for a root agent)."""
        return self._manager

    @property
    def root(self) -> Agent:
        """The top agent of this agent's team."""
        agent = self
        while agent._manager is not None:
            agent = agent._manager
        return agent

    @property
    def full_name(self) -> str:
        """The hierarchical name, e.g. ``analyst/search_agent``; steps record it."""
        if self._manager is None:
            return self.name
        return f"{self._manager.full_name}/{self.name}"

    def find_subagent(self, name: str) -> Agent:
        """The direct subagent called ``name``."""
        for sub in self.subagents:
            if sub.name == name:
                return sub
        known = ", ".join(repr(s.name) for s in self.subagents) or "none"
        raise AgentError(f"agent {self.full_name!r} has no subagent {name!r} (its subagents: {known})")

    def find_agent(self, full_name: str) -> Agent:
        """The team member with hierarchical name ``full_name`` (from this agent down)."""
        head, _, rest = full_name.partition("/")
        if head != self.name:
            raise AgentError(f"agent {full_name!r} is not in the team of {self.full_name!r}")
        agent = self
        while rest:
            head, _, rest = rest.partition("/")
            agent = agent.find_subagent(head)
        return agent

    def find_node(self, name: str | int) -> Node:
        """A node by name, or by index into ``nodes``."""
        if isinstance(name, int):
            if 0 <= name < len(self.nodes):
                return self.nodes[name]
            raise AgentError(f"agent {self.full_name!r} has no node #{name} ({len(self.nodes)} nodes)")
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(repr(n.name) for n in self.nodes) or "none"
        raise AgentError(f"agent {self.full_name!r} has no node {name!r} (its nodes: {known})")

    def llm_for(self, node: Node) -> LLM:
        """The LLM that ``node`` uses: ``llms[node.llm]``, or the agent's only LLM."""
        if node.llm:
            if node.llm in self.llms:
                return self.llms[node.llm]
            raise AgentError(
                f"node {node.name!r} of agent {self.full_name!r} wants LLM {node.llm!r}, "
                f"but the agent has {sorted(self.llms)}"
            )
        if len(self.llms) == 1:
            return next(iter(self.llms.values()))
        if "default" in self.llms:
            return self.llms["default"]
        raise AgentError(
            f"node {node.name!r} of agent {self.full_name!r} makes a prompt but names no LLM, "
            f"and the agent has {len(self.llms)} LLMs: {sorted(self.llms)}"
        )

    # ------------------------------------------------------------------ views and node choice

    def compute_view(self, tape: Tape[Any, Any]) -> TapeViewStack:
        """The tape view stack of this agent's team for ``tape`` (memoised, incremental)."""
        return TapeViewStack.compute(tape, self.root.name)

    def select_node(self, view: TapeView) -> Node:
        """The node to run next, given this agent's view: the target of a ``SetNextNode`` made
        in the last node run, else the node after the last one that ran, else the first."""
        if not self.nodes:
            raise AgentError(f"agent {self.full_name!r} has no nodes")
        if view.next_node is not None:
            return self.find_node(view.next_node)
        if view.last_node is None:
            return self.nodes[0]
        index = self.nodes.index(self.find_node(view.last_node)) + 1
        if index >= len(self.nodes):
            raise AgentError(
                f"agent {self.full_name!r} ran its last node {view.last_node!r} and no "
                "SetNextNode says which node runs next"
            )
        return self.nodes[index]

    # ------------------------------------------------------------------ running

    def arun(self, tape: Tape[Any, Any], environment: Environment | None = None) -> AsyncAgentStream:
        """Continue ``tape`` until a node run makes an action (or a ``StopStep``, or a
        ``Respond`` from the root). Streams :class:`AgentEvent`; the last carries the tape.

        ``environment`` answers the actions made inside the branches of a :class:`Fork`, which
        run concurrently within this turn (the main loop passes its own); without one, a branch
        that makes an action is an error.
        """
        if self._manager is not None:
            raise AgentError(
                f"run the root agent {self.root.name!r}, not its subagent {self.full_name!r} "
                "(or run a .clone() of the subagent on its own)"
            )
        return AsyncAgentStream(self._arun(tape, environment))

    def run(self, tape: Tape[Any, Any], environment: Environment | None = None) -> AgentStream:
        """Sync version of :meth:`arun`."""
        if self._manager is not None:
            self.arun(tape)  # raises the explanatory error
        return AgentStream(self._arun(tape, environment))

    async def _arun(
        self, start: Tape[Any, Any], environment: Environment | None = None, branch_len: int = 0
    ) -> AsyncIterator[AgentEvent]:
        """The agent's turn. ``branch_len`` > 0 runs one fork branch: the turn also ends when
        the branch's subagent responds (the view stack is back to ``branch_len`` views), and
        only forks made inside the branch are this turn's to run."""
        tape = start
        seq = tape.steps  # the steps made so far, ahead of `tape` within a node run
        where = ""
        try:
            iterations = 0
            stack = self.compute_view(tape)
            top = stack.top
            if _pending_fork(stack, branch_len) is None and top.run_open and top.last_node is not None:
                where = f"finishing the interrupted run of {top.agent_name}.{top.last_node}"
                async for item in self._finish_open_run(tape, stack, branch_len):
                    if isinstance(item, _Finished):
                        tape = item.tape
                        if item.stop:
                            yield AgentEvent(final_tape=self._final(start, tape))
                            return
                    else:
                        yield item
            while True:
                stack = self.compute_view(tape)
                fork_at = _pending_fork(stack, branch_len)
                if fork_at is not None:
                    where = f"the fork of {stack.views[fork_at].agent_name}"
                    async for item in self._run_fork(tape, stack, fork_at, environment):
                        if isinstance(item, _Finished):
                            tape = item.tape
                            if item.error is not None:
                                raise AgentError(item.error)
                        else:
                            yield item
                    continue
                if iterations >= self.max_iterations:
                    raise AgentError(
                        f"agent {self.name!r} ran {self.max_iterations} node runs (max_iterations) "
                        "without making an action"
                    )
                iterations += 1
                seq = tape.steps
                top = stack.top
                closes_branch = _closes_branch(stack, branch_len)
                agent = self.find_agent(top.agent_name)
                node = agent.select_node(top)
                where = f"node {agent.full_name}.{node.name}"
                prompt = node.make_prompt(agent, tape)
                stream = LLMStream()
                if prompt is not None:
                    async for event in self._call_llm(agent, node, prompt):
                        if isinstance(event, LLMStream):
                            stream = event
                        else:
                            yield event
                prompt_id = prompt.id if prompt is not None else new_id()
                run_tape = tape
                stop = False
                for step, is_last in _with_last(node.generate_steps(agent, run_tape, stream), where):
                    if isinstance(step, PartialStep):
                        yield AgentEvent(partial_step=step)
                        continue
                    if isinstance(step, Call | Respond | Fork) and not is_last:
                        raise AgentError(
                            f"{where} made a {step.kind} that is not the last step of its node run; "
                            "put SetNextNode and other steps before it"
                        )
                    step = _attributed(step, agent.full_name, node.name, prompt_id, is_last)
                    seq = seq.appended([step])
                    yield AgentEvent(step=step)
                    stop = stop or _ends_turn(step, agent is self, closes_branch)
                tape = tape.model_copy(update={"steps": seq})
                if stop:
                    break
        except Exception as e:  # recorded on the tape; CancelledError is not an Exception
            if len(seq) > len(tape):
                tape = tape.model_copy(update={"steps": seq})
            message = f"{type(e).__name__}: {e}" + (f" (in {where})" if where else "")
            logger.warning("agent %s failed: %s", self.name, message)
            logger.debug("traceback of the failure of agent %s", self.name, exc_info=True)
            yield AgentEvent(final_tape=self._final(start, tape, error=message))
            return
        yield AgentEvent(final_tape=self._final(start, tape))

    async def _call_llm(
        self, agent: Agent, node: Node, prompt: Prompt
    ) -> AsyncIterator[AgentEvent | LLMStream]:
        llm = agent.llm_for(node)
        events: list[LLMEvent] = []
        t0 = time.perf_counter()
        async for event in llm.astream(prompt):
            events.append(event)
            if event.chunk:
                yield AgentEvent(chunk=event.chunk)
        stream = LLMStream(events, prompt)
        last = events[-1]
        prompt_tokens, output_tokens = last.prompt_tokens or 0, last.output_tokens or 0
        call = LLMCall(
            prompt=prompt,
            output=stream.get_output(),
            model=llm.model_name,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            cost=llm.cost(prompt_tokens, output_tokens),
            latency_s=time.perf_counter() - t0,
            tokens=last.tokens,
        )
        yield AgentEvent(llm_call=call)
        yield stream

    async def _finish_open_run(
        self, tape: Tape[Any, Any], stack: TapeViewStack, branch_len: int
    ) -> AsyncIterator[AgentEvent | _Finished]:
        """Finish a node run that the tape was cut in the middle of: re-make its prompt from the
        run's start, get the LLM output again (a cache or replay gives the recorded one), and
        append the steps the run had not yet added. Ends with a :class:`_Finished`."""
        top = stack.top
        agent = self.find_agent(top.agent_name)
        node = agent.find_node(top.last_node)  # type: ignore[arg-type]
        start = top.run_start
        run_tape = _tape_of(tape, top.visible(start))
        closes_branch = _closes_branch(stack, branch_len)
        existing = list(tape.steps[start:])
        prompt_id = existing[0].metadata.prompt_id
        prompt = node.make_prompt(agent, run_tape)
        stream = LLMStream()
        if prompt is not None:
            prompt = prompt.model_copy(update={"id": prompt_id})
            async for event in self._call_llm(agent, node, prompt):
                if isinstance(event, LLMStream):
                    stream = event
                else:
                    yield event
        made = [s for s in node.generate_steps(agent, run_tape, stream) if isinstance(s, Step)]
        mismatch = _content_diff(existing, made[: len(existing)], ("on the tape", "made now"))
        if mismatch is not None:
            raise AgentError(
                f"cannot finish the interrupted run of {agent.full_name}.{node.name}: run again, "
                "it makes different steps (use the recorded LLM output, e.g. a cache or replay)\n" + mismatch
            )
        rest = made[len(existing) :]
        for i, step in enumerate(rest):
            step = _attributed(step, agent.full_name, node.name, prompt_id, i == len(rest) - 1)
            tape = tape.model_copy(update={"steps": tape.steps.appended([step])})
            yield AgentEvent(step=step)
        yield _Finished(tape, any(_ends_turn(s, agent is self, closes_branch) for s in made))

    async def _run_fork(
        self, tape: Tape[Any, Any], stack: TapeViewStack, at: int, environment: Environment | None
    ) -> AsyncIterator[AgentEvent | _Finished]:
        """Run the branches of the fork pending in view ``at`` concurrently and join them.

        Each branch runs on its own tape (the tape as it was at the fork, its Call, its own
        steps). Steps reach the caller in branch order: the first unfinished branch streams
        live, later ones are held back until the branches before them are done, so the tape
        (and the store writing it) always shows whole branches followed by at most one
        partial one. A tape cut inside the fork therefore resumes here: finished branches are
        kept, the partial one is finished from its own view, the missing ones start.
        """
        view = stack.views[at]
        fork = view.fork
        assert fork is not None
        forker, node_name = fork.metadata.agent, fork.metadata.node
        base = _tape_of(tape, view.fork_visible)
        runs: list[tuple[int, Tape[Any, Any], int]] = []  # (branch, its tape, steps already on `tape`)
        first_new = view.fork_done
        if len(stack) > at + 1:  # the tape ends inside branch `fork_done`: finish it
            partial = _tape_of(tape, stack.views[at + 1].visible(len(tape)))
            runs.append((view.fork_done, partial, len(partial)))
            first_new += 1
        for k in range(first_new, len(fork.branches)):
            call = _attributed(fork.call(k), forker, node_name, "", False)
            runs.append((k, base.model_copy(update={"steps": base.steps.appended([call])}), len(base)))

        queue: asyncio.Queue[tuple[int, AgentEvent | _BranchEnd]] = asyncio.Queue()

        async def pump(k: int, branch: Tape[Any, Any], known: int) -> None:
            try:
                async for item in self._run_branch(branch, known, at + 1, environment):
                    await queue.put((k, item))
            except Exception as e:  # reported with the branch; CancelledError passes through
                await queue.put((k, _BranchEnd(branch, f"{type(e).__name__}: {e}")))

        tasks = [asyncio.create_task(pump(k, b, known)) for k, b, known in runs]
        order = [k for k, _, _ in runs]
        held: dict[int, list[AgentEvent]] = {k: [] for k in order}
        ended: dict[int, _BranchEnd] = {}
        head = 0
        seq = tape.steps
        try:
            while head < len(order):
                k, item = await queue.get()
                if isinstance(item, _BranchEnd):
                    ended[k] = item
                elif item.step is not None and k != order[head]:
                    held[k].append(item)
                    continue
                else:
                    if item.step is not None:
                        seq = seq.appended([item.step])
                    yield item
                    continue
                while head < len(order) and order[head] in ended:
                    end = ended[order[head]]
                    if end.error is not None:
                        name = fork.branches[order[head]].agent_name
                        message = f"branch {order[head]} ({name}) of the fork failed: {end.error}"
                        yield _Finished(tape.model_copy(update={"steps": seq}), False, message)
                        return
                    head += 1
                    if head < len(order):
                        for event in held.pop(order[head]):
                            seq = seq.appended([event.step])  # type: ignore[list-item]
                            yield event
            yield _Finished(tape.model_copy(update={"steps": seq}), False)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_branch(
        self, tape: Tape[Any, Any], known: int, branch_len: int, environment: Environment | None
    ) -> AsyncIterator[AgentEvent | _BranchEnd]:
        """One fork branch: agent turns, and environment reactions to the branch's actions,
        until the branch's subagent responds. Steps past ``known`` are new to the caller."""
        from tapekit.environment import ExternalObservationNeeded, unanswered_actions

        for step in tape.steps[known:]:
            yield AgentEvent(step=step)
        while True:
            final = None
            async for event in self._arun(tape, environment, branch_len):
                if event.final_tape is not None:
                    final = event.final_tape
                else:
                    yield event
            assert final is not None
            tape = final
            if tape.metadata.error is not None:
                yield _BranchEnd(tape, tape.metadata.error)
                return
            if len(self.compute_view(tape)) <= branch_len:
                yield _BranchEnd(tape, None)
                return
            actions = unanswered_actions(tape)
            if not actions:
                yield _BranchEnd(tape, "the branch stopped before its subagent responded")
                return
            if environment is None:
                kinds = ", ".join(sorted({a.kind for a in actions}))
                yield _BranchEnd(
                    tape,
                    f"the branch made actions ({kinds}) but the agent runs without an environment: "
                    "run it with main_loop/async_main_loop, or pass environment= to arun",
                )
                return
            try:
                new = await environment.areact(tape)
            except ExternalObservationNeeded as e:
                yield _BranchEnd(tape, f"a branch cannot wait on the outside world ({e})")
                return
            for step in new.steps[len(tape) :]:
                yield AgentEvent(step=step)
            tape = new

    def _final(self, start: Tape[Any, Any], tape: Tape[Any, Any], error: str | None = None) -> Tape[Any, Any]:
        meta = TapeMetadata(
            parent_id=start.metadata.id,
            author=self.name,
            n_added_steps=len(tape) - len(start),
            error=error,
        )
        return tape.model_copy(update={"metadata": meta})

    # ------------------------------------------------------------------ tapes as data

    def get_node_runs(self, tape: Tape[Any, Any]) -> list[NodeRun]:
        """Every node run of this team on ``tape``: (node, index of the run's first step)."""
        runs: list[NodeRun] = []
        last_pid = None
        for i, step in enumerate(tape.steps):
            meta = step.metadata
            if meta.prompt_id and meta.agent and meta.prompt_id != last_pid:
                runs.append(NodeRun(self.root.find_agent(meta.agent).find_node(meta.node), i))
            last_pid = meta.prompt_id or None
        return runs

    def visible_prefix(self, tape: Tape[Any, Any], index: int) -> Tape[Any, Any]:
        """The tape that the node run starting at ``tape.steps[index]`` saw: the steps before
        it, minus the steps of the other branches of any :class:`Fork` it runs inside."""
        stack = TapeViewStack.compute(tape.steps[:index], self.root.name)
        return _tape_of(tape, stack.top.visible(index))

    def node_run_context(self, tape: Tape[Any, Any], index: int) -> tuple[Tape[Any, Any], int]:
        """``(tape, index)`` as the node run at ``index`` knew them: its :meth:`visible_prefix`
        followed by the run's steps, and the run's index there. Outside forks, that is
        ``(tape, index)`` itself. Rebuild prompts and LLM outputs from this pair."""
        prefix = self.visible_prefix(tape, index)
        if len(prefix) == index:
            return tape, index
        run = node_run_steps(tape, index)
        return prefix.model_copy(update={"steps": prefix.steps.appended(run)}), len(prefix)

    def make_training_text(self, tape: Tape[Any, Any]) -> list[TrainingText]:
        """Training text for every LLM-backed node run on ``tape``.

        Each run's LLM output is rebuilt with ``node.make_llm_output`` and checked by running
        ``generate_steps`` on it: it must give back exactly the run's steps, otherwise a
        :class:`ReconstructionError` shows the difference.
        """
        texts: list[TrainingText] = []
        for run in self._rebuilt_runs(tape):
            agent, node = run.agent, run.node
            steps = node_run_steps(run.context, run.at)
            made = [
                s
                for s in node.generate_steps(agent, run.prefix, LLMStream.from_output(run.output, run.prompt))
                if isinstance(s, Step)
            ]
            _check_same(steps, made, run.where)
            text = agent.llm_for(node).make_training_text(run.prompt, run.output)
            texts.append(
                text.model_copy(
                    update={
                        "prompt_id": steps[0].metadata.prompt_id,
                        "agent": agent.full_name,
                        "node": node.name,
                    }
                )
            )
        return texts

    def _rebuilt_runs(self, tape: Tape[Any, Any]) -> Iterator[_RebuiltRun]:
        """Every LLM-backed node run on ``tape`` with its prompt remade from what the run saw
        and its output rebuilt by ``make_llm_output`` (what training text and replay need)."""
        root = self.root
        for node, index in self.get_node_runs(tape):
            agent = root.find_agent(tape.steps[index].metadata.agent)
            context, at = root.node_run_context(tape, index)
            prefix = context[:at]
            prompt = node.make_prompt(agent, prefix)
            if prompt is None:
                continue
            where = f"{agent.full_name}.{node.name} at step {index}"
            output = _reconstructed(node, agent, context, at, where)
            yield _RebuiltRun(agent, node, where, context, at, prefix, prompt, output)

    def reuse(self, tape: Tape[Any, Any]) -> tuple[Tape[Any, Any], list[LLMCall]]:
        """Adapt a tape made by another agent: the same steps, attributed to this team's agents
        and nodes as if this team had made them, plus the LLM calls it would have made.

        Steps made by no agent (``metadata.agent`` empty: user messages, observations) are kept
        as they are. For the others, this team's next node is chosen as usual and its
        ``make_llm_output`` must reproduce them. ``SetNextNode`` steps are each agent's own
        routing, so the original's are dropped and this team's own take their place. A
        :class:`ReconstructionError` says where the tape cannot be reproduced.
        """
        if self._manager is not None:
            return self.root.reuse(tape)
        if any(isinstance(s, Fork) for s in tape.steps):
            raise ReconstructionError(
                "reuse does not adapt tapes with forks yet: their branches would have to be "
                "re-attributed branch by branch; use make_training_text on the original team"
            )
        new = tape.model_copy(
            update={
                "steps": StepSequence(),
                "metadata": TapeMetadata(
                    parent_id=tape.metadata.parent_id, author=self.name, author_tape_id=tape.metadata.id
                ),
            }
        )
        calls: list[LLMCall] = []
        steps = tape.steps
        i = idle_runs = 0
        while i < len(steps):
            step = steps[i]
            if not step.metadata.agent:
                new = new.model_copy(update={"steps": new.steps.appended([step])})
                i += 1
                continue
            end = i  # the agents' steps up to the next external step
            while end < len(steps) and steps[end].metadata.agent:
                end += 1
            originals = [s for s in steps[i:end] if not isinstance(s, SetNextNode)]
            if not originals:  # only the original agent's routing is left: drop it
                i = end
                continue
            top = self.compute_view(new).top
            agent = self.find_agent(top.agent_name)
            node = agent.select_node(top)
            where = f"{agent.full_name}.{node.name} at step {i}"
            prompt = node.make_prompt(agent, new)
            stream = LLMStream()
            if prompt is not None:
                output = _reconstructed(node, agent, tape, i, where)
                stream = LLMStream.from_output(output, prompt)
                calls.append(LLMCall(prompt=prompt, output=output, model=agent.llm_for(node).model_name))
            made = [s for s in node.generate_steps(agent, new, stream) if isinstance(s, Step)]
            if not made:
                raise ReconstructionError(f"{where}: the node produced no steps")
            content = [s for s in made if not isinstance(s, SetNextNode)]
            _check_same(originals[: len(content)], content, where, allow_empty=True)
            matched, last_pid = 0, None
            while matched < len(content):  # advance past the matched steps and the original's routing
                if not isinstance(steps[i], SetNextNode):
                    matched += 1
                    last_pid = steps[i].metadata.prompt_id
                i += 1
            while (  # and past routing that closed the same original node run
                i < end and isinstance(steps[i], SetNextNode) and steps[i].metadata.prompt_id == last_pid
            ):
                i += 1
            idle_runs = 0 if content else idle_runs + 1
            if idle_runs > 2 * len(agent.nodes) + 2:
                raise ReconstructionError(f"{where}: the team keeps routing without making the tape's steps")
            prompt_id = prompt.id if prompt is not None else new_id()
            adapted = [
                _attributed(s, agent.full_name, node.name, prompt_id, k == len(made) - 1, fresh_id=True)
                for k, s in enumerate(made)
            ]
            new = new.model_copy(update={"steps": new.steps.appended(adapted)})
        meta = new.metadata.model_copy(update={"n_added_steps": len(new)})
        return new.model_copy(update={"metadata": meta}), calls


@dataclass(frozen=True, slots=True)
class _Finished:
    """The tape after finishing an interrupted node run or a fork, whether that ends the turn,
    and what went wrong if it failed."""

    tape: Tape[Any, Any]
    stop: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class _RebuiltRun:
    """A node run as training and replay see it: who ran it, where, what it saw, and the
    prompt and output rebuilt for it."""

    agent: Agent
    node: Node
    where: str  # ``agent.node at step i``, for error messages
    context: Tape[Any, Any]  # what the run saw, then its steps (see Agent.node_run_context)
    at: int  # the run's first step in ``context``
    prefix: Tape[Any, Any]  # ``context[:at]``
    prompt: Prompt
    output: LLMOutput


@dataclass(frozen=True, slots=True)
class _BranchEnd:
    """A fork branch is over: its final tape, and its error if it failed."""

    tape: Tape[Any, Any]
    error: str | None


def _pending_fork(stack: TapeViewStack, start: int) -> int | None:
    """The index of the outermost view at or above ``start`` with a fork still running."""
    for i in range(start, len(stack)):
        if stack.views[i].fork is not None:
            return i
    return None


def _tape_of(tape: Tape[Any, Any], ranges: tuple[tuple[int, int], ...]) -> Tape[Any, Any]:
    """The tape made of the steps in ``ranges`` (context and metadata kept). A single range
    from the start, the case outside forks, shares the step buffer instead of copying."""
    merged: list[tuple[int, int]] = []
    for a, b in ranges:
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        elif b > a:
            merged.append((a, b))
    if not merged:
        return tape.model_copy(update={"steps": StepSequence()})
    if len(merged) == 1 and merged[0][0] == 0:
        return tape.model_copy(update={"steps": tape.steps[: merged[0][1]]})
    items = tape.steps
    return tape.model_copy(update={"steps": StepSequence(items[i] for a, b in merged for i in range(a, b))})


def _check_unique(names: list[str], message: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{message} {name!r}")
        seen.add(name)


def _attributed(
    step: Step, agent: str, node: str, prompt_id: str, run_end: bool, fresh_id: bool = False
) -> Step:
    """A copy of ``step`` with its authorship set (the node's own object is never mutated)."""
    old = step.metadata
    meta = StepMetadata.model_construct(  # all values are already valid: skip re-validation
        id=new_id() if fresh_id else old.id,
        prompt_id=prompt_id,
        node=node,
        agent=agent,
        run_end=run_end,
        other=old.other,
    )
    return step.model_copy(update={"metadata": meta})


def _with_last(items: Iterator[Step | PartialStep], where: str) -> Iterator[tuple[Any, bool]]:
    """Pairs (item, is_last_step): holds each step back until the next one shows up, so the
    last step of a run can be marked. Partial steps pass straight through."""
    pending: Step | None = None
    for item in items:
        if isinstance(item, PartialStep):
            yield item, False
            continue
        if not isinstance(item, Step):
            raise TypeError(f"{where} yielded {type(item).__name__}, not a Step or PartialStep")
        if pending is not None:
            yield pending, False
        pending = item
    if pending is None:
        raise AgentError(f"{where} produced no steps (a node run must add at least one step)")
    yield pending, True


def _reconstructed(node: Node, agent: Agent, tape: Tape[Any, Any], index: int, where: str) -> LLMOutput:
    """``node.make_llm_output`` with failures reported as where they happened."""
    try:
        return node.make_llm_output(agent, tape, index)
    except NotImplementedError:
        raise
    except Exception as e:
        raise ReconstructionError(f"{where}: make_llm_output failed: {type(e).__name__}: {e}") from e


def node_run_steps(tape: Tape[Any, Any], index: int) -> list[Step]:
    """The steps of the node run that starts at ``tape.steps[index]`` (same ``prompt_id``).

    Handy in ``make_llm_output``, which is given the index of a run's first step.
    """
    steps = tape.steps
    pid = steps[index].metadata.prompt_id
    run = []
    for i in range(index, len(steps)):
        if steps[i].metadata.prompt_id != pid:
            break
        run.append(steps[i])
    return run


def _closes_branch(stack: TapeViewStack, branch_len: int) -> bool:
    """Whether a Respond by the active agent closes the fork branch being run (its subagent is
    the one on top)."""
    return branch_len > 0 and len(stack) == branch_len + 1


def _ends_turn(step: Step, by_root: bool, closes_branch: bool = False) -> bool:
    """Whether ``step`` ends the agent's turn: an action, a stop, the root agent's Respond, or
    the Respond that closes the fork branch being run."""
    return isinstance(step, Action | StopStep) or ((by_root or closes_branch) and isinstance(step, Respond))


def _content_diff(expected: list[Step], made: list[Step], labels: tuple[str, str]) -> str | None:
    """A diff of the two sequences' contents (metadata aside), or None if they are the same."""
    a = [{"step": s.llm_dict()} for s in expected]
    b = [{"step": s.llm_dict()} for s in made]
    return None if a == b else diff_text(a, b, labels)


def _check_same(expected: list[Step], made: list[Step], where: str, allow_empty: bool = False) -> None:
    mismatch = _content_diff(expected, made, ("on the tape", "regenerated"))
    if (not made and not allow_empty) or mismatch is not None:
        raise ReconstructionError(
            f"{where}: generate_steps on make_llm_output's output does not give back the tape's "
            "steps\n" + (mismatch or "")
        )
