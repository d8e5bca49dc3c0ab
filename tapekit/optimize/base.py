"""The optimiser interface, and what optimisers read from tapes: node runs and demos.

An optimiser is a pydantic model with a ``name`` and a :meth:`Optimizer.search` method that
tries configurations through a :class:`~tapekit.optimize._run.Search` (which runs them within
the budget and keeps the candidates) and returns when it is done or the budget is spent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from tapekit.agent import Agent, Node
from tapekit.core import Tape
from tapekit.evaluate import EvalReport, SampleResult
from tapekit.optimize._run import Search


class Optimizer(BaseModel):
    """Base class of the optimisers: ``search`` tries candidates through the search state."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = ""

    def model_post_init(self, context: Any, /) -> None:
        """Default the name to the class name in snake case."""
        if not self.name:
            self.name = "".join("_" + c.lower() if c.isupper() else c for c in type(self).__name__).lstrip(
                "_"
            )

    def search(self, search: Search) -> None:
        """Try candidates with ``search.validate(...)`` until done or out of budget."""
        raise NotImplementedError(f"optimiser {type(self).__name__} has no search()")


@dataclass(frozen=True)
class RunView:
    """One run of a target node on a tape: the agent that ran it, the node, and where."""

    target: str
    agent: Agent
    node: Node
    tape: Tape[Any, Any]
    index: int


def node_runs(agent: Agent, tape: Tape[Any, Any], targets: list[str]) -> Iterator[RunView]:
    """The runs of the ``targets`` nodes on ``tape`` (made by ``agent``'s team)."""
    for node, index in agent.get_node_runs(tape):
        author = tape.steps[index].metadata.agent
        target = f"{author}.{node.name}"
        if target in targets:
            yield RunView(target, agent.root.find_agent(author), node, tape, index)


_Run = tuple[str, Node, Agent, int]
"""A run to make a demo from: the target, the node whose ``extract_demo`` reads it, the agent
that ran it, and the run's first step."""


def _demo_pool(
    report: EvalReport, targets: list[str], runs: Callable[[Tape[Any, Any]], Iterator[_Run]]
) -> dict[str, list[Any]]:
    """Demos from ``runs`` of each passed tape of ``report``, by target; runs whose node has no
    ``extract_demo`` or that raise while being read back, and repeated demos, are skipped."""
    pool: dict[str, list[Any]] = {t: [] for t in targets}
    seen: set[str] = set()
    primary = report.scorers[0]
    for sample in report.samples:
        if not sample.scores[primary].passed or sample.error:
            continue
        tape = report.tapes[sample.tape_id]
        for target, node, member, index in runs(tape):
            extract = getattr(node, "extract_demo", None)
            if extract is None:
                continue
            try:
                demo = extract(member, tape, index)
            except Exception:
                continue
            key = f"{target}|{demo.model_dump_json() if isinstance(demo, BaseModel) else demo!r}"
            if key not in seen:
                seen.add(key)
                pool[target].append(demo)
    return pool


def demos_from_report(agent: Agent, report: EvalReport, targets: list[str]) -> dict[str, list[Any]]:
    """Demos from the node runs of the passed tapes of ``report`` (the paper's Listing 1),
    by target; nodes without ``extract_demo`` give none. Runs on failed tapes, runs that
    raise while being read back, and repeated demos are skipped."""

    def runs(tape: Tape[Any, Any]) -> Iterator[_Run]:
        for run in node_runs(agent, tape, targets):
            yield run.target, run.node, run.agent, run.index

    return _demo_pool(report, targets, runs)


def demos_from_teacher(
    agent: Agent, teacher: Agent, report: EvalReport, targets: list[str]
) -> dict[str, list[Any]]:
    """Demos for ``agent``'s ``targets`` from the passed tapes of ``teacher`` (DSPy's teacher
    bootstrapping): each run of a teacher node feeds the targets whose node has the same name,
    or every target when the teacher has one node. The target node's ``extract_demo`` reads
    the teacher's run, so it must understand the teacher's steps (e.g. the web agent reads
    the programmatic web teacher's). Runs it cannot read are skipped."""
    from tapekit.optimize._targets import optimisable_nodes

    nodes = optimisable_nodes(agent)
    single = len(teacher.nodes) == 1 and not teacher.subagents

    def runs(tape: Tape[Any, Any]) -> Iterator[_Run]:
        for node, index in teacher.get_node_runs(tape):
            author = tape.steps[index].metadata.agent
            try:  # the agent that ran it is the teacher's member, as for the student's own runs
                member = teacher.root.find_agent(author) if author else teacher
            except Exception:
                continue
            for target in targets:
                if single or node.name == nodes[target].name:
                    yield target, nodes[target], member, index

    return _demo_pool(report, targets, runs)


def _steps_text(tape: Tape[Any, Any], start: int, limit: int) -> str:
    lines = []
    for step in tape.steps[start:]:
        if step.metadata.prompt_id != tape.steps[start].metadata.prompt_id:
            break
        body = {k: v for k, v in step.llm_dict().items() if k != "kind"}
        lines.append(f"{step.kind}: {_short(str(body), limit)}")
    return "\n".join(lines)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_run(run: RunView, limit: int = 1200) -> str:
    """What a target node saw (its prompt's last user message) and what it made, as text for
    a proposal or reflection prompt."""
    context, at = run.agent.node_run_context(run.tape, run.index)
    try:
        prompt = run.node.make_prompt(run.agent, context[:at])
    except Exception as e:  # the run's input can no longer be rebuilt: say so, do not fail
        seen = f"(input not available: {e})"
    else:
        users = [m for m in (prompt.messages if prompt else []) if m.get("role") == "user"]
        seen = _short(str(users[-1]["content"]), limit) if users else "(no prompt)"
    return f"Input:\n{seen}\nOutput:\n{_steps_text(context, at, limit)}"


def feedback_of(sample: SampleResult, scorer: str) -> str:
    """The scorer's text feedback on an attempt (or its score when it gave none)."""
    score = sample.scores[scorer]
    return score.feedback or f"score {score.value:.2f} ({'passed' if score.passed else 'failed'})"
