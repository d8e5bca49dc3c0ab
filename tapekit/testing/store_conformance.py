"""The conformance suite of :class:`~tapekit.store.TapeStore`: what every backend must do, as
plain check functions that any test runner (or none) can run.

A check takes a *store factory*, a function that returns a new, empty store each time it is
called (a check may open two, e.g. to import an export), and a scratch directory; it closes the
stores it opens and raises ``AssertionError`` naming what is wrong. The suite runs on
:class:`~tapekit.store.MemoryStore`, :class:`~tapekit.store.SQLiteStore` and
:class:`~tapekit.store.PostgresStore` in tapekit's own tests; run it on your backend:

.. code-block:: python

    import pytest
    from tapekit.testing.store_conformance import CHECKS

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
    def test_my_store(check, tmp_path):
        check(lambda: MyStore(...), tmp_path)

or, without pytest, :func:`run_conformance` (``run_conformance(MyStore)`` raises one
``AssertionError`` listing every check that failed).

What is checked: saving and reading tapes (typed steps and context, every metadata field, a
save is a snapshot, a growing tape writes only its new steps, a save under a stored id must
extend the stored tape), tags, every :class:`TapeFilter`
field with paging and counting, ancestry, LLM calls (token ids included; long conversations
read back byte for byte) and totals, JSONL
export and import (round trip, subsets, a bad line stores nothing), the errors (a missing tape,
bad arguments, text no database can hold, a closed store) and one store shared by threads.
Several processes on one database, crashes and a database that refuses a committed row are the
backend's own business and are not checked here.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from tapekit.core import LLMOutput, Prompt, Tape, Thought
from tapekit.dialog import UserStep
from tapekit.llm.base import LLMCall, TokenTrace
from tapekit.store.base import TapeFilter, TapeInfo, TapeNotFoundError, TapeStore

__all__ = ["CHECKS", "Check", "StoreFactory", "run_conformance"]

StoreFactory = Callable[[], TapeStore]
"""Returns a new, empty store each time it is called."""

Check = Callable[[StoreFactory, Path], None]
"""One conformance check: ``check(make_store, scratch_directory)``."""


# ---------------------------------------------------------------------------- helpers


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
def _raises(kind: type[BaseException], match: str = "") -> Iterator[None]:
    """Like ``pytest.raises``: the block must raise ``kind`` with a message matching ``match``."""
    try:
        yield
    except kind as e:
        if match and not re.search(match, str(e)):
            raise AssertionError(f"{kind.__name__} raised, but {str(e)!r} does not match {match!r}") from e
        return
    raise AssertionError(f"expected {kind.__name__} (matching {match!r}); nothing was raised")


def _equal(got: Any, expected: Any, what: str) -> None:
    if got != expected:
        raise AssertionError(f"{what}: expected {expected!r}, got {got!r}")


def _made_by(agent: str, node: str, prompt_id: str, content: str = "x") -> UserStep:
    step = UserStep(content=content)
    step.metadata.agent, step.metadata.node, step.metadata.prompt_id = agent, node, prompt_id
    return step


def _call(prompt_id: str, prompt_tokens: int = 10, output_tokens: int = 2, cost: float = 0.5) -> LLMCall:
    return LLMCall(
        prompt=Prompt(id=prompt_id, messages=[{"role": "user", "content": f"q {prompt_id}"}]),
        output=LLMOutput(content=f"a {prompt_id}"),
        model="m",
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cost=cost,
    )


def _contents(tape: Tape[Any, Any]) -> list[Any]:
    return [getattr(s, "content", None) for s in tape.steps]


def _fill(store: TapeStore) -> list[str]:
    """Two related tapes with tags, a typed context and LLM calls (one unreferenced)."""
    first = ConformanceTape(
        context=ConformanceBrief(topic="t", budget=1),
        steps=[_made_by("a", "n", "p1"), ConformanceNote(text="n")],
    )
    second = first.with_new_steps([_made_by("a/b", "m", "p2")], author="b", result=[1, "x"])
    store.save_tape(first, tags=["x"])
    store.save_tape(second, tags=["x", "y"])
    store.save_llm_call(_call("p1"))
    store.save_llm_call(_call("p2", 3, 4, 0.25))
    store.save_llm_call(_call("unreferenced"))
    store.flush()
    return [first.metadata.id, second.metadata.id]


def _recorded_session(store: TapeStore) -> tuple[Tape[Any, Any], str]:
    """The analyst demo, run with ``store=``: the session is stored as it runs."""
    from tapekit.orchestrator import main_loop
    from tapekit.testing.analyst import ENVIRONMENT, make_analyst, start_tape

    start = start_tape()
    final = main_loop(make_analyst(), start, ENVIRONMENT, store=store, tags=["demo"]).get_final_tape()
    return final, start.metadata.id


# ---------------------------------------------------------------------------- tapes


def check_a_recorded_session_round_trips(make_store: StoreFactory, tmp: Path) -> None:
    """A session recorded by ``main_loop(..., store=)`` reads back step for step: classes,
    metadata, tags, and the start tape it continues."""
    with make_store() as store:
        final, key = _recorded_session(store)
        loaded = store.get_tape(key)
        _equal([type(s) for s in loaded.steps], [type(s) for s in final.steps], "step classes")
        _equal(list(loaded.steps), list(final.steps), "steps")
        _equal([s.metadata for s in loaded.steps], [s.metadata for s in final.steps], "step metadata")
        _equal(store.list_tapes(), [key], "stored tapes")
        _equal(store.get_tape_info(key).tags, ["demo"], "tags")
        # the stored session continues its start tape, not the loop's short-lived per-turn tapes
        meta = loaded.metadata
        _equal((meta.id, meta.author, meta.parent_id), (key, final.metadata.author, None), "tape metadata")
        _equal(store.ancestry(key), [], "ancestry of a session started from a fresh tape")
        _equal(meta.n_added_steps, len(final) - 1, "n_added_steps")


def check_a_typed_tape_keeps_its_context_step_classes_and_metadata(
    make_store: StoreFactory, tmp: Path
) -> None:
    """``get_tape(id, tape_class)`` rebuilds the typed context and step classes, and every
    metadata field (``other`` included) round-trips; ``TapeInfo`` shows the same metadata."""
    tape = ConformanceTape(
        context=ConformanceBrief(topic="vulcan", budget=3),
        steps=[UserStep(content="hi"), ConformanceNote(text="plan", score=0.25)],
    ).with_metadata(
        author="me",
        error="boom",
        result={"answer": [1, 2]},
        n_added_steps=1,
        parent_id="p",
        author_tape_id="a",
        other={"tapeagents": {"level": 2, "timers": [1.5]}, "note": "é"},
    )
    with make_store() as store:
        key = store.save_tape(tape)
        loaded = store.get_tape(key, ConformanceTape)
        assert isinstance(loaded, ConformanceTape), f"get_tape gave a {type(loaded).__name__}"
        _equal(loaded.context, ConformanceBrief(topic="vulcan", budget=3), "context")
        _equal(list(loaded.steps), list(tape.steps), "steps")
        assert isinstance(loaded.steps[1], ConformanceNote), "the typed step's class is lost"
        _equal(loaded.metadata, tape.metadata, "metadata")
        info = store.get_tape_info(key)
        _equal(info.metadata, tape.metadata, "TapeInfo.metadata")
        _equal(
            (info.n_steps, info.author, info.error, info.result, info.parent_id, info.other),
            (2, "me", "boom", {"answer": [1, 2]}, "p", tape.metadata.other),
            "TapeInfo fields",
        )
        assert info.created <= info.updated, f"created {info.created} after updated {info.updated}"
        plain = store.save_tape(Tape(steps=[UserStep(content="plain")]))
        _equal(
            {i.id: i.other for i in store.list_tape_infos()}, {key: tape.metadata.other, plain: {}}, "other"
        )
        grown = tape.append(UserStep(content="more")).with_metadata(id=key, other={"note": "changed"})
        store.save_tape(grown)
        _equal(store.get_tape(key).metadata.other, {"note": "changed"}, "metadata.other after a later save")
        with _raises(ValueError, r"its metadata\.other cannot be stored as JSON"):
            store.save_tape(Tape().with_metadata(other={"when": object()}))


def check_a_save_stores_the_tape_as_it_was(make_store: StoreFactory, tmp: Path) -> None:
    """Changing a tape's objects after saving it changes nothing stored, and what a read
    returns is the reader's own (changing it changes nothing stored either)."""
    step = UserStep(content="before")
    tape: Tape[Any, Any] = Tape(steps=[step]).with_metadata(other={"k": [1]})
    with make_store() as store:
        key = store.save_tape(tape)
        step.content = "after"
        tape.metadata.other["k"].append(2)
        first = store.get_tape(key)
        _equal(_contents(first), ["before"], "steps after the saved step object changed")
        _equal(first.metadata.other, {"k": [1]}, "metadata.other after the saved dict changed")
        first.metadata.other["k"].append(3)
        first.steps[0].content = "changed by a reader"  # type: ignore[attr-defined]
        store.get_tape_info(key).other["k"].append(4)
        again = store.get_tape(key)
        _equal((_contents(again), again.metadata.other), (["before"], {"k": [1]}), "a second read")


