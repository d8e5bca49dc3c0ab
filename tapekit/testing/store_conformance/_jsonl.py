"""The conformance checks of JSONL export and import: a round trip, subsets of tapes with or
without their calls, and a bad line that is named and stores nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from tapekit.store.base import TapeNotFoundError
from tapekit.testing.store_conformance._support import ConformanceTape, StoreFactory, equal, fill, raises


def check_jsonl_round_trips_exactly_and_imports_once(make_store: StoreFactory, tmp: Path) -> None:
    """An export imported into an empty store gives the same tapes, infos, calls and totals;
    importing twice duplicates nothing; the copy's export is byte-identical."""
    with make_store() as store, make_store() as copy:
        ids = fill(store)
        store.export_jsonl(tmp / "a.jsonl")
        equal(copy.import_jsonl(tmp / "a.jsonl"), list(reversed(store.list_tapes())), "imported ids")
        copy.import_jsonl(tmp / "a.jsonl")
        equal((copy.count_tapes(), len(copy.list_llm_calls())), (2, 3), "tapes and calls after two imports")
        for tape_id in ids:
            equal(copy.get_tape_info(tape_id), store.get_tape_info(tape_id), "an imported info")
            equal(copy.get_tape(tape_id, ConformanceTape), store.get_tape(tape_id, ConformanceTape), "a tape")
        equal(copy.totals("node"), store.totals("node"), "totals")
        copy.export_jsonl(tmp / "b.jsonl")
        equal((tmp / "b.jsonl").read_text(), (tmp / "a.jsonl").read_text(), "the copy's export")


def check_jsonl_export_of_some_tapes_with_or_without_calls(make_store: StoreFactory, tmp: Path) -> None:
    """``export_jsonl(path, ids)`` writes those tapes and the calls behind their steps only;
    ``llm_calls=False`` no calls; an unknown id is a ``TapeNotFoundError``."""
    with make_store() as store:
        first, second = fill(store)
        equal(store.export_jsonl(tmp / "one.jsonl", [second]), 1, "tapes written")
        lines = [json.loads(line) for line in (tmp / "one.jsonl").read_text().splitlines()]
        equal([line.get("type") for line in lines], [None, "tape", "llm_call", "llm_call"], "line types")
        equal({line["call"]["prompt"]["id"] for line in lines[2:]}, {"p1", "p2"}, "exported calls")
        store.export_jsonl(tmp / "bare.jsonl", [first], llm_calls=False)
        bare = [json.loads(x).get("type") for x in (tmp / "bare.jsonl").read_text().splitlines()]
        equal(bare, [None, "tape"], "an export without calls")
        with raises(TapeNotFoundError):
            store.export_jsonl(tmp / "x.jsonl", ["nope"])
        with raises(TypeError, "not a string"):
            store.export_jsonl(tmp / "x.jsonl", first)


def check_a_bad_jsonl_line_is_named_and_the_import_stores_nothing(
    make_store: StoreFactory, tmp: Path
) -> None:
    """An import with a bad line (not ours, not a tape, not UTF-8, not JSON, nested too
    deeply, text no database holds) raises ``ValueError`` naming the file and line, and
    stores nothing of the file."""
    with make_store() as source:
        fill(source)
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
            with raises(ValueError, rf"bad.jsonl, line 4: .*{message}"):
                store.import_jsonl(path)
            equal((store.count_tapes(), store.list_llm_calls()), (0, []), "what a refused import stored")
        (tmp / "notours.jsonl").write_text('{"hello": 1}\n')
        with raises(ValueError, "line 1: not a tapekit store export"):
            store.import_jsonl(tmp / "notours.jsonl")
        store.import_jsonl(tmp / "a.jsonl")  # the store is fine
        equal((store.count_tapes(), len(store.list_llm_calls())), (2, 3), "a good import after bad ones")
