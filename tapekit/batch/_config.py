"""The options of a batch, written once: :class:`BatchOptions` types the keyword arguments of
:func:`tapekit.batch.abatch` and :func:`tapekit.batch.batch` (and the CLI's), and
:class:`BatchConfig` is the checked, defaulted form that the local and Ray backends receive."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from tapekit.agent import Agent
from tapekit.core import Tape
from tapekit.environment import Environment
from tapekit.llm.base import LLMCall
from tapekit.store.base import TapeStore

if TYPE_CHECKING:
    from tapekit.batch._results import BatchStats


DEFAULT_CONCURRENCY = 64
_NAME = re.compile(r"^[\w.\-/]+$")

LLMConcurrency = int | Mapping[str, int] | None
"""A limit on requests in flight: one int for every LLM, or ``{llm_key: int}``, or no limit."""


class BatchOptions(TypedDict, total=False):
    """The keyword options of a batch (see :func:`tapekit.batch.abatch` for what each does)."""

    max_concurrency: int
    llm_concurrency: LLMConcurrency
    store: TapeStore | None
    name: str
    max_loops: int | None
    retry_failed: bool
    stats: BatchStats | None
    backend: Literal["local", "ray"]
    ray_workers: int | None
    ray_factory: str | None
    on_llm_call: Callable[[LLMCall], None] | None


@dataclass(frozen=True)
class BatchConfig:
    """A batch's options, checked and with their defaults (what the backends run with)."""

    max_concurrency: int = DEFAULT_CONCURRENCY
    llm_concurrency: LLMConcurrency = None
    store: TapeStore | None = None
    name: str = "batch"
    max_loops: int | None = None
    retry_failed: bool = False
    stats: Any = None
    backend: Literal["local", "ray"] = "local"
    ray_workers: int | None = None
    ray_factory: str | None = None
    on_llm_call: Callable[[LLMCall], None] | None = None

    @classmethod
    def of(cls, agent: Agent, options: BatchOptions) -> BatchConfig:
        """The config for ``options`` given to a batch of ``agent``; a bad option raises here,
        naming it, before anything runs."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown batch options {unknown}; the options are {sorted(known)}")
        config = cls(**options)
        config.check(agent)
        return config

    def check(self, agent: Agent) -> None:
        """Raise ``ValueError``/``TypeError`` naming the first option that is wrong."""
        _check_positive(self.max_concurrency, "max_concurrency")
        _check_llm_concurrency(agent, self.llm_concurrency)
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"batch name {self.name!r} must be non-empty letters, digits, '_', '-', '.' or '/'"
            )
        if self.max_loops is not None:
            _check_positive(self.max_loops, "max_loops")
        if self.store is not None and not isinstance(self.store, TapeStore):
            raise TypeError(
                f"store must be a TapeStore (SQLiteStore, PostgresStore, MemoryStore, ...), not "
                f"{type(self.store).__name__}"
            )
        if self.backend not in ("local", "ray"):
            raise ValueError(f"backend {self.backend!r}: choose 'local' or 'ray'")
        if self.on_llm_call is not None:
            if not callable(self.on_llm_call):
                raise TypeError(f"on_llm_call must be a function of an LLMCall, not {self.on_llm_call!r}")
            if self.backend == "ray":
                raise ValueError(
                    "on_llm_call runs in this process, and the Ray backend's calls are made in its "
                    "workers: read them from the store instead"
                )
        if self.ray_workers is not None:
            _check_positive(self.ray_workers, "ray_workers")


def check_inputs(
    agent: Agent, environment: Environment, tapes: Iterable[Tape[Any, Any]]
) -> list[Tape[Any, Any]]:
    """The start tapes as a list, after checking the agent, the environment and the tapes
    (each a Tape with a unique, non-empty id)."""
    if not isinstance(agent, Agent):
        raise TypeError(f"agent must be an Agent, got {type(agent).__name__}")
    if agent.manager is not None:
        raise ValueError(f"run the root agent {agent.root.name!r}, not its subagent {agent.full_name!r}")
    if not isinstance(environment, Environment):
        raise TypeError(f"environment must be an Environment, got {type(environment).__name__}")
    if isinstance(tapes, Tape):
        raise TypeError("tapes must be an iterable of tapes, not one tape: pass [tape]")
    items = list(tapes)
    seen: dict[str, int] = {}
    for i, tape in enumerate(items):
        if not isinstance(tape, Tape):
            raise TypeError(f"tapes[{i}] is a {type(tape).__name__}, not a Tape")
        tape_id = tape.metadata.id
        if not tape_id:
            raise ValueError(f"tapes[{i}] has an empty metadata.id; every start tape needs a unique id")
        if tape_id in seen:
            raise ValueError(
                f"tapes[{seen[tape_id]}] and tapes[{i}] have the same id {tape_id!r}; a batch needs "
                "unique start ids (they key the stored results)"
            )
        seen[tape_id] = i
    return items


def team(agent: Agent) -> list[Agent]:
    """The agent and all its subagents, at any depth."""
    members, stack = [], [agent]
    while stack:
        member = stack.pop()
        members.append(member)
        stack.extend(member.subagents)
    return members


def _check_positive(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")


def _check_llm_concurrency(agent: Agent, llm_concurrency: LLMConcurrency) -> None:
    if llm_concurrency is None:
        return
    if isinstance(llm_concurrency, Mapping):
        keys = {key for member in team(agent) for key in member.llms}
        unknown = sorted(set(llm_concurrency) - keys)
        if unknown:
            raise ValueError(
                f"llm_concurrency names LLMs {unknown} that the agent does not have (its LLM keys: "
                f"{sorted(keys)})"
            )
        for key, limit in llm_concurrency.items():
            _check_positive(limit, f"llm_concurrency[{key!r}]")
    else:
        _check_positive(llm_concurrency, "llm_concurrency")