def check_saving_a_growing_tape_writes_only_new_steps(make_store: StoreFactory, tmp: Path) -> None:
    """Saving a tape again under its id as it grows stores every step once, in order; a tape
    shorter than the stored one is refused."""
    tape: Tape[Any, Any] = Tape(steps=[UserStep(content="0")])
    with make_store() as store:
        key = store.save_tape(tape)
        for i in range(1, 50):
            tape = tape.append(UserStep(content=str(i)))
            store.save_tape(tape, key)
        loaded = store.get_tape(key)
        _equal(_contents(loaded), [str(i) for i in range(50)], "contents")
        _equal([s.metadata.id for s in loaded.steps], [s.metadata.id for s in tape.steps], "step ids")
        _equal(store.get_tape_info(key).n_steps, 50, "n_steps")
        with _raises(ValueError, "stored steps"):
            store.save_tape(Tape(steps=[UserStep(content="short")]), key)
        other = store.save_tape(Tape(steps=[UserStep(content="x")]), "elsewhere")  # an explicit id
        _equal((other, _contents(store.get_tape("elsewhere"))), ("elsewhere", ["x"]), "a save under tape_id")


def check_a_save_under_a_stored_id_must_extend_the_stored_tape(make_store: StoreFactory, tmp: Path) -> None:
    """Saving under a stored id a tape that does not begin with the stored steps raises
    ``ValueError`` naming the tape and the first step that differs, and stores nothing of it:
    a longer tape of other steps, one of the same length with one step changed, one whose steps
    hold the same text under other step ids, one with a step changed in its metadata. Saving
    the stored tape again (the same object, or as read back) changes only its metadata and
    tags, and a tape that extends it (grown from the one read back) stores its new steps; an
    import of a tape that differs from the stored one is refused the same way."""
    a, b = UserStep(content="a"), UserStep(content="b")
    tape: Tape[Any, Any] = Tape(steps=[a, b]).with_metadata(author="first")
    with make_store() as store:
        key = store.save_tape(tape, tags=["kept"])
        changed_agent = b.model_copy(deep=True)
        changed_agent.metadata.agent = "someone else"
        refused: dict[str, tuple[Tape[Any, Any], int]] = {
            "longer, other steps": (Tape(steps=[UserStep(content="x"), b, UserStep(content="c")]), 0),
            "the same length, a step changed": (Tape(steps=[a, UserStep(content="B")]), 1),
            "the same text, other step ids": (Tape(steps=[UserStep(content="a"), UserStep(content="b")]), 0),
            "a step's metadata changed": (Tape(steps=[a, changed_agent, UserStep(content="c")]), 1),
        }
        for what, (other, index) in refused.items():
            with _raises(ValueError, rf"tape {key} has 2 stored steps .*step {index} differs"):
                store.save_tape(other.with_metadata(author="second"), key, tags=["refused"])
            info = store.get_tape_info(key)
            _equal(
                (_contents(store.get_tape(key)), info.n_steps, info.author, info.tags),
                (["a", "b"], 2, "first", ["kept"]),
                f"the stored tape after a refused save ({what})",
            )
        _equal(
            [s.metadata.id for s in store.get_tape(key).steps],
            [a.metadata.id, b.metadata.id],
            "stored step ids",
        )
        store.save_tape(tape.with_metadata(author="again"), key, tags=["again"])  # the same steps again
        _equal(store.get_tape_info(key).author, "again", "the metadata of the tape saved again")
        store.save_tape(store.get_tape(key), key)  # as read back
        grown = store.get_tape(key).append(UserStep(content="c"))
        store.save_tape(grown, key)
        store.save_tape(grown.append(UserStep(content="d")), key)
        info = store.get_tape_info(key)
        _equal(
            (_contents(store.get_tape(key)), info.author, info.tags),
            (["a", "b", "c", "d"], grown.metadata.author, ["again", "kept"]),
            "the tape saved again and extended",
        )
        with _raises(ValueError, rf"tape {key} has 4 stored steps .*step 2 differs"):
            store.save_tape(tape.append(UserStep(content="C")).append(UserStep(content="d")), key)
        store.export_jsonl(tmp / "extends.jsonl")
    with make_store() as second:
        second.save_tape(Tape(steps=[a, UserStep(content="not b")]), key)
        with _raises(ValueError, rf"extends.jsonl, line 2: tape {key} has 2 stored steps .*step 1 differs"):
            second.import_jsonl(tmp / "extends.jsonl")
        _equal(_contents(second.get_tape(key)), ["a", "not b"], "the stored tape after a refused import")


