"""The conformance checks of saving and reading tapes: a recorded session, typed steps and
context, every metadata field, a save as a snapshot, a growing tape, a save under a stored id
that must extend the stored tape, and paging a long tape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapekit.core import Tape
from tapekit.dialog import UserStep
from tapekit.testing.store_conformance._support import (
    ConformanceBrief,
    ConformanceNote,
    ConformanceTape,
    StoreFactory,
    contents,
    equal,
    raises,
    recorded_session,
)


def check_a_recorded_session_round_trips(make_store: StoreFactory, tmp: Path) -> None:
    """A session recorded by ``main_loop(..., store=)`` reads back step for step: classes,
    metadata, tags, and the start tape it continues."""
    with make_store() as store:
        final, key = recorded_session(store)
        loaded = store.get_tape(key)
        equal([type(s) for s in loaded.steps], [type(s) for s in final.steps], "step classes")
        equal(list(loaded.steps), list(final.steps), "steps")
        equal([s.metadata for s in loaded.steps], [s.metadata for s in final.steps], "step metadata")
        equal(store.list_tapes(), [key], "stored tapes")
        equal(store.get_tape_info(key).tags, ["demo"], "tags")
        # the stored session continues its start tape, not the loop's short-lived per-turn tapes
        meta = loaded.metadata
        equal((meta.id, meta.author, meta.parent_id), (key, final.metadata.author, None), "tape metadata")
        equal(store.ancestry(key), [], "ancestry of a session started from a fresh tape")
        equal(meta.n_added_steps, len(final) - 1, "n_added_steps")


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
        equal(loaded.context, ConformanceBrief(topic="vulcan", budget=3), "context")
        equal(list(loaded.steps), list(tape.steps), "steps")
        assert isinstance(loaded.steps[1], ConformanceNote), "the typed step's class is lost"
        equal(loaded.metadata, tape.metadata, "metadata")
        info = store.get_tape_info(key)
        equal(info.metadata, tape.metadata, "TapeInfo.metadata")
        equal(
            (info.n_steps, info.author, info.error, info.result, info.parent_id, info.other),
            (2, "me", "boom", {"answer": [1, 2]}, "p", tape.metadata.other),
            "TapeInfo fields",
        )
        assert info.created <= info.updated, f"created {info.created} after updated {info.updated}"
        plain = store.save_tape(Tape(steps=[UserStep(content="plain")]))
        equal(
            {i.id: i.other for i in store.list_tape_infos()}, {key: tape.metadata.other, plain: {}}, "other"
        )
        grown = tape.append(UserStep(content="more")).with_metadata(id=key, other={"note": "changed"})
        store.save_tape(grown)
        equal(store.get_tape(key).metadata.other, {"note": "changed"}, "metadata.other after a later save")
        with raises(ValueError, r"its metadata\.other cannot be stored as JSON"):
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
        equal(contents(first), ["before"], "steps after the saved step object changed")
        equal(first.metadata.other, {"k": [1]}, "metadata.other after the saved dict changed")
        first.metadata.other["k"].append(3)
        first.steps[0].content = "changed by a reader"  # type: ignore[attr-defined]
        store.get_tape_info(key).other["k"].append(4)
        again = store.get_tape(key)
        equal((contents(again), again.metadata.other), (["before"], {"k": [1]}), "a second read")


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
        equal(contents(loaded), [str(i) for i in range(50)], "contents")
        equal([s.metadata.id for s in loaded.steps], [s.metadata.id for s in tape.steps], "step ids")
        equal(store.get_tape_info(key).n_steps, 50, "n_steps")
        with raises(ValueError, "stored steps"):
            store.save_tape(Tape(steps=[UserStep(content="short")]), key)
        other = store.save_tape(Tape(steps=[UserStep(content="x")]), "elsewhere")  # an explicit id
        equal((other, contents(store.get_tape("elsewhere"))), ("elsewhere", ["x"]), "a save under tape_id")


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
            with raises(ValueError, rf"tape {key} has 2 stored steps .*step {index} differs"):
                store.save_tape(other.with_metadata(author="second"), key, tags=["refused"])
            info = store.get_tape_info(key)
            equal(
                (contents(store.get_tape(key)), info.n_steps, info.author, info.tags),
                (["a", "b"], 2, "first", ["kept"]),
                f"the stored tape after a refused save ({what})",
            )
        equal(
            [s.metadata.id for s in store.get_tape(key).steps],
            [a.metadata.id, b.metadata.id],
            "stored step ids",
        )
        store.save_tape(tape.with_metadata(author="again"), key, tags=["again"])  # the same steps again
        equal(store.get_tape_info(key).author, "again", "the metadata of the tape saved again")
        store.save_tape(store.get_tape(key), key)  # as read back
        grown = store.get_tape(key).append(UserStep(content="c"))
        store.save_tape(grown, key)
        store.save_tape(grown.append(UserStep(content="d")), key)
        info = store.get_tape_info(key)
        equal(
            (contents(store.get_tape(key)), info.author, info.tags),
            (["a", "b", "c", "d"], grown.metadata.author, ["again", "kept"]),
            "the tape saved again and extended",
        )
        with raises(ValueError, rf"tape {key} has 4 stored steps .*step 2 differs"):
            store.save_tape(tape.append(UserStep(content="C")).append(UserStep(content="d")), key)
        store.export_jsonl(tmp / "extends.jsonl")
    with make_store() as second:
        second.save_tape(Tape(steps=[a, UserStep(content="not b")]), key)
        with raises(ValueError, rf"extends.jsonl, line 2: tape {key} has 2 stored steps .*step 1 differs"):
            second.import_jsonl(tmp / "extends.jsonl")
        equal(contents(second.get_tape(key)), ["a", "not b"], "the stored tape after a refused import")


def check_get_steps_pages_a_long_tape(make_store: StoreFactory, tmp: Path) -> None:
    """``get_steps`` and ``get_raw_steps`` load a slice with Python's slice rules;
    ``get_raw_context`` gives the stored context's JSON."""
    tape = ConformanceTape(
        context=ConformanceBrief(topic="t", budget=2),
        steps=[ConformanceNote(text=str(i)) for i in range(250)],
    )
    with make_store() as store:
        key = store.save_tape(tape)
        equal([s.text for s in store.get_steps(key, 0, 100)], [str(i) for i in range(100)], "steps 0:100")  # type: ignore[attr-defined]
        equal(store.get_steps(key, 200), list(tape.steps[200:]), "steps 200:")
        equal(store.get_steps(key, -3), list(tape.steps[-3:]), "steps -3:")
        equal(store.get_steps(key, 240, 1000), list(tape.steps[240:]), "steps 240:1000")
        equal((store.get_steps(key, 300, 400), store.get_steps(key, 5, 5)), ([], []), "empty slices")
        raw = store.get_raw_steps(key, 10, 12)
        equal([r["text"] for r in raw], ["10", "11"], "raw steps")
        equal(raw[0]["kind"], "tapekit_conformance_note", "a raw step's kind")
        equal(store.get_raw_context(key), {"topic": "t", "budget": 2}, "raw context")
        equal(store.get_raw_context(store.save_tape(Tape())), None, "the raw context of a tape without one")
        with raises(TypeError, "start"):
            store.get_steps(key, "0")  # type: ignore[arg-type]
