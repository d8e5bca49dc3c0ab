"""Nodes and agents: the pure, configurable part of an agentic system.

A :class:`Node` turns a tape into a prompt and an LLM output into steps. An :class:`Agent` is a
pydantic model of LLMs, templates, nodes and subagents; ``agent.arun(tape)`` picks the active
(sub)agent from the tape view stack, lets it pick its node, calls the LLM, appends the node's
steps, and repeats until a node run produces an action. The agent never looks at anything but
the tape, so any tape is a resume point.

This module says what an agent *is* (nodes, LLMs, subagents, lookups); the turn itself, forks
and the loop run in the engine (:mod:`tapekit._engine`), and training text, replay support and
``reuse`` (tapes as data) in :mod:`tapekit.reconstruction`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SerializeAsAny

from tapekit import reconstruction
from tapekit._engine.loop import turn
from tapekit._engine.runs import node_run_steps as node_run_steps
from tapekit.core import LLMOutput, PartialStep, Prompt, Step, Tape
from tapekit.errors import AgentError
from tapekit.errors import ReconstructionError as ReconstructionError
from tapekit.events import AgentEvent as AgentEvent
from tapekit.events import AgentStream, AsyncAgentStream
from tapekit.llm.base import LLM, LLMCall, LLMStream, TrainingText
from tapekit.reconstruction import NodeRun
from tapekit.views import TapeView, TapeViewStack

if TYPE_CHECKING:
    from tapekit.environment import Environment


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
        return _manager_of(self)

    @property
    def root(self) -> Agent:
        """The top agent of this agent's team."""
        agent = self
        while (manager := _manager_of(agent)) is not None:
            agent = manager
        return agent

    @property
    def full_name(self) -> str:
        """The hierarchical name, e.g. ``analyst/search_agent``; steps record it."""
        manager = _manager_of(self)
        if manager is None:
            return self.name
        return f"{manager.full_name}/{self.name}"

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
        return AsyncAgentStream(turn(self, tape, environment), tape)

    def run(self, tape: Tape[Any, Any], environment: Environment | None = None) -> AgentStream:
        """Sync version of :meth:`arun`."""
        return AgentStream(turn(self, tape, environment), tape)

    # ------------------------------------------------------------------ tapes as data (see reconstruction)

    def get_node_runs(self, tape: Tape[Any, Any]) -> list[NodeRun]:
        """Every node run of this team on ``tape``: (node, index of the run's first step)."""
        return reconstruction.get_node_runs(self, tape)

    def visible_prefix(self, tape: Tape[Any, Any], index: int) -> Tape[Any, Any]:
        """The tape that the node run starting at ``tape.steps[index]`` saw: the steps before
        it, minus the steps of the other branches of any :class:`Fork` it runs inside."""
        return reconstruction.visible_prefix(self, tape, index)

    def node_run_context(self, tape: Tape[Any, Any], index: int) -> tuple[Tape[Any, Any], int]:
        """``(tape, index)`` as the node run at ``index`` knew them: its :meth:`visible_prefix`
        followed by the run's steps, and the run's index there. Outside forks, that is
        ``(tape, index)`` itself. Rebuild prompts and LLM outputs from this pair."""
        return reconstruction.node_run_context(self, tape, index)

    def make_training_text(self, tape: Tape[Any, Any]) -> list[TrainingText]:
        """Training text for every LLM-backed node run on ``tape``.

        Each run's LLM output is rebuilt with ``node.make_llm_output`` and checked by running
        ``generate_steps`` on it: it must give back exactly the run's steps, otherwise a
        :class:`ReconstructionError` shows the difference.
        """
        return reconstruction.make_training_text(self, tape)

    def reuse(self, tape: Tape[Any, Any]) -> tuple[Tape[Any, Any], list[LLMCall]]:
        """Adapt a tape made by another agent: the same steps, attributed to this team's agents
        and nodes as if this team had made them, plus the LLM calls it would have made.

        Steps made by no agent (``metadata.agent`` empty: user messages, observations) are kept
        as they are. For the others, this team's next node is chosen as usual and its
        ``make_llm_output`` must reproduce them. ``SetNextNode`` steps are each agent's own
        routing, so the original's are dropped and this team's own take their place. A
        :class:`ReconstructionError` says where the tape cannot be reproduced.
        """
        return reconstruction.reuse(self, tape)


def _manager_of(agent: Agent) -> Agent | None:
    """``agent._manager``, read from pydantic's private-attribute dict directly: the attribute
    path goes through ``BaseModel.__getattr__`` and costs ~4 µs, paid several times per step."""
    private = agent.__pydantic_private__
    return private.get("_manager") if private else None


def _check_unique(names: list[str], message: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{message} {name!r}")
        seen.add(name)