def check_get_steps_pages_a_long_tape(make_store: StoreFactory, tmp: Path) -> None:
    """``get_steps`` and ``get_raw_steps`` load a slice with Python's slice rules;
    ``get_raw_context`` gives the stored context's JSON."""
    tape = ConformanceTape(
        context=ConformanceBrief(topic="t", budget=2),
        steps=[ConformanceNote(text=str(i)) for i in range(250)],
    )
    with make_store() as store:
        key = store.save_tape(tape)
        _equal([s.text for s in store.get_steps(key, 0, 100)], [str(i) for i in range(100)], "steps 0:100")  # type: ignore[attr-defined]
        _equal(store.get_steps(key, 200), list(tape.steps[200:]), "steps 200:")
        _equal(store.get_steps(key, -3), list(tape.steps[-3:]), "steps -3:")
        _equal(store.get_steps(key, 240, 1000), list(tape.steps[240:]), "steps 240:1000")
        _equal((store.get_steps(key, 300, 400), store.get_steps(key, 5, 5)), ([], []), "empty slices")
        raw = store.get_raw_steps(key, 10, 12)
        _equal([r["text"] for r in raw], ["10", "11"], "raw steps")
        _equal(raw[0]["kind"], "tapekit_conformance_note", "a raw step's kind")
        _equal(store.get_raw_context(key), {"topic": "t", "budget": 2}, "raw context")
        _equal(store.get_raw_context(store.save_tape(Tape())), None, "the raw context of a tape without one")
        with _raises(TypeError, "start"):
            store.get_steps(key, "0")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- tags and filters


def check_tags_are_added_by_saves_and_changed_only_explicitly(make_store: StoreFactory, tmp: Path) -> None:
    """Saves add tags and never remove them; ``add_tags``/``remove_tags`` change them; tags
    list sorted, once each."""
    tape: Tape[Any, Any] = Tape(steps=[UserStep(content="0")])
    with make_store() as store:
        key = store.save_tape(tape, tags=["eval", "v1"])
        tape = tape.append(UserStep(content="1"))
        store.save_tape(tape, key, tags=["v2", "eval"])
        store.save_tape(tape.append(UserStep(content="2")), key)  # no tags: nothing removed
        _equal(store.get_tape_info(key).tags, ["eval", "v1", "v2"], "tags after saves")
        store.remove_tags(key, ["v1", "never-there"])
        store.add_tags(key, ["gold", "gold"])
        _equal(store.get_tape_info(key).tags, ["eval", "gold", "v2"], "tags after add/remove")
        other = store.save_tape(Tape(steps=[UserStep(content="o")]), tags=["eval"])
        _equal(set(store.list_tapes(TapeFilter(tag="eval"))), {key, other}, "tag=eval")
        _equal(store.list_tapes(TapeFilter(tag="gold")), [key], "tag=gold")
        _equal(store.list_tapes(TapeFilter(tag="v1")), [], "tag=v1")
        _equal(store.list_tape_infos(TapeFilter(tag="gold"))[0].tags, ["eval", "gold", "v2"], "listed tags")
        with _raises(TypeError, "list of strings"):
            store.add_tags(key, "gold")
        with _raises(TypeError, "non-empty"):
            store.save_tape(tape, key, tags=[""])
        with _raises(TapeNotFoundError, "nope"):
            store.add_tags("nope", ["x"])


