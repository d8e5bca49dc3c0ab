"""Tapes as data: find the node runs on a tape and rebuild what the LLM must have said.

Training text is the inverse of the node: ``node.make_llm_output`` rebuilds the output of each
LLM-backed node run, and ``node.generate_steps`` on that output must give back the run's steps
(the check). The same rebuild serves :func:`make_training_text`, replay without recorded LLM
calls (``reconstruct_llm_calls``) and :func:`reuse`, which adapts a tape made by another team.
:class:`~tapekit.agent.Agent` exposes these as methods; the functions here take the agent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from tapekit._engine.moves import next_move
from tapekit._engine.runs import attributed, content_diff, node_run_steps, tape_of
from tapekit.core import Fork, LLMOutput, Prompt, SetNextNode, Step, StepSequence, Tape, TapeMetadata, new_id
from tapekit.errors import ReconstructionError
from tapekit.llm.base import LLMCall, LLMStream, TrainingText
from tapekit.views import TapeViewStack

if TYPE_CHECKING:
    from tapekit.agent import Agent, Node


class NodeRun(NamedTuple):
    """A node run found on a tape: the node and the index of the run's first step."""

    node: Node
    index: int  # type: ignore[assignment]  # the field shadows tuple.index, on purpose


@dataclass(frozen=True, slots=True)
class RebuiltRun:
    """A node run as training and replay see it: who ran it, where, what it saw, and the
    prompt and output rebuilt for it."""

    agent: Agent
    node: Node
    where: str  # ``agent.node at step i``, for error messages
    context: Tape[Any, Any]  # what the run saw, then its steps (see node_run_context)
    at: int  # the run's first step in ``context``
    prefix: Tape[Any, Any]  # ``context[:at]``
    prompt: Prompt
    output: LLMOutput


def get_node_runs(agent: Agent, tape: Tape[Any, Any]) -> list[NodeRun]:
    """Every node run of ``agent``'s team on ``tape``: (node, index of the run's first step)."""
    root = agent.root
    runs: list[NodeRun] = []
    last_pid = None
    for i, step in enumerate(tape.steps):
        meta = step.metadata
        if meta.prompt_id and meta.agent and meta.prompt_id != last_pid:
            runs.append(NodeRun(root.find_agent(meta.agent).find_node(meta.node), i))
        last_pid = meta.prompt_id or None
    return runs


def visible_prefix(agent: Agent, tape: Tape[Any, Any], index: int) -> Tape[Any, Any]:
    """The tape that the node run starting at ``tape.steps[index]`` saw: the steps before
    it, minus the steps of the other branches of any :class:`Fork` it runs inside."""
    stack = TapeViewStack.compute(tape.steps[:index], agent.root.name)
    return tape_of(tape, stack.top.visible(index))


def node_run_context(agent: Agent, tape: Tape[Any, Any], index: int) -> tuple[Tape[Any, Any], int]:
    """``(tape, index)`` as the node run at ``index`` knew them: its :func:`visible_prefix`
    followed by the run's steps, and the run's index there (outside forks, the pair itself)."""
    prefix = visible_prefix(agent, tape, index)
    if len(prefix) == index:
        return tape, index
    run = node_run_steps(tape, index)
    return prefix.model_copy(update={"steps": prefix.steps.appended(run)}), len(prefix)


def rebuilt_runs(agent: Agent, tape: Tape[Any, Any]) -> Iterator[RebuiltRun]:
    """Every LLM-backed node run on ``tape`` with its prompt remade from what the run saw
    and its output rebuilt by ``make_llm_output`` (what training text and replay need)."""
    root = agent.root
    for node, index in get_node_runs(root, tape):
        member = root.find_agent(tape.steps[index].metadata.agent)
        context, at = node_run_context(root, tape, index)
        prefix = context[:at]
        prompt = node.make_prompt(member, prefix)
        if prompt is None:
            continue
        where = f"{member.full_name}.{node.name} at step {index}"
        output = _reconstructed(node, member, context, at, where)
        yield RebuiltRun(member, node, where, context, at, prefix, prompt, output)


