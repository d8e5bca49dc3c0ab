"""Dialogue trees (section 5.4): many partial dialogues between an agent and simulated users.

A tree of one company starts from ``intents`` roots, each a user who wants one of the company's
forms (forms taken in turn) and a tape holding only the assistant's greeting. Level by level:
after every assistant message, ``branching`` user behaviours that can act there are drawn (the
least used so far first, ties broken by a seeded draw), each writes the user's turn on a copy of
the tape, and of all these children at most ``beam_width`` are kept, again the least used
behaviours and forms first; the agent then answers every kept child with the batch runner (one
batch per level, into the store when one is given). A branch stops when the form is submitted,
the agent stops or fails, or the dialogue reaches ``max_turns`` messages (``max_turns // 2`` from the user).

Every tape id is derived from the tree's name, the company, the root and the behaviours along
the path, and the batch runner skips what the store already holds, so running the same tree
again (after a crash, say) recomputes nothing that finished and gives the same tree.

With ``user_llm`` (an :class:`~examples.form_filler.llm_user.LLMUser`) an LLM words the users'
turns (the behaviours' programs still decide what they say); the LLM's model name then enters
the tape ids, so its tree and the programmatic one never share a store's tapes.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, PositiveInt

from examples.form_filler.behaviors import BEHAVIOR_NAMES, applicable_behaviors
from examples.form_filler.environment import FormFillerEnvironment
from examples.form_filler.llm_user import LLMUser
from examples.form_filler.schema import Company
from examples.form_filler.state import form_state
from examples.form_filler.steps import PromptUserForTextMessageAction
from examples.form_filler.users import UserBehavior, UserIntent, make_intent, respond
from tapekit import Agent, StepSequence, Tape, TapeMetadata, UserStep
from tapekit.batch import batch

__all__ = ["GREETING", "Branch", "Tree", "TreeSettings", "grow_tree", "root_tape"]

GREETING = "Hi, how can I help you?"


class TreeSettings(BaseModel):
    """The shape of a tree: ``intents`` roots, ``branching`` behaviours drawn after each
    assistant message, at most ``beam_width`` branches per level, dialogues of at most
    ``max_turns`` messages (both sides, the paper's 18). Counts below 1 are refused."""

    model_config = ConfigDict(frozen=True)

    intents: PositiveInt = 10
    branching: PositiveInt = 3
    beam_width: PositiveInt = 60
    max_turns: PositiveInt = 18
    seed: int = 0
    max_concurrency: PositiveInt = 16


@dataclass(frozen=True)
class Branch:
    """One node of the tree: the dialogue so far with the user's new message (``start``), and
    the agent's answer to it (``tape``, as stored). ``behavior`` wrote the user's message."""

    company: str
    form: str
    behavior: str
    level: int
    start: Tape[Any, Any]
    tape: Tape[Any, Any]
    skipped: bool = False

    @property
    def error(self) -> str | None:
        """The agent's failure on this branch, if any."""
        return self.tape.metadata.error  # type: ignore[no-any-return]


@dataclass
class Tree:
    """The branches of one company's tree, level by level."""

    company: str
    branches: list[Branch] = field(default_factory=list)

    def behavior_counts(self) -> Counter[str]:
        """How many branches each behaviour started (all 19 names, zeros included)."""
        counts = Counter({name: 0 for name in BEHAVIOR_NAMES})
        counts.update(b.behavior for b in self.branches)
        return counts

    def form_counts(self) -> Counter[str]:
        """How many branches are about each form."""
        return Counter(b.form for b in self.branches)


def _id(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def root_tape(tree_name: str, company: Company, index: int) -> Tape[Any, Any]:
    """Root ``index`` of a tree: only the assistant's greeting (made by no agent)."""
    greeting = PromptUserForTextMessageAction(prompt=GREETING)
    meta = TapeMetadata(id=_id(tree_name, company.name, str(index)), author="tree")
    return Tape(steps=StepSequence([greeting]), metadata=meta)


def _child(tape: Tape[Any, Any], behavior: UserBehavior, user: UserStep, model: str | None) -> Tape[Any, Any]:
    key = [tape.metadata.id, behavior.name] + ([model] if model is not None else [])
    meta = TapeMetadata(id=_id(*key), parent_id=tape.metadata.id, author="user")
    return tape.model_copy(update={"steps": tape.steps.appended([user]), "metadata": meta})


def _user_steps(
    kept: list[tuple[Tape[Any, Any], UserIntent, UserBehavior]], seed: int, user_llm: LLMUser | None
) -> list[UserStep]:
    """The users' messages of the kept children: the programs', or worded by ``user_llm``."""
    if user_llm is None:
        return [respond(behavior, tape, intent, seed) for tape, intent, behavior in kept]
    return user_llm.respond_many(kept, seed)


def _waits_for_user(tape: Tape[Any, Any], max_turns: int) -> bool:
    if (
        tape.metadata.error
        or not tape.steps
        or not isinstance(tape.steps[-1], PromptUserForTextMessageAction)
    ):
        return False
    state = form_state(tape.steps)
    return not state.ended and state.n_user_messages < max_turns // 2


def _draw(
    frontier: list[tuple[Tape[Any, Any], UserIntent]], settings: TreeSettings, used: Counter[str], name: str
) -> list[tuple[Tape[Any, Any], UserIntent, UserBehavior]]:
    """Up to ``branching`` behaviours per waiting tape, least used first."""
    drawn = []
    for tape, intent in frontier:
        options = applicable_behaviors(form_state(tape.steps), intent)
        random.Random(f"{name}:{settings.seed}:{tape.metadata.id}").shuffle(options)
        options.sort(key=lambda b: used[b.name])
        drawn += [(tape, intent, b) for b in options[: settings.branching]]
    return drawn


def _beam(
    drawn: list[tuple[Tape[Any, Any], UserIntent, UserBehavior]],
    width: int,
    used: Counter[str],
    forms: Counter[str],
) -> list[tuple[Tape[Any, Any], UserIntent, UserBehavior]]:
    """At most ``width`` of the drawn children: the least used behaviours, then forms, first."""
    left = list(drawn)
    kept: list[tuple[Tape[Any, Any], UserIntent, UserBehavior]] = []
    while left and len(kept) < width:
        best = min(range(len(left)), key=lambda i: (used[left[i][2].name], forms[left[i][1].form.name], i))
        tape, intent, behavior = left.pop(best)
        used[behavior.name] += 1
        forms[intent.form.name] += 1
        kept.append((tape, intent, behavior))
    return kept


def grow_tree(
    agent: Agent,
    company: Company,
    settings: TreeSettings | None = None,
    store: Any = None,
    name: str = "tree",
    user_llm: LLMUser | None = None,
) -> Tree:
    """The tree of ``agent``'s dialogues at ``company`` (see the module docstring); with a
    ``store``, every branch is stored as it runs, and a rerun resumes. ``user_llm`` words the
    users' turns (None: the behaviours' programs do)."""
    settings = settings or TreeSettings()
    environment = FormFillerEnvironment(company)
    intents = [
        make_intent(company, company.forms[i % len(company.forms)].name, seed=settings.seed + i)
        for i in range(settings.intents)
    ]
    frontier = [(root_tape(name, company, i), intent) for i, intent in enumerate(intents)]
    used: Counter[str] = Counter()
    forms: Counter[str] = Counter()
    tree = Tree(company.name)
    level = 0
    while frontier:
        level += 1
        kept = _beam(_draw(frontier, settings, used, name), settings.beam_width, used, forms)
        users = _user_steps(kept, settings.seed, user_llm)
        model = None if user_llm is None else user_llm.model
        starts = [_child(tape, b, user, model) for (tape, _, b), user in zip(kept, users, strict=True)]
        results = batch(
            agent,
            environment,
            starts,
            store=store,
            name=f"{name}/{company.name}/{level}",
            max_concurrency=settings.max_concurrency,
            max_loops=12,
        )
        frontier = []
        for (_, intent, behavior), start, result in zip(kept, starts, results, strict=True):
            tree.branches.append(
                Branch(
                    company.name, intent.form.name, behavior.name, level, start, result.tape, result.skipped
                )
            )
            if _waits_for_user(result.tape, settings.max_turns):
                frontier.append((result.tape, intent))
    return tree