def check_every_filter_of_list_tapes(make_store: StoreFactory, tmp: Path) -> None:
    """Each :class:`TapeFilter` field selects what it says, alone and combined; lists are
    newest first and page with ``limit``/``offset``; ``count_tapes`` agrees."""
    root: Tape[Any, Any] = Tape(steps=[_made_by("analyst", "plan", "p1")]).with_metadata(author="analyst")
    child = root.with_new_steps([_made_by("analyst/search_agent", "search", "p2")], author="search_agent")
    failed: Tape[Any, Any] = Tape(steps=[UserStep(content="x")]).with_metadata(
        error="timeout", author="analyst"
    )
    with make_store() as store:
        store.save_tape(root, tags=["a"])
        store.flush()
        time.sleep(0.02)
        store.save_tape(child, tags=["a", "b"])
        store.flush()
        time.sleep(0.02)
        store.save_tape(failed, tags=["b"])
        r, c, f = root.metadata.id, child.metadata.id, failed.metadata.id
        t_child = store.get_tape_info(c).created

        def ids(**fields: Any) -> list[str]:
            return store.list_tapes(TapeFilter(**fields))

        _equal(store.list_tapes(), [f, c, r], "every tape, newest first")
        _equal(store.list_tapes(TapeFilter()), [f, c, r], "TapeFilter()")
        _equal(ids(author="analyst"), [f, r], "author")
        _equal(ids(agent="analyst/search_agent"), [c], "agent")
        _equal(
            (ids(agent="analyst"), ids(agent="analyst/x")), ([c, r], []), "agent (a full name, not a prefix)"
        )
        _equal((ids(has_error=True), ids(has_error=False)), ([f], [c, r]), "has_error")
        _equal((ids(tag="a"), ids(tag="b", author="analyst")), ([c, r], [f]), "tag")
        _equal((ids(since=t_child), ids(until=t_child)), ([f, c], [r]), "since, until")
        _equal(ids(since=t_child, until=t_child + 0.001), [c], "since and until")
        _equal((ids(parent_id=r), ids(parent_id=c)), ([c], []), "parent_id")
        _equal(store.list_tapes(limit=2), [f, c], "limit")
        _equal(store.list_tapes(limit=2, offset=2), [r], "limit and offset")
        _equal((store.list_tapes(offset=1), store.list_tapes(limit=0)), ([c, r], []), "offset, limit=0")
        _equal(store.list_tapes(TapeFilter(tag="a"), limit=1, offset=1), [r], "a filter with a page")
        infos = store.list_tape_infos(TapeFilter(has_error=False), limit=5)
        _equal([i.id for i in infos], [c, r], "list_tape_infos")
        assert all(isinstance(i, TapeInfo) for i in infos), "list_tape_infos must give TapeInfo"
        _equal((infos[0].parent_id, infos[0].n_added_steps, infos[0].n_steps), (r, 1, 2), "a listed info")
        _equal(store.count_tapes(), 3, "count_tapes()")
        _equal(store.count_tapes(TapeFilter(tag="a", has_error=False)), 2, "count_tapes(tag, has_error)")
        _equal(
            store.count_tapes(TapeFilter(agent="analyst/search_agent", since=t_child)), 1, "count by agent"
        )


def check_ancestry_and_descendants(make_store: StoreFactory, tmp: Path) -> None:
    """``ancestry`` walks parents (nearest first, stopping at one not stored); ``descendants``
    is breadth-first, each level newest first."""
    root: Tape[Any, Any] = Tape(steps=[UserStep(content="r")])
    a = root.with_new_steps([UserStep(content="a")])
    b = root.with_new_steps([UserStep(content="b")])
    a1 = a.with_new_steps([UserStep(content="a1")])
    a1x = a1.with_new_steps([UserStep(content="a1x")])
    orphan: Tape[Any, Any] = Tape(steps=[UserStep(content="o")]).with_metadata(parent_id="not stored")
    with make_store() as store:
        for tape in (root, a, b, a1, a1x, orphan):
            store.save_tape(tape)
            store.flush()
            time.sleep(0.002)
        i = {name: t.metadata.id for name, t in dict(root=root, a=a, b=b, a1=a1, a1x=a1x).items()}
        _equal([x.id for x in store.ancestry(i["a1x"])], [i["a1"], i["a"], i["root"]], "ancestry")
        _equal((store.ancestry(i["root"]), store.ancestry(orphan.metadata.id)), ([], []), "no ancestry")
        _equal(
            [x.id for x in store.descendants(i["root"])], [i["b"], i["a"], i["a1"], i["a1x"]], "descendants"
        )
        _equal([x.id for x in store.descendants(i["a"])], [i["a1"], i["a1x"]], "descendants of a")
        _equal(store.descendants(i["a1x"]), [], "descendants of a leaf")


# ---------------------------------------------------------------------------- LLM calls


def check_every_step_leads_to_its_exact_llm_call(make_store: StoreFactory, tmp: Path) -> None:
    """A recorded session stores every LLM call; ``llm_call_for_step`` finds the one behind
    each step made by an agent; ``list_llm_calls`` lists them, by model too."""
    with make_store() as store:
        final, _ = _recorded_session(store)
        for step in final.steps:
            found = store.llm_call_for_step(step)
            if step.metadata.agent:
                assert found is not None and found.prompt.id == step.metadata.prompt_id, step.metadata
            else:
                _equal(found, None, "the call of a step no LLM made")
        _equal((len(store.list_llm_calls()), store.list_llm_calls(model="nope")), (8, []), "list_llm_calls")
        plan = final.steps[1]
        found = store.llm_call_for_step(plan)
        assert found is not None and found.output.content == getattr(plan, "content", None)
        _equal(store.get_llm_call("no such prompt"), None, "a missing call")


