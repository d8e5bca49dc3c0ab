"""The conformance checks of the errors: a missing tape, bad arguments, and text no database
can hold, each refused with an error that names what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tapekit.core import Tape
from tapekit.dialog import UserStep
from tapekit.store.base import TapeFilter, TapeNotFoundError
from tapekit.testing.store_conformance._support import StoreFactory, equal, llm_call, raises


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
        with raises(TypeError, "needs a Tape"):
            store.save_tape({"steps": []})  # type: ignore[arg-type]
        with raises(TypeError, "tape_id"):
            store.save_tape(Tape(), "")
        with raises(TypeError, "LLMCall"):
            store.save_llm_call("call")  # type: ignore[arg-type]
        with raises(ValueError, "limit"):
            store.list_tapes(limit=-1)
        with raises(ValueError, "offset"):
            store.list_tape_infos(offset=-5)
        with raises(TypeError, "where must be a TapeFilter"):
            store.list_tapes("analyst")  # type: ignore[arg-type]
        with raises(TypeError, "has_error"):
            TapeFilter(has_error="yes")  # type: ignore[arg-type]
        with raises(TypeError, "since"):
            TapeFilter(since="yesterday")  # type: ignore[arg-type]
        with raises(TypeError, "tag"):
            TapeFilter(tag=["a"])  # type: ignore[arg-type]
        with raises(TypeError, "Step"):
            store.llm_call_for_step("step")  # type: ignore[arg-type]
        with raises(TypeError, "model"):
            store.list_llm_calls(model=3)  # type: ignore[arg-type]
        equal(store.list_tapes(), [], "what refused saves stored")


def check_text_no_database_holds_is_refused_at_save(make_store: StoreFactory, tmp: Path) -> None:
    """A lone surrogate (anywhere) or a NUL in a plain text field is refused by the save, naming
    the tape, step and field; nothing of that save is stored and the store goes on. A NUL
    inside a step's text round-trips."""
    with make_store() as store:
        bad: Tape[Any, Any] = Tape(
            steps=[UserStep(content="fine"), UserStep(content="half an emoji \ud83d")]
        ).with_metadata(id="bad")
        with raises(ValueError, r"tape 'bad': step 1 \(user, id \w+\).* field content .*lone surrogate"):
            store.save_tape(bad)
        good: Tape[Any, Any] = Tape(steps=[UserStep(content="whole emoji \U0001f600")]).with_metadata(
            id="good"
        )
        store.save_tape(good)
        with raises(ValueError, r"tape 'x': its metadata.error .*lone surrogate"):
            store.save_tape(Tape().with_metadata(id="x", error="\udcff"))
        with raises(ValueError, r"tag '\\udcff'"):
            store.save_tape(good, tags=["\udcff"])
        with raises(ValueError, "NUL"):
            store.save_tape(Tape().with_metadata(id="y", author="a\x00b"))
        surrogate_call = llm_call("p-bad")
        surrogate_call.output.content = "\ud800"
        with raises(ValueError, r"LLM call 'p-bad': its output .*field content"):
            store.save_llm_call(surrogate_call)
        store.save_llm_call(llm_call("p-good"))
        equal((store.list_tapes(), store.get_tape("good")), (["good"], good), "the good rows")
        equal(store.list_llm_calls(), ["p-good"], "the good calls")
        nul: Tape[Any, Any] = Tape(steps=[UserStep(content="a\x00b")])
        store.save_tape(nul)
        equal(store.get_tape(nul.metadata.id), nul, "a NUL inside a step")
