"""What the conformance checks share: the store factory and check types, a typed tape (its
context and step classes must survive a store), and small helpers that stand in for a test
runner's (``raises``, ``equal``) or fill a store with tapes and LLM calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from tapekit.core import LLMOutput, Prompt, Tape, Thought
from tapekit.dialog import UserStep
from tapekit.llm.base import LLMCall
from tapekit.store.base import TapeStore

StoreFactory = Callable[[], TapeStore]
"""Returns a new, empty store each time it is called."""

Check = Callable[[StoreFactory, Path], None]
"""One conformance check: ``check(make_store, scratch_directory)``."""


class ConformanceNote(Thought):
    """A typed step: its class and fields must survive the store."""

    kind: Literal["tapekit_conformance_note"] = "tapekit_conformance_note"
    text: str
    score: float = 0.0


class ConformanceBrief(BaseModel):
    """A typed tape context."""

    topic: str
    budget: int


class ConformanceTape(Tape[ConformanceBrief, ConformanceNote | UserStep]):
    """A typed tape: its context and step classes must survive the store."""


@contextmanager
def raises(kind: type[BaseException], match: str = "") -> Iterator[None]:
    """Like ``pytest.raises``: the block must raise ``kind`` with a message matching ``match``."""
    try:
        yield
    except kind as e:
        if match and not re.search(match, str(e)):
            raise AssertionError(f"{kind.__name__} raised, but {str(e)!r} does not match {match!r}") from e
        return
    raise AssertionError(f"expected {kind.__name__} (matching {match!r}); nothing was raised")


def equal(got: Any, expected: Any, what: str) -> None:
    if got != expected:
        raise AssertionError(f"{what}: expected {expected!r}, got {got!r}")


def made_by(agent: str, node: str, prompt_id: str, content: str = "x") -> UserStep:
    step = UserStep(content=content)
    step.metadata.agent, step.metadata.node, step.metadata.prompt_id = agent, node, prompt_id
    return step


def llm_call(prompt_id: str, prompt_tokens: int = 10, output_tokens: int = 2, cost: float = 0.5) -> LLMCall:
    return LLMCall(
        prompt=Prompt(id=prompt_id, messages=[{"role": "user", "content": f"q {prompt_id}"}]),
        output=LLMOutput(content=f"a {prompt_id}"),
        model="m",
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cost=cost,
    )


def contents(tape: Tape[Any, Any]) -> list[Any]:
    return [getattr(s, "content", None) for s in tape.steps]


def fill(store: TapeStore) -> list[str]:
    """Two related tapes with tags, a typed context and LLM calls (one unreferenced)."""
    first = ConformanceTape(
        context=ConformanceBrief(topic="t", budget=1),
        steps=[made_by("a", "n", "p1"), ConformanceNote(text="n")],
    )
    second = first.with_new_steps([made_by("a/b", "m", "p2")], author="b", result=[1, "x"])
    store.save_tape(first, tags=["x"])
    store.save_tape(second, tags=["x", "y"])
    store.save_llm_call(llm_call("p1"))
    store.save_llm_call(llm_call("p2", 3, 4, 0.25))
    store.save_llm_call(llm_call("unreferenced"))
    store.flush()
    return [first.metadata.id, second.metadata.id]


def recorded_session(store: TapeStore) -> tuple[Tape[Any, Any], str]:
    """The analyst demo, run with ``store=``: the session is stored as it runs."""
    from tapekit.orchestrator import main_loop
    from tapekit.testing.analyst import ENVIRONMENT, make_analyst, start_tape

    start = start_tape()
    final = main_loop(make_analyst(), start, ENVIRONMENT, store=store, tags=["demo"]).get_final_tape()
    return final, start.metadata.id