def check_llm_calls_keep_every_field_and_token_ids(make_store: StoreFactory, tmp: Path) -> None:
    """A stored LLM call reads back equal, its token ids and log-probs included (ids wider
    than 16 bits too); a second save of the same prompt id replaces it; lists are oldest first."""
    small = TokenTrace(
        prompt_ids=[1, 2, 3],
        output_ids=[4, 5],
        output_logprobs=[-0.5, -0.25],
        tokenizer="tk",
        policy_version="3",
    )
    wide = TokenTrace(prompt_ids=[70_000, 2], output_ids=[100_000], finish_reason="stop")
    calls = [_call("c1"), _call("c2"), _call("c3")]
    calls[0].tokens, calls[1].tokens = small, wide
    calls[2].model = "other"
    for n, call in enumerate(calls):
        call.timestamp = 1000.0 + n
        call.latency_s = 0.125
    with make_store() as store:
        for call in calls:
            store.save_llm_call(call)
        for call in calls:
            _equal(store.get_llm_call(call.prompt.id), call, f"the stored call {call.prompt.id}")
        _equal(store.list_llm_calls(), ["c1", "c2", "c3"], "oldest first")
        _equal(
            (store.list_llm_calls(model="m"), store.list_llm_calls("other")),
            (["c1", "c2"], ["c3"]),
            "by model",
        )
        replaced = _call("c1", prompt_tokens=99)
        replaced.timestamp = 1000.0
        store.save_llm_call(replaced)
        got = store.get_llm_call("c1")
        _equal((got.prompt_tokens, got.tokens) if got else None, (99, None), "a call saved again")


def check_totals_by_agent_node_and_tape(make_store: StoreFactory, tmp: Path) -> None:
    """Totals count each LLM call once per group, also when a continued tape shares the steps."""
    steps = [_made_by("a", "n1", "p0"), _made_by("a", "n1", "p0"), _made_by("a/b", "n2", "p1")]
    tape: Tape[Any, Any] = Tape(steps=[UserStep(content="q"), *steps])
    other: Tape[Any, Any] = Tape(steps=[_made_by("a", "n3", "p2")])
    with make_store() as store:
        store.save_tape(tape)
        store.save_tape(other)
        for pid, (pt, ot) in {"p0": (10, 2), "p1": (5, 1), "p2": (7, 3)}.items():
            store.save_llm_call(_call(pid, pt, ot))
        _equal(
            store.totals("agent", tape.metadata.id),
            {
                "a": {"calls": 1, "prompt_tokens": 10, "output_tokens": 2, "cost": 0.5},
                "a/b": {"calls": 1, "prompt_tokens": 5, "output_tokens": 1, "cost": 0.5},
            },
            "totals by agent of one tape",
        )
        _equal(
            store.totals("agent")["a"],
            {"calls": 2, "prompt_tokens": 17, "output_tokens": 5, "cost": 1.0},
            "totals of agent a",
        )
        _equal(set(store.totals("node")), {"a.n1", "a/b.n2", "a.n3"}, "node groups")
        by_tape = store.totals("tape")
        _equal(
            (by_tape[tape.metadata.id]["prompt_tokens"], by_tape[other.metadata.id]["calls"]),
            (15, 1),
            "by tape",
        )
        more = store.save_tape(tape.with_new_steps([UserStep(content="more")]))
        _equal(store.totals("tape")[more], store.totals("tape")[tape.metadata.id], "a continuation's totals")
        _equal(
            (store.totals("agent")["a"]["calls"], store.totals("node")["a.n1"]["calls"]),
            (2, 1),
            "no double count",
        )
        with _raises(ValueError, "choose"):
            store.totals("model")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- JSONL


def check_jsonl_round_trips_exactly_and_imports_once(make_store: StoreFactory, tmp: Path) -> None:
    """An export imported into an empty store gives the same tapes, infos, calls and totals;
    importing twice duplicates nothing; the copy's export is byte-identical."""
    with make_store() as store, make_store() as copy:
        ids = _fill(store)
        store.export_jsonl(tmp / "a.jsonl")
        _equal(copy.import_jsonl(tmp / "a.jsonl"), list(reversed(store.list_tapes())), "imported ids")
        copy.import_jsonl(tmp / "a.jsonl")
        _equal((copy.count_tapes(), len(copy.list_llm_calls())), (2, 3), "tapes and calls after two imports")
        for tape_id in ids:
            _equal(copy.get_tape_info(tape_id), store.get_tape_info(tape_id), "an imported info")
            _equal(
                copy.get_tape(tape_id, ConformanceTape), store.get_tape(tape_id, ConformanceTape), "a tape"
            )
        _equal(copy.totals("node"), store.totals("node"), "totals")
        copy.export_jsonl(tmp / "b.jsonl")
        _equal((tmp / "b.jsonl").read_text(), (tmp / "a.jsonl").read_text(), "the copy's export")


def check_jsonl_export_of_some_tapes_with_or_without_calls(make_store: StoreFactory, tmp: Path) -> None:
    """``export_jsonl(path, ids)`` writes those tapes and the calls behind their steps only;
    ``llm_calls=False`` no calls; an unknown id is a ``TapeNotFoundError``."""
    with make_store() as store:
        first, second = _fill(store)
        _equal(store.export_jsonl(tmp / "one.jsonl", [second]), 1, "tapes written")
        lines = [json.loads(line) for line in (tmp / "one.jsonl").read_text().splitlines()]
        _equal([line.get("type") for line in lines], [None, "tape", "llm_call", "llm_call"], "line types")
        _equal({line["call"]["prompt"]["id"] for line in lines[2:]}, {"p1", "p2"}, "exported calls")
        store.export_jsonl(tmp / "bare.jsonl", [first], llm_calls=False)
        bare = [json.loads(x).get("type") for x in (tmp / "bare.jsonl").read_text().splitlines()]
        _equal(bare, [None, "tape"], "an export without calls")
        with _raises(TapeNotFoundError):
            store.export_jsonl(tmp / "x.jsonl", ["nope"])
        with _raises(TypeError, "not a string"):
            store.export_jsonl(tmp / "x.jsonl", first)


