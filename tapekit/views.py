"""Tape views: what each agent of a team can see, and which node it runs next.

The tape view stack works like a call stack: a :class:`~tapekit.core.Call` pushes a view for the
called subagent, a :class:`~tapekit.core.Respond` pops it and shows the response to the caller.
The stack is a pure fold over the steps, one step in and O(depth) work out, memoised per tape
prefix on the tape's shared step buffer. A running session therefore never re-scans its past:
each node run folds only the steps added since the previous one.

The stack of a tape read from a store is computed without reading most of its steps
(:func:`_leap`): the store finds the steps that call, respond or fork by their kind, unread, and
only those and each frame's last node run are read. Resuming a long stored session thus costs
what its last turns cost, not a pass over all its steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tapekit.core import Call, Fork, Respond, SetNextNode, Step, StepSequence, Tape, step_kinds

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class TapeView:
    """One agent's frame: the steps it can see and where its node pointer stands.

    ``steps`` holds the steps since the agent was called (the :class:`Call` first), without the
    inner steps of the subagents it called, but with their responses. ``last_node`` and
    ``last_prompt_id`` name the agent's most recent node run; ``next_node`` is the target of a
    :class:`SetNextNode` made during that run, if any. ``run_open`` is true while the last node
    run has not yet produced its final step (a tape cut in the middle of a node run).
    """

    agent_name: str
    steps: StepSequence[Step] = field(default_factory=StepSequence)
    last_node: str | None = None
    last_prompt_id: str | None = None
    next_node: str | int | None = None
    run_open: bool = False
    run_start: int = -1  # tape index of the first step of the last node run
    fork: Fork | None = None
    fork_index: int = -1  # tape index of the pending fork step
    fork_done: int = 0
    vis_base: tuple[tuple[int, int], ...] = ()
    vis_start: int = 0
    branch: bool = False  # this view is a branch of its caller's fork

    @property
    def fork_visible(self) -> tuple[tuple[int, int], ...]:
        """The tape ranges every branch of the pending fork sees before its own steps."""
        return (*self.vis_base, (self.vis_start, self.fork_index + 1))

    def visible(self, end: int) -> tuple[tuple[int, int], ...]:
        """The ``(start, stop)`` tape ranges this agent's nodes see when the tape has ``end``
        steps."""
        return (*self.vis_base, (self.vis_start, end))

    @property
    def call(self) -> Call | None:
        """The :class:`Call` that started this view (None for the root agent's view)."""
        first = self.steps[0] if len(self.steps) else None
        return first if isinstance(first, Call) else None

    def _add(self, step: Step, index: int) -> TapeView:
        meta = step.metadata
        steps = self.steps.appended([step])
        if meta.agent == self.agent_name and meta.prompt_id:
            changes: dict[str, Any] = {"steps": steps, "run_open": not meta.run_end}
            if meta.prompt_id != self.last_prompt_id:
                changes.update(
                    last_node=meta.node, last_prompt_id=meta.prompt_id, next_node=None, run_start=index
                )
            if isinstance(step, SetNextNode):
                changes["next_node"] = step.next_node
            elif isinstance(step, Fork):
                changes.update(fork=step, fork_index=index, fork_done=0)
            return _evolve(self, changes)
        return _evolve(self, {"steps": steps})


_VIEW_FIELDS = TapeView.__slots__
_set = object.__setattr__


def _evolve(view: TapeView, changes: dict[str, Any]) -> TapeView:
    """``dataclasses.replace(view, **changes)`` at a third of its cost (it runs for every step)."""
    new = object.__new__(TapeView)
    for name in _VIEW_FIELDS:
        _set(new, name, changes[name] if name in changes else getattr(view, name))
    return new


@dataclass(frozen=True, slots=True)
class TapeViewStack:
    """The views of every agent that has been called and has not responded, root first."""

    views: tuple[TapeView, ...]

    @property
    def top(self) -> TapeView:
        """The view of the active agent (the one called last that has not responded)."""
        return self.views[-1]

    @property
    def bottom(self) -> TapeView:
        """The root agent's view."""
        return self.views[0]

    def __len__(self) -> int:
        return len(self.views)

    @classmethod
    def initial(cls, root_name: str) -> TapeViewStack:
        """The stack before any step: just the root agent's empty view."""
        return cls((TapeView(agent_name=root_name),))

    def push(self, step: Step, index: int = -1) -> TapeViewStack:
        """The stack after ``step`` (at tape position ``index``): the fold's one-step function."""
        views = self.views
        top = views[-1]
        if isinstance(step, Call):
            caller = top._add(step, index)
            if top.fork is not None and step.metadata.agent == top.agent_name:  # a fork branch
                vis_base, vis_start, branch = top.fork_visible, index, True
            else:
                vis_base, vis_start, branch = top.vis_base, top.vis_start, False
            callee = TapeView(
                agent_name=f"{top.agent_name}/{step.agent_name}",
                steps=StepSequence([step]),
                vis_base=vis_base,
                vis_start=vis_start,
                branch=branch,
            )
            return TapeViewStack((*views[:-1], caller, callee))
        if isinstance(step, Respond) and len(views) > 1:
            caller = views[-2]._add(step, index)
            if top.branch and caller.fork is not None:
                done = caller.fork_done + 1
                fork = None if done >= len(caller.fork.branches) else caller.fork
                caller = _evolve(caller, {"fork_done": done, "fork": fork})
            return TapeViewStack((*views[:-2], caller))
        return TapeViewStack((*views[:-1], top._add(step, index)))

    @classmethod
    def compute(cls, tape: Tape[Any, Any] | StepSequence[Step], root_name: str) -> TapeViewStack:
        """The view stack after all of ``tape``'s steps, for a team whose root is ``root_name``.

        Memoised: computing it for a tape that extends one computed before costs only the new
        steps; for a tape read from a store, the stored steps cost only those that call,
        respond or fork and the last node run of each frame (see :func:`_leap`).
        """
        steps = tape.steps if isinstance(tape, Tape) else tape
        return steps.fold(
            ("tapekit.views.TapeViewStack", root_name),
            lambda: cls.initial(root_name),
            lambda stack, step, index: stack.push(step, index),
            _leap,
        )


# --------------------------------------------------------------------------- stored tapes

_STACK_CLASSES = (Call, Respond, Fork)  # the steps that do more to the stack than _add to the top
_stack_kinds: tuple[int, frozenset[str]] = (-1, frozenset())


def _stacking() -> frozenset[str]:
    """The registered step kinds whose steps may do more to the stack than go to the top view
    (:meth:`TapeView._add` without a fork): those of Call, Respond and Fork and their subclasses."""
    global _stack_kinds
    registry = step_kinds()
    if _stack_kinds[0] != len(registry):  # kinds are only ever added to the registry
        _stack_kinds = (
            len(registry),
            frozenset(k for k, c in registry.items() if issubclass(c, _STACK_CLASSES)),
        )
    return _stack_kinds[1]


def _leap(stack: TapeViewStack, steps: StepSequence[Step], start: int, stop: int) -> TapeViewStack:
    """The stack after steps ``start:stop`` of a tape read from a store: what ``push`` over each
    of them gives, reading few of them.

    The steps that may change the stack (a Call, Respond or Fork: the store finds them by kind,
    unread) are pushed as the fold does; each run of other steps between them only goes to the
    top view (:func:`_to_top`), which reads the run's last steps only."""
    marks = steps.stored_positions(_stacking(), start, stop)
    if marks is None:
        for i in range(start, stop):
            stack = stack.push(steps[i], i)
        return stack
    at = start
    for i, step in zip(marks, steps.items_at(marks), strict=True):
        stack = _to_top(stack, steps, at, i).push(step, i)
        at = i + 1
    return _to_top(stack, steps, at, stop)


_UNSET: Any = object()


def _to_top(stack: TapeViewStack, steps: StepSequence[Step], start: int, stop: int) -> TapeViewStack:
    """The stack after steps ``start:stop``, none of which is a Call, Respond or Fork: what
    :meth:`TapeView._add` of each gives the top view. The steps join the view unread; the view's
    node run fields come from its agent's last steps among them, read from the end back to the
    start of its last node run."""
    if start >= stop:
        return stack
    top = stack.views[-1]
    name = top.agent_name
    changes: dict[str, Any] = {"steps": top.steps.appended_from(steps, start, stop)}
    last = stop - 1
    while last >= start and not _own(steps[last], name):
        last -= 1
    if last >= start:  # the agent's last step here, and the first step of its node run
        meta = steps[last].metadata
        prompt_id, first, next_node = meta.prompt_id, last, _UNSET
        i = last
        while i >= start:
            step = steps[i]
            if _own(step, name):
                if step.metadata.prompt_id != prompt_id:
                    break
                first = i
                if next_node is _UNSET and isinstance(step, SetNextNode):
                    next_node = step.next_node  # the run's last SetNextNode is the one that counts
            i -= 1
        changes["run_open"] = not meta.run_end
        if i >= start or prompt_id != top.last_prompt_id:  # a new node run began here
            changes.update(
                last_node=steps[first].metadata.node,
                last_prompt_id=prompt_id,
                next_node=None if next_node is _UNSET else next_node,
                run_start=first,
            )
        elif next_node is not _UNSET:
            changes["next_node"] = next_node
    return TapeViewStack((*stack.views[:-1], _evolve(top, changes)))


def _own(step: Step, agent_name: str) -> bool:
    """Whether ``step`` was made by a node run of the agent ``agent_name`` (what moves its view's
    node pointer)."""
    meta = step.metadata
    return meta.agent == agent_name and bool(meta.prompt_id)


def cached_fold(
    tape: Tape[Any, Any] | StepSequence[Any],
    key: Any,
    initial: Callable[[], _T],
    step_fn: Callable[[_T, Any, int], _T],
) -> _T:
    """Fold ``step_fn(state, step, index)`` over a tape's steps, memoised per prefix.

    Use it for your own derived state (a form being filled, a budget spent so far) so that it
    too costs O(new steps) per node run. ``key`` must identify the fold; ``step_fn`` must be
    pure and return a new state instead of mutating the old one.
    """
    steps = tape.steps if isinstance(tape, Tape) else tape
    return steps.fold(key, initial, step_fn)
