"""The conformance checks of a store object's life: ``flush`` commits, a closed store refuses,
and one store shared by threads loses nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tapekit.core import Tape
from tapekit.dialog import UserStep
from tapekit.testing.store_conformance._support import (
    StoreFactory,
    contents,
    equal,
    llm_call,
    made_by,
    raises,
)


def check_a_closed_store_refuses_and_flush_commits(make_store: StoreFactory, tmp: Path) -> None:
    """After ``flush`` nothing is pending; ``close`` twice is harmless; a closed store refuses
    saves and reads with ``RuntimeError``."""
    store = make_store()
    store.save_tape(Tape(steps=[UserStep(content="x")]))
    store.flush()
    equal(store.pending_writes(), 0, "pending writes after flush")
    store.close()
    store.close()
    with raises(RuntimeError, "closed"):
        store.save_tape(Tape())
    with raises(RuntimeError, "closed"):
        store.list_tapes()
    with raises(RuntimeError, "closed"):
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
                    step = made_by(f"agent{n}", "node", f"s{n}-p{i}", str(i))
                    tape = tape.append(step)
                    store.save_tape(tape, key, tags=[f"t{i % 3}"])
                    store.save_llm_call(llm_call(step.metadata.prompt_id))
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
        equal(sorted(store.list_tapes()), [f"s{n}" for n in range(6)], "the threads' tapes")
        for info in store.list_tape_infos():
            equal((info.n_steps, info.tags), (30, ["t0", "t1", "t2"]), f"tape {info.id}")
            equal(contents(store.get_tape(info.id)), [str(i) for i in range(30)], f"steps of {info.id}")
        equal(len(store.list_llm_calls()), 6 * 29, "the threads' LLM calls")
        equal(store.totals("agent")["agent3"]["calls"], 29, "totals of one thread's agent")