def check_a_bad_jsonl_line_is_named_and_the_import_stores_nothing(
    make_store: StoreFactory, tmp: Path
) -> None:
    """An import with a bad line (not ours, not a tape, not UTF-8, not JSON, nested too
    deeply, text no database holds) raises ``ValueError`` naming the file and line, and
    stores nothing of the file."""
    with make_store() as source:
        _fill(source)
        source.export_jsonl(tmp / "a.jsonl")
    good = (tmp / "a.jsonl").read_bytes().splitlines(keepends=True)
    cases = {
        b'{"type": "tape", "info": {}}\n': "",
        b'{"type": "tape", "info": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n": "nested too deeply",
        b'{"type": "tape", "caf\xe9": 1}\n': r"not valid UTF-8 \(byte 0xe9 at column 22\)",
        b'{"type": "llm_call", "call": ' + b"9" * 5000 + b"}\n": "not valid JSON",
        b'{"type": "tape", "info": {"id": "x\\udcff", "n_steps": 0}, "steps": []}\n': "lone surrogate",
    }
    with make_store() as store:
        for bad, message in cases.items():
            path = tmp / "bad.jsonl"
            path.write_bytes(b"".join([*good[:3], bad, *good[3:]]))  # after a tape and a call
            with _raises(ValueError, rf"bad.jsonl, line 4: .*{message}"):
                store.import_jsonl(path)
            _equal((store.count_tapes(), store.list_llm_calls()), (0, []), "what a refused import stored")
        (tmp / "notours.jsonl").write_text('{"hello": 1}\n')
        with _raises(ValueError, "line 1: not a tapekit store export"):
            store.import_jsonl(tmp / "notours.jsonl")
        store.import_jsonl(tmp / "a.jsonl")  # the store is fine
        _equal((store.count_tapes(), len(store.list_llm_calls())), (2, 3), "a good import after bad ones")


# ---------------------------------------------------------------------------- errors


def check_a_missing_tape_is_a_clear_key_error(make_store: StoreFactory, tmp: Path) -> None:
    """Every read of a tape that is not stored raises :class:`TapeNotFoundError`, a ``KeyError``
    whose message names the tape."""
    with make_store() as store:
        readers: list[Callable[[str], Any]] = [
            store.get_tape,
            store.get_tape_info,
            store.get_steps,
            store.get_raw_steps,
            store.get_raw_context,
            store.ancestry,
            store.descendants,
        ]
        for read in readers:
            try:
                read("nope")
            except TapeNotFoundError as e:
                assert isinstance(e, KeyError), "TapeNotFoundError must be a KeyError"
                assert str(e).startswith("no tape 'nope' in "), str(e)
            else:
                raise AssertionError(f"{read.__name__}('nope') raised nothing")


def check_bad_arguments_are_refused(make_store: StoreFactory, tmp: Path) -> None:
    """Wrong types and values raise ``TypeError``/``ValueError`` naming the argument."""
    with make_store() as store:
        with _raises(TypeError, "needs a Tape"):
            store.save_tape({"steps": []})  # type: ignore[arg-type]
        with _raises(TypeError, "tape_id"):
            store.save_tape(Tape(), "")
        with _raises(TypeError, "LLMCall"):
            store.save_llm_call("call")  # type: ignore[arg-type]
        with _raises(ValueError, "limit"):
            store.list_tapes(limit=-1)
        with _raises(ValueError, "offset"):
            store.list_tape_infos(offset=-5)
        with _raises(TypeError, "where must be a TapeFilter"):
            store.list_tapes("analyst")  # type: ignore[arg-type]
        with _raises(TypeError, "has_error"):
            TapeFilter(has_error="yes")  # type: ignore[arg-type]
        with _raises(TypeError, "since"):
            TapeFilter(since="yesterday")  # type: ignore[arg-type]
        with _raises(TypeError, "tag"):
            TapeFilter(tag=["a"])  # type: ignore[arg-type]
        with _raises(TypeError, "Step"):
            store.llm_call_for_step("step")  # type: ignore[arg-type]
        with _raises(TypeError, "model"):
            store.list_llm_calls(model=3)  # type: ignore[arg-type]
        _equal(store.list_tapes(), [], "what refused saves stored")


def check_text_no_database_holds_is_refused_at_save(make_store: StoreFactory, tmp: Path) -> None:
    """A lone surrogate (anywhere) or a NUL in a plain text field is refused by the save, naming
    the tape, step and field; nothing of that save is stored and the store goes on. A NUL
    inside a step's text round-trips."""
    with make_store() as store:
        bad: Tape[Any, Any] = Tape(
            steps=[UserStep(content="fine"), UserStep(content="half an emoji \ud83d")]
        ).with_metadata(id="bad")
        with _raises(ValueError, r"tape 'bad': step 1 \(user, id \w+\).* field content .*lone surrogate"):
            store.save_tape(bad)
        good: Tape[Any, Any] = Tape(steps=[UserStep(content="whole emoji \U0001f600")]).with_metadata(
            id="good"
        )
        store.save_tape(good)
        with _raises(ValueError, r"tape 'x': its metadata.error .*lone surrogate"):
            store.save_tape(Tape().with_metadata(id="x", error="\udcff"))
        with _raises(ValueError, r"tag '\\udcff'"):
            store.save_tape(good, tags=["\udcff"])
        with _raises(ValueError, "NUL"):
            store.save_tape(Tape().with_metadata(id="y", author="a\x00b"))
        surrogate_call = _call("p-bad")
        surrogate_call.output.content = "\ud800"
        with _raises(ValueError, r"LLM call 'p-bad': its output .*field content"):
            store.save_llm_call(surrogate_call)
        store.save_llm_call(_call("p-good"))
        _equal((store.list_tapes(), store.get_tape("good")), (["good"], good), "the good rows")
        _equal(store.list_llm_calls(), ["p-good"], "the good calls")
        nul: Tape[Any, Any] = Tape(steps=[UserStep(content="a\x00b")])
        store.save_tape(nul)
        _equal(store.get_tape(nul.metadata.id), nul, "a NUL inside a step")


