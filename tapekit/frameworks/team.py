"""AutoGen-style teams on one tape: an initiator, a manager that picks speakers, and workers.

The manager is a subagent (or the root) whose subagents are the workers. Each manager turn is
one node run: when a termination condition holds it ends the conversation (a
:class:`TeamTerminated` thought, then a :class:`~tapekit.core.Respond` to its caller, or an
:class:`~tapekit.dialog.AssistantStep` when the manager is the root); otherwise it
:class:`~tapekit.core.Call` s the next speaker, chosen by an LLM, in round robin, or by a
function. A worker reads the conversation from its caller's view on the view stack (the
manager's view holds every message: the request and the workers' responses) and answers with a
``Respond``. Everything is derived from the tape, so a team resumes from any step.

Termination conditions (:class:`MaxTurns`, :class:`TextMention`, :class:`FunctionTermination`)
combine with ``|`` (either) and ``&`` (both); they look at the messages since the last message
from outside the team (the user's, or the initiator's request).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializeAsAny, field_validator

from tapekit.agent import Agent, Node, node_run_steps
from tapekit.core import Call, LLMOutput, Prompt, Respond, SetNextNode, Step, Tape, Thought
from tapekit.dialog import AssistantStep, UserStep
from tapekit.errors import AgentError
from tapekit.llm.base import LLM, LLMStream


class TeamMessage(BaseModel):
    """One message of a team conversation: who said it, what, and whether a team member
    (rather than the user or the initiator) said it."""

    speaker: str
    content: str
    from_member: bool = True


class TeamTerminated(Thought):
    """The manager ended the conversation: ``reason`` says which condition held."""

    kind: Literal["team_terminated"] = "team_terminated"
    reason: str


# ----------------------------------------------------------------------------- the conversation


def _short(full_name: str) -> str:
    return full_name.rsplit("/", 1)[-1]


def conversation_of(steps: Any, manager: str) -> list[TeamMessage]:
    """The messages in the manager's view ``steps`` (``manager``: its full name)."""
    messages: list[TeamMessage] = []
    for step in steps:
        author = step.metadata.agent
        if isinstance(step, UserStep):
            messages.append(TeamMessage(speaker="user", content=step.content, from_member=False))
        elif isinstance(step, Call) and author != manager:
            messages.append(
                TeamMessage(speaker=_short(author) or "user", content=step.content, from_member=False)
            )
        elif isinstance(step, Respond | AssistantStep) and (author == manager) == (step.kind == "assistant"):
            messages.append(TeamMessage(speaker=_short(author), content=step.content))
    return messages


def conversation(agent: Agent, tape: Tape[Any, Any]) -> list[TeamMessage]:
    """The team conversation as ``agent`` sees it: its own if it is a manager, else its
    caller's (the manager that called it)."""
    stack = agent.compute_view(tape)
    if any(isinstance(n, ManagerNode) for n in agent.nodes):
        return conversation_of(stack.top.steps, agent.full_name)
    if len(stack) < 2:
        raise AgentError(f"team member {agent.full_name!r} must be called by a manager")
    caller = stack.views[-2]
    return conversation_of(caller.steps, caller.agent_name)


def _current(messages: list[TeamMessage]) -> list[TeamMessage]:
    """The messages since (and including) the last one from outside the team."""
    start = max((i for i, m in enumerate(messages) if not m.from_member), default=0)
    return messages[start:]


# ----------------------------------------------------------------------------- termination


_TERMINATIONS: dict[str, type[Termination]] = {}


class Termination(BaseModel):
    """When a conversation ends. ``a | b`` ends when either holds, ``a & b`` when both do.

    A config stores a condition with its ``type`` (the class name unless set), which loads it
    back; subclass this for your own conditions.
    """

    type: str = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Register the subclass by its type name, so that configs can load it."""
        super().__pydantic_init_subclass__(**kwargs)
        _TERMINATIONS[cls.__name__] = cls

    def model_post_init(self, context: Any, /) -> None:
        """Default ``type`` to the class name."""
        if not self.type:
            self.type = type(self).__name__

    def check(self, messages: list[TeamMessage]) -> str | None:
        """Why the conversation ends after ``messages`` (the current exchange), or None."""
        raise NotImplementedError

    def __or__(self, other: Termination) -> AnyOf:
        return AnyOf(conditions=[self, other])

    def __and__(self, other: Termination) -> AllOf:
        return AllOf(conditions=[self, other])


class MaxTurns(Termination):
    """Ends after ``turns`` member messages."""

    turns: int = Field(gt=0)

    def check(self, messages: list[TeamMessage]) -> str | None:
        """The reason once the members have spoken ``turns`` times."""
        n = sum(m.from_member for m in messages)
        return f"{n} turns (max {self.turns})" if n >= self.turns else None


class TextMention(Termination):
    """Ends when a member's last message contains ``text``."""

    text: str

    def check(self, messages: list[TeamMessage]) -> str | None:
        """The reason when the last member message mentions the text."""
        last = messages[-1] if messages else None
        if last is not None and last.from_member and self.text in last.content:
            return f"{last.speaker} said {self.text!r}"
        return None


