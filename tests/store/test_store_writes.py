"""What a save queues: rows checked and serialised on the caller's thread, holding no models.

The writer below waits 30 s before it commits (``flush_interval_s``), so every check runs while
the write is still queued; ``flush`` then commits it.
"""

from __future__ import annotations

import gc
import sqlite3
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tapekit import AssistantThought, LLMCall, Tape, UserStep
from tapekit._sqlite import connect
from tapekit.core import LLMOutput, Prompt
from tapekit.llm.base import TokenTrace
from tapekit.store import SQLiteStore

TRACE = TokenTrace(prompt_ids=[1, 2, 3], output_ids=[4], output_logprobs=[-0.5], tokenizer="tk")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "t.db", batch_size=10_000, flush_interval_s=30.0) as s:
        yield s


def _call(pid: str, tokens: TokenTrace | None = TRACE) -> LLMCall:
    return LLMCall(
        prompt=Prompt(id=pid, messages=[{"role": "user", "content": "hi"}]),
        output=LLMOutput(content="hello"),
        model="m",
        tokens=tokens,
    )


def test_a_queued_write_holds_no_llm_call_nor_step(store: SQLiteStore) -> None:
    call = _call("p1")
    step = AssistantThought(content="thinking")
    tape = Tape(steps=[UserStep(content="q"), step])
    alive = [weakref.ref(call), weakref.ref(step)]
    store.save_llm_call(call)
    store.save_tape(tape, "t1")
    assert store.pending_writes() == 2  # still queued: the writer waits for 30 s
    del call, step, tape
    gc.collect()
    assert [ref() for ref in alive] == [None, None]  # freed although their writes are queued
    stored = store.get_llm_call("p1")  # a read flushes the queue
    assert stored is not None and stored.tokens == TRACE and stored.output.content == "hello"
    assert store.get_tape("t1").steps[1].content == "thinking"  # type: ignore[attr-defined]


def test_a_save_stores_the_tape_as_it_was_when_saved(store: SQLiteStore) -> None:
    tape = Tape(steps=[UserStep(content="q")])
    store.save_tape(tape, "t1")
    tape.metadata.error = "set after the save"
    tape.steps[0].metadata.agent = "changed after the save"
    assert store.pending_writes() == 1
    info = store.get_tape_info("t1")
    assert info.error is None
    assert store.get_tape("t1").steps[0].metadata.agent == ""


@pytest.mark.parametrize("bad_id", [2**31, -(2**31) - 1, 2**40])
def test_token_ids_outside_int32_are_refused_at_save_naming_the_call(store: SQLiteStore, bad_id: int) -> None:
    trace = TRACE.model_copy(update={"output_ids": [bad_id]})
    with pytest.raises(ValueError, match=r"LLM call 'p-bad'.*token ids.*int32"):
        store.save_llm_call(_call("p-bad", trace))
    assert store.pending_writes() == 0  # nothing of it was queued
    store.save_llm_call(_call("p-good"))
    store.flush()  # no StoreWriteError: the bad call never reached the writer
    assert store.get_llm_call("p-bad") is None
    assert store.get_llm_call("p-good") is not None


def test_the_widest_int32_ids_round_trip(store: SQLiteStore) -> None:
    trace = TRACE.model_copy(update={"prompt_ids": [2**31 - 1, -(2**31), 0], "output_ids": [65_536]})
    store.save_llm_call(_call("p-wide", trace))
    stored = store.get_llm_call("p-wide")
    assert stored is not None and stored.tokens == trace


def test_a_full_batch_is_committed_without_waiting_for_the_interval(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "t.db", batch_size=10, flush_interval_s=30.0) as store:
        for i in range(10):
            store.save_tape(Tape(steps=[UserStep(content=str(i))]), f"t{i}")
            if i == 0:
                time.sleep(0.2)  # the writer has the first write and waits for more
        deadline = time.monotonic() + 10
        while store.pending_writes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.pending_writes() == 0  # committed long before the 30 s interval ended


def test_a_flush_does_not_wait_for_the_batch_to_fill(store: SQLiteStore) -> None:
    store.save_tape(Tape(steps=[UserStep(content="q")]), "t1")
    started = time.monotonic()
    store.flush()
    assert time.monotonic() - started < 5  # the writer waits up to 30 s for more writes
    assert store.pending_writes() == 0 and store.count_tapes() == 1


def test_a_new_file_has_16k_pages_and_an_older_file_keeps_its_own(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "new.db") as store:
        store.save_tape(Tape(steps=[UserStep(content="q")]), "t1")
    old = tmp_path / "old.db"
    db = sqlite3.connect(old)
    db.execute("PRAGMA page_size=4096")
    db.execute("CREATE TABLE unrelated (x)")
    db.commit()
    db.close()
    with SQLiteStore(old) as store:
        store.save_tape(Tape(steps=[UserStep(content="q")]), "t1")
        writer = store._writer_connect()
        assert writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 4096  # still ~16 MB
        writer.close()
        assert store.get_tape("t1").steps[0].content == "q"  # type: ignore[attr-defined]
    sizes = {
        p.name: sqlite3.connect(p).execute("PRAGMA page_size").fetchone()[0]
        for p in (tmp_path / "new.db", old)
    }
    assert sizes == {"new.db": 16384, "old.db": 4096}


def test_connect_refuses_a_page_size_sqlite_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        connect(str(tmp_path / "x.db"), 3000)