def check_a_closed_store_refuses_and_flush_commits(make_store: StoreFactory, tmp: Path) -> None:
    """After ``flush`` nothing is pending; ``close`` twice is harmless; a closed store refuses
    saves and reads with ``RuntimeError``."""
    store = make_store()
    store.save_tape(Tape(steps=[UserStep(content="x")]))
    store.flush()
    _equal(store.pending_writes(), 0, "pending writes after flush")
    store.close()
    store.close()
    with _raises(RuntimeError, "closed"):
        store.save_tape(Tape())
    with _raises(RuntimeError, "closed"):
        store.list_tapes()
    with _raises(RuntimeError, "closed"):
        store.flush()


def check_one_store_is_shared_by_threads(make_store: StoreFactory, tmp: Path) -> None:
    """Threads saving their own tapes (and LLM calls) through one store object lose nothing."""
    with make_store() as store:
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                tape: Tape[Any, Any] = Tape(steps=[UserStep(content="0")])
                key = store.save_tape(tape, f"s{n}")
                for i in range(1, 30):
                    step = _made_by(f"agent{n}", "node", f"s{n}-p{i}", str(i))
                    tape = tape.append(step)
                    store.save_tape(tape, key, tags=[f"t{i % 3}"])
                    store.save_llm_call(_call(step.metadata.prompt_id))
                    if i % 10 == 0:
                        store.list_tape_infos(limit=3)  # reads interleaved with writes
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise AssertionError(f"a thread failed: {errors[0]!r}") from errors[0]
        store.flush()
        _equal(sorted(store.list_tapes()), [f"s{n}" for n in range(6)], "the threads' tapes")
        for info in store.list_tape_infos():
            _equal((info.n_steps, info.tags), (30, ["t0", "t1", "t2"]), f"tape {info.id}")
            _equal(_contents(store.get_tape(info.id)), [str(i) for i in range(30)], f"steps of {info.id}")
        _equal(len(store.list_llm_calls()), 6 * 29, "the threads' LLM calls")
        _equal(store.totals("agent")["agent3"]["calls"], 29, "totals of one thread's agent")