class FunctionTermination(Termination):
    """Ends when ``fn(messages)`` is true (the function is not saved with the config)."""

    fn: Callable[[list[TeamMessage]], bool] | None = Field(default=None, exclude=True)
    name: str = "function"

    def check(self, messages: list[TeamMessage]) -> str | None:
        """The reason when the function says so."""
        if self.fn is None:
            raise AgentError(
                f"termination {self.name!r} has no function: functions are not saved with a config, "
                "set .fn after loading it"
            )
        return f"{self.name} returned true" if self.fn(messages) else None


class AnyOf(Termination):
    """Ends when any of ``conditions`` holds."""

    conditions: list[SerializeAsAny[Termination]]

    @field_validator("conditions", mode="before")
    @classmethod
    def _load(cls, value: Any) -> Any:
        return [load_termination(v) for v in value] if isinstance(value, list) else value

    def check(self, messages: list[TeamMessage]) -> str | None:
        """The first condition's reason that holds."""
        return next((r for c in self.conditions if (r := c.check(messages)) is not None), None)


class AllOf(Termination):
    """Ends when all of ``conditions`` hold."""

    conditions: list[SerializeAsAny[Termination]]

    @field_validator("conditions", mode="before")
    @classmethod
    def _load(cls, value: Any) -> Any:
        return [load_termination(v) for v in value] if isinstance(value, list) else value

    def check(self, messages: list[TeamMessage]) -> str | None:
        """Every reason, joined, when all conditions hold."""
        reasons = [c.check(messages) for c in self.conditions]
        return " and ".join(r for r in reasons if r) if all(r is not None for r in reasons) else None


def load_termination(value: Any) -> Any:
    """A condition from its config (a dict with ``type``); anything else is returned as is."""
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    if kind not in _TERMINATIONS:
        raise ValueError(f"unknown termination type {kind!r} (known: {', '.join(sorted(_TERMINATIONS))})")
    return _TERMINATIONS[kind].model_validate(value)


# ----------------------------------------------------------------------------- nodes


class ManagerNode(Node):
    """Ends the conversation or calls the next speaker (see :mod:`tapekit.frameworks.team`).

    ``selection``: ``"round_robin"`` (the worker after the last speaker), ``"llm"`` (the
    node's LLM names the next speaker), or ``"function"`` (``select_fn(messages, names)``,
    not saved with the config).
    """

    name: str = "manage"
    selection: Literal["round_robin", "llm", "function"] = "round_robin"
    select_fn: Callable[[list[TeamMessage], list[str]], str] | None = Field(default=None, exclude=True)
    termination: SerializeAsAny[Termination] | None = None

    @field_validator("termination", mode="before")
    @classmethod
    def _load(cls, value: Any) -> Any:
        return load_termination(value)

    system: str = "You manage a team. Read the conversation and choose who speaks next."

    def _ended(self, messages: list[TeamMessage]) -> str | None:
        if self.termination is None:
            return None
        return self.termination.check(_current(messages))

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt | None:
        """With LLM selection and no termination: the members, the conversation, the question."""
        messages = conversation(agent, tape)
        if self.selection != "llm" or self._ended(messages) is not None:
            return None
        names = [w.name for w in agent.subagents]
        roster = "\n".join(f"- {w.name}: {_describe(w)}" for w in agent.subagents)
        chat: list[dict[str, Any]] = [{"role": "system", "content": f"{self.system}\n\nThe team:\n{roster}"}]
        chat += [{"role": "user", "content": f"{m.speaker}: {m.content}"} for m in messages]
        ask = f"Who speaks next? Answer with one name only: {', '.join(names)}."
        return Prompt(messages=[*chat, {"role": "user", "content": ask}])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """A termination (thought, then Respond or AssistantStep), or SetNextNode + Call."""
        messages = conversation(agent, tape)
        reason = self._ended(messages)
        if reason is not None:
            last = next((m.content for m in reversed(messages) if m.from_member), "")
            yield TeamTerminated(reason=reason)
            if len(agent.compute_view(tape)) > 1:
                yield Respond(content=last)
            else:
                yield SetNextNode(next_node=self.name)
                yield AssistantStep(content=last)
            return
        yield SetNextNode(next_node=self.name)
        yield Call(agent_name=self._choose(agent, messages, llm_stream))

    def _choose(self, agent: Agent, messages: list[TeamMessage], llm_stream: LLMStream) -> str:
        names = [w.name for w in agent.subagents]
        if not names:
            raise AgentError(f"team manager {agent.full_name!r} has no workers")
        if self.selection == "llm":
            return _named(llm_stream.get_text(), names, agent.full_name)
        if self.selection == "function":
            if self.select_fn is None:
                raise AgentError(f"team manager {agent.full_name!r} selects by function but has no select_fn")
            return _named(self.select_fn(_current(messages), names), names, agent.full_name)
        last = next((m.speaker for m in reversed(messages) if m.from_member and m.speaker in names), None)
        return names[(names.index(last) + 1) % len(names)] if last is not None else names[0]

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The name of the member this run called."""
        call = node_run_steps(tape, index)[-1]
        if not isinstance(call, Call):
            raise AgentError(f"the run of {agent.full_name}.{self.name} at step {index} called no one")
        return LLMOutput(content=call.agent_name)


def _named(text: str, names: list[str], manager: str) -> str:
    """The member named in ``text``: an exact name, else the first one mentioned."""
    clean = text.strip().strip("\"'.").strip()
    if clean in names:
        return clean
    found = sorted((text.find(n), n) for n in names if n in text)
    if not found:
        raise AgentError(f"team manager {manager!r} got {text!r}, which names none of its members {names}")
    return found[0][1]


def _describe(agent: Agent) -> str:
    if isinstance(agent, TeamAgent) and agent.description:
        return agent.description
    for node in agent.nodes:
        if isinstance(node, WorkerNode) and node.system:
            return node.system.strip().splitlines()[0]
    return "a team member"


class WorkerNode(Node):
    """Answers the conversation with its own system prompt, then hands back to the manager."""

    name: str = "respond"
    system: str = ""

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        """The system prompt, then the conversation: this member's messages as the assistant's."""
        chat: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
        for m in conversation(agent, tape):
            if m.from_member and m.speaker == agent.name:
                chat.append({"role": "assistant", "content": m.content})
            else:
                chat.append({"role": "user", "content": f"{m.speaker}: {m.content}"})
        if not chat or chat[-1]["role"] != "user":
            chat.append({"role": "user", "content": f"{agent.name}, it is your turn."})
        return Prompt(messages=chat)

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The LLM's answer as a Respond to the manager."""
        yield Respond(content=llm_stream.get_text())

    def make_llm_output(self, agent: Agent, tape: Tape[Any, Any], index: int) -> LLMOutput:
        """The text of the run's Respond."""
        step = node_run_steps(tape, index)[-1]
        return LLMOutput(content=getattr(step, "content", ""))


