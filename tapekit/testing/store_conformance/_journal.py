"""The conformance check of the tool-effect journal (:mod:`tapekit.effects`): records committed
when written, read back by key and tape, and a call in doubt resolved once.
"""

from __future__ import annotations

from pathlib import Path

from tapekit.testing.store_conformance._support import StoreFactory, equal, raises


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
        equal(first.arguments, {"amount": 5, "note": "ü 😀"}, "journalled arguments")
        store._record_effect("k1", "t1", "pay", {"amount": 5, "note": "ü 😀"}, "done", {"receipt": [1, 2]})
        done = store.tool_effect("k1")
        if done is None:
            raise AssertionError("k1 is gone from the journal after its outcome")
        equal((done.state, done.result, done.error), ("done", {"receipt": [1, 2]}, None), "k1 done")
        equal(done.created, first.created, "the first write's time")
        equal([e.key for e in store.tool_effects("t1")], ["k1"], "effects of tape t1")
        equal([e.key for e in store.tool_effects(in_doubt=True)], ["k2"], "effects in doubt")
        equal(store.tool_effect("nope"), None, "an unknown key")
        resolved = store.resolve_tool_effect("k2", error="declined")
        equal((resolved.state, resolved.error), ("failed", "declined"), "k2 resolved as failed")
        with raises(ValueError, "not in doubt"):
            store.resolve_tool_effect("k2", retry=True)
        equal([e.key for e in store.tool_effects()], ["k1", "k2"], "every effect, oldest first")
    finally:
        store.close()