def check_long_conversations_read_back_byte_identical(make_store: StoreFactory, tmp: Path) -> None:
    """LLM calls whose prompts hold a whole conversation (shared FrozenMessage dicts, as
    ``view_to_messages`` makes them) read back byte for byte (``model_dump_json``): every turn,
    a fork of the conversation, a trailing instruction, a message object reused after other
    messages, equal messages that serialise differently (key order, ``1`` and ``1.0``), tools,
    a response schema, no messages at all; with token ids that grow from call to call; by
    ``get_llm_call``, listed, and through JSONL."""
    from tapekit.core import FrozenMessage

    system = FrozenMessage({"role": "system", "content": "you add ü 😀"})
    again = FrozenMessage({"role": "user", "content": "again"})  # reused after other messages
    tools: list[dict[str, Any]] = [
        {"type": "function", "function": {"name": "add", "parameters": {"x": 1.0}}}
    ]
    prompts: list[Prompt] = []
    conversation: list[Any] = [system, FrozenMessage({"role": "user", "content": "start"})]
    for turn in range(40):
        prompts.append(Prompt(id=f"main-{turn}", messages=list(conversation), tools=tools))
        if turn % 7 == 3:  # the conversation plus an instruction that is not kept
            hint = FrozenMessage({"role": "user", "content": f"hint {turn}"})
            prompts.append(Prompt(id=f"hint-{turn}", messages=[*conversation, hint, again]))
        request = {"id": f"c{turn}", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        conversation.append(FrozenMessage({"role": "assistant", "content": None, "tool_calls": [request]}))
        conversation.append(FrozenMessage({"role": "tool", "tool_call_id": f"c{turn}", "content": str(turn)}))
        if turn == 20:  # a fork: another continuation of the first 20 turns
            fork = [
                *conversation[:-1],
                FrozenMessage({"role": "tool", "tool_call_id": "c20", "content": "x"}),
            ]
            prompts.append(Prompt(id="fork", messages=[*fork, again], response_schema={"type": "object"}))
    plain = [{"role": "user", "content": "n", "n": 1}, {"content": "n", "role": "user", "n": 1.0}]
    prompts += [
        Prompt(id="plain-a", messages=plain[:1], tools=[]),
        Prompt(id="plain-b", messages=plain[1:] + plain[:1]),
        Prompt(id="again-first", messages=[again, system]),
        Prompt(id="frozen-a", messages=[system, *map(FrozenMessage, plain[:1])]),
        Prompt(id="frozen-b", messages=[system, *map(FrozenMessage, plain[1:])]),
        Prompt(id="empty"),
    ]
    calls = [
        LLMCall(prompt=p, output=LLMOutput(content=f"a {n}"), model="m", timestamp=1000.0 + n)
        for n, p in enumerate(prompts)
    ]
    # token ids that grow from call to call (stored apart, shared): the previous ids, its
    # output and a tool result; every fifth call retokenises the last id before, wide ids
    # (over 16 bits) now and then, log-probabilities on some, and no prompt ids at all
    ids: list[int] = [1, 2, 3]
    previous = 0  # how many prompt ids the call before had
    for n, call in enumerate(calls[:-1]):
        output = [100 + n, 70_000 + n] if n % 6 == 4 else [100 + n]
        if n % 5 == 3:  # the last id of the call before changes: only the one before it is shared
            ids[previous - 1] = 9
        previous = len(ids)
        call.tokens = TokenTrace(
            prompt_ids=list(ids), output_ids=output, output_logprobs=[-0.5] * len(output) if n % 2 else None
        )
        ids = [*ids, *output, 7, 8]
    calls[-1].tokens = TokenTrace(prompt_ids=[], output_ids=[5])
    expected = {c.prompt.id: c.model_dump_json() for c in calls}
    with make_store() as store:
        for call in calls:
            store.save_llm_call(call)
        for call in calls:
            got = store.get_llm_call(call.prompt.id)
            _equal(got.model_dump_json() if got else None, expected[call.prompt.id], f"call {call.prompt.id}")
        _equal(store.list_llm_calls(), [c.prompt.id for c in calls], "the calls, oldest first")
        store.export_jsonl(tmp / "calls.jsonl")
    with make_store() as other:
        other.import_jsonl(tmp / "calls.jsonl")
        for call in calls:
            got = other.get_llm_call(call.prompt.id)
            _equal(
                got.model_dump_json() if got else None, expected[call.prompt.id], f"imported {call.prompt.id}"
            )


def check_the_tool_effect_journal(make_store: StoreFactory, tmp: Path) -> None:
    """The journal of ``once`` tool calls (:mod:`tapekit.effects`): a record is committed when
    written, read back by key and by tape, keeps its first write's time, and a call in doubt is
    resolved once (done, failed or retry), in the order the records were started."""
    store = make_store()
    try:
        store._record_effect("k1", "t1", "pay", {"amount": 5, "note": "ü 😀"}, "started")
        store._record_effect("k2", "t2", "pay", {"amount": 7}, "started")
        first = store.tool_effect("k1")
        if first is None or first.state != "started" or not first.in_doubt:
            raise AssertionError(f"k1 after its intent: expected a call in doubt, got {first!r}")
        _equal(first.arguments, {"amount": 5, "note": "ü 😀"}, "journalled arguments")
        store._record_effect("k1", "t1", "pay", {"amount": 5, "note": "ü 😀"}, "done", {"receipt": [1, 2]})
        done = store.tool_effect("k1")
        if done is None:
            raise AssertionError("k1 is gone from the journal after its outcome")
        _equal((done.state, done.result, done.error), ("done", {"receipt": [1, 2]}, None), "k1 done")
        _equal(done.created, first.created, "the first write's time")
        _equal([e.key for e in store.tool_effects("t1")], ["k1"], "effects of tape t1")
        _equal([e.key for e in store.tool_effects(in_doubt=True)], ["k2"], "effects in doubt")
        _equal(store.tool_effect("nope"), None, "an unknown key")
        resolved = store.resolve_tool_effect("k2", error="declined")
        _equal((resolved.state, resolved.error), ("failed", "declined"), "k2 resolved as failed")
        with _raises(ValueError, "not in doubt"):
            store.resolve_tool_effect("k2", retry=True)
        _equal([e.key for e in store.tool_effects()], ["k1", "k2"], "every effect, oldest first")
    finally:
        store.close()


CHECKS: tuple[Check, ...] = (
    check_a_recorded_session_round_trips,
    check_a_typed_tape_keeps_its_context_step_classes_and_metadata,
    check_a_save_stores_the_tape_as_it_was,
    check_saving_a_growing_tape_writes_only_new_steps,
    check_a_save_under_a_stored_id_must_extend_the_stored_tape,
    check_get_steps_pages_a_long_tape,
    check_tags_are_added_by_saves_and_changed_only_explicitly,
    check_every_filter_of_list_tapes,
    check_ancestry_and_descendants,
    check_every_step_leads_to_its_exact_llm_call,
    check_llm_calls_keep_every_field_and_token_ids,
    check_long_conversations_read_back_byte_identical,
    check_totals_by_agent_node_and_tape,
    check_jsonl_round_trips_exactly_and_imports_once,
    check_jsonl_export_of_some_tapes_with_or_without_calls,
    check_a_bad_jsonl_line_is_named_and_the_import_stores_nothing,
    check_a_missing_tape_is_a_clear_key_error,
    check_bad_arguments_are_refused,
    check_text_no_database_holds_is_refused_at_save,
    check_a_closed_store_refuses_and_flush_commits,
    check_one_store_is_shared_by_threads,
    check_the_tool_effect_journal,
)
"""Every check, in the order :func:`run_conformance` runs them."""


def run_conformance(make_store: StoreFactory, checks: tuple[Check, ...] = CHECKS) -> None:
    """Run ``checks`` (default: all) on stores made by ``make_store``, each in a new scratch
    directory; raise one ``AssertionError`` naming every check that failed, with its error.
    Needs no test runner: ``run_conformance(MyStore)`` in a script is enough."""
    failures: list[str] = []
    for check in checks:
        with tempfile.TemporaryDirectory(prefix="tapekit-conformance-") as scratch:
            try:
                check(make_store, Path(scratch))
            except Exception as e:
                where = "".join(traceback.format_exception(e)[-3:]).strip()
                failures.append(f"{check.__name__}: {type(e).__name__}: {e}\n    {where}")
    if failures:
        raise AssertionError(
            f"{len(failures)} of {len(checks)} store conformance checks failed:\n" + "\n".join(failures)
        )