class InitiatorNode(Node):
    """Starts the conversation: Calls ``teammate`` with ``message`` (by default the user's last
    message); when the teammate responds, gives the result to the user as an AssistantStep."""

    name: str = "initiate"
    teammate: str
    message: str = ""

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """SetNextNode to itself, then the Call or the answer."""
        steps = agent.compute_view(tape).top.steps
        last = steps[-1] if len(steps) else None
        yield SetNextNode(next_node=self.name)
        if isinstance(last, Respond):
            yield AssistantStep(content=last.content)
            return
        message = self.message or next((s.content for s in reversed(steps) if isinstance(s, UserStep)), "")
        if not message:
            raise AgentError(f"initiator {agent.full_name!r} has no message and the tape has no user message")
        yield Call(agent_name=self.teammate, content=message)


# ----------------------------------------------------------------------------- the team agent


class TeamAgent(Agent):
    """A member of an AutoGen-style team; build members with :meth:`create_worker`,
    :meth:`create_manager` and :meth:`create_initiator`. ``description`` tells an LLM manager
    what the member does."""

    description: str = ""

    @classmethod
    def create_worker(
        cls,
        name: str,
        llm: LLM | None = None,
        system: str = "",
        description: str = "",
        nodes: list[Node] | None = None,
    ) -> TeamAgent:
        """A worker answering with ``llm`` under its ``system`` prompt, or running its own
        ``nodes`` (which must end with a Respond; see :func:`conversation`)."""
        if nodes is None and llm is None:
            raise ValueError(f"worker {name!r} needs an llm (or its own nodes)")
        return cls.create(name, llms=llm, nodes=nodes or [WorkerNode(system=system)], description=description)

    @classmethod
    def create_manager(
        cls,
        name: str,
        workers: Sequence[Agent],
        selection: Literal["round_robin", "llm"]
        | Callable[[list[TeamMessage], list[str]], str] = "round_robin",
        termination: Termination | None = None,
        llm: LLM | None = None,
        system: str = "",
    ) -> TeamAgent:
        """A manager of ``workers``: ``selection`` is ``"round_robin"``, ``"llm"`` (needs
        ``llm``) or a function ``(messages, names) -> name``; ``termination`` ends the talk."""
        if selection == "llm" and llm is None:
            raise ValueError(f"manager {name!r} selects speakers with an LLM: pass llm=")
        options: dict[str, Any] = {"termination": termination}
        if callable(selection):
            options.update(selection="function", select_fn=selection)
        else:
            options["selection"] = selection
        if system:
            options["system"] = system
        return cls.create(name, llms=llm, nodes=[ManagerNode(**options)], subagents=list(workers))

    @classmethod
    def create_initiator(cls, name: str, manager: Agent, message: str = "") -> TeamAgent:
        """The root that Calls ``manager`` with ``message`` (or the user's last message)."""
        return cls.create(
            name, nodes=[InitiatorNode(teammate=manager.name, message=message)], subagents=[manager]
        )