def make_training_text(agent: Agent, tape: Tape[Any, Any]) -> list[TrainingText]:
    """Training text for every LLM-backed node run on ``tape`` (see
    :meth:`tapekit.agent.Agent.make_training_text`)."""
    texts: list[TrainingText] = []
    for run in rebuilt_runs(agent, tape):
        member, node = run.agent, run.node
        steps = node_run_steps(run.context, run.at)
        stream = LLMStream.from_output(run.output, run.prompt)
        made = [s for s in node.generate_steps(member, run.prefix, stream) if isinstance(s, Step)]
        _check_same(steps, made, run.where)
        text = member.llm_for(node).make_training_text(run.prompt, run.output)
        update = {"prompt_id": steps[0].metadata.prompt_id, "agent": member.full_name, "node": node.name}
        texts.append(text.model_copy(update=update))
    return texts


def reuse(agent: Agent, tape: Tape[Any, Any]) -> tuple[Tape[Any, Any], list[LLMCall]]:
    """Adapt a tape made by another team to ``agent``'s team (see
    :meth:`tapekit.agent.Agent.reuse`)."""
    root = agent.root
    if any(isinstance(s, Fork) for s in tape.steps):
        raise ReconstructionError(
            "reuse does not adapt tapes with forks yet: their branches would have to be "
            "re-attributed branch by branch; use make_training_text on the original team"
        )
    meta = TapeMetadata(parent_id=tape.metadata.parent_id, author=root.name, author_tape_id=tape.metadata.id)
    new = tape.model_copy(update={"steps": StepSequence(), "metadata": meta})
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
        move = next_move(new, root.name)
        member, node = move.runner(root)
        where = f"{member.full_name}.{node.name} at step {i}"
        prompt = node.make_prompt(member, new)
        stream = LLMStream()
        if prompt is not None:
            output = _reconstructed(node, member, tape, i, where)
            stream = LLMStream.from_output(output, prompt)
            calls.append(LLMCall(prompt=prompt, output=output, model=member.llm_for(node).model_name))
        made = [s for s in node.generate_steps(member, new, stream) if isinstance(s, Step)]
        if not made:
            raise ReconstructionError(f"{where}: the node produced no steps")
        content = [s for s in made if not isinstance(s, SetNextNode)]
        _check_same(originals[: len(content)], content, where, allow_empty=True)
        i = _past_matched(steps, i, end, len(content))
        idle_runs = 0 if content else idle_runs + 1
        if idle_runs > 2 * len(member.nodes) + 2:
            raise ReconstructionError(f"{where}: the team keeps routing without making the tape's steps")
        prompt_id = prompt.id if prompt is not None else new_id()
        adapted = [
            attributed(s, member.full_name, node.name, prompt_id, k == len(made) - 1, fresh_id=True)
            for k, s in enumerate(made)
        ]
        new = new.model_copy(update={"steps": new.steps.appended(adapted)})
    done = new.metadata.model_copy(update={"n_added_steps": len(new)})
    return new.model_copy(update={"metadata": done}), calls


def _past_matched(steps: StepSequence, i: int, end: int, matched: int) -> int:
    """The index after the ``matched`` content steps from ``i`` and the original's routing
    that closed the same node run."""
    count, last_pid = 0, None
    while count < matched:
        if not isinstance(steps[i], SetNextNode):
            count += 1
            last_pid = steps[i].metadata.prompt_id
        i += 1
    while i < end and isinstance(steps[i], SetNextNode) and steps[i].metadata.prompt_id == last_pid:
        i += 1
    return i


def _reconstructed(node: Node, agent: Agent, tape: Tape[Any, Any], index: int, where: str) -> LLMOutput:
    """``node.make_llm_output`` with failures reported as where they happened."""
    try:
        return node.make_llm_output(agent, tape, index)
    except NotImplementedError:
        raise
    except Exception as e:
        raise ReconstructionError(f"{where}: make_llm_output failed: {type(e).__name__}: {e}") from e


def _check_same(expected: list[Step], made: list[Step], where: str, allow_empty: bool = False) -> None:
    mismatch = content_diff(expected, made, ("on the tape", "regenerated"))
    if (not made and not allow_empty) or mismatch is not None:
        raise ReconstructionError(
            f"{where}: generate_steps on make_llm_output's output does not give back the tape's "
            "steps\n" + (mismatch or "")
        )
