"""LLM calls' prompts stored as content-addressed parts (``tapekit/store/_prompts.py``): a
session whose prompts hold the whole conversation grows the SQLite file linearly, not
quadratically; each call queues only its new parts; rows written before (the whole prompt's
JSON in ``llm_calls.prompt``) still read, next to new ones, on SQLite and PostgreSQL; a write
the database refuses leaves no later prompt without its parts.

The byte-identity of long conversations on every store is in the conformance suite
(``check_long_conversations_read_back_byte_identical``, run by ``tests/store/test_store.py``).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tapekit import LLMOutput, Prompt, amain_loop
from tapekit.core import FrozenMessage
from tapekit.llm.base import LLMCall
from tapekit.store import SQLiteStore, TapeStore
from tapekit.store._prompts import PromptEncoder, is_reference
from tapekit.store._writes import call_write
from tapekit.testing.postgres import TempPostgres, postgres_unavailable
from tapekit.testing.react import react_agent, react_start

PG_UNAVAILABLE = postgres_unavailable()


def _react_session(store: TapeStore, turns: int) -> list[Prompt]:
    """A ReAct session of ``turns`` tool turns (each prompt: the whole conversation), stored."""
    agent, env, model = react_agent(turns, record=True)
    start = react_start("You add numbers. " * 20, "add, many times")
    asyncio.run(amain_loop(agent, start, env, store=store).get_final_tape())
    store.flush()
    return model.prompts


def test_a_long_session_grows_the_sqlite_file_linearly(tmp_path: Path) -> None:
    """K turns: the file holds each message once (in a node with two hashes), each call a
    reference of a few hundred bytes. Bound, per turn: three steps (~630 bytes of JSON) with
    their two indexes, two message nodes (~200 bytes of JSON and 3 hashes of 64) with their
    primary-key index, the call row (~230 bytes reference, ~110 output) and its index: ~2.6 KB
    measured, 4 KB allowed (B-tree pages are partly empty); plus one 16 KB page for each of the
    ~17 tables and indexes, 20 allowed. The old form stored every prompt whole: the sum over
    turns of the conversation so far, ~K^2/2 messages (36 MB at K=600 here)."""
    sizes = {}
    for turns in (300, 600):
        path = tmp_path / f"s{turns}.db"
        with SQLiteStore(path) as store:
            seen = _react_session(store, turns)
            old_form = sum(len(p.model_dump_json()) for p in seen)
            for prompt in seen[:: turns // 10]:
                call = store.get_llm_call(prompt.id)
                assert call is not None and call.prompt.model_dump_json() == prompt.model_dump_json()
        sizes[turns] = path.stat().st_size
        assert sizes[turns] <= 4096 * turns + 20 * 16384, (turns, sizes[turns])
    assert sizes[600] * 10 < old_form, (sizes[600], old_form)
    # doubling the session about doubles the file (quadratic growth would make it 4x)
    assert sizes[600] < 2.2 * sizes[300], sizes


def test_each_call_queues_only_its_new_parts() -> None:
    """A prompt that continues the previous one (the same FrozenMessage objects first) brings
    the nodes of its new messages only, and the tools list once; a prompt of plain dicts is
    hashed in full but brings no part that was queued already."""
    encoder = PromptEncoder()
    tools = [{"type": "function", "function": {"name": "add"}}]
    messages: list[Any] = [FrozenMessage({"role": "system", "content": "s"})]
    counts = []
    for turn in range(20):
        messages.append(FrozenMessage({"role": "user", "content": str(turn)}))
        write = call_write(
            LLMCall(prompt=Prompt(messages=list(messages), tools=tools), output=LLMOutput()), encoder
        )
        counts.append(len(write.parts))
        ref = json.loads(write.row[2])
        assert is_reference(write.row[2]) and ref["n"] == len(messages)
    assert counts == [3] + [1] * 19  # system + first user + tools, then one node each
    plain = [dict(m) for m in messages]
    write = call_write(LLMCall(prompt=Prompt(messages=plain, tools=tools), output=LLMOutput()), encoder)
    assert write.parts == [] and json.loads(write.row[2])["messages"] == ref["messages"]


# ---------------------------------------------------------------------------- the old form

_OLD_SCHEMA = (
    "CREATE TABLE llm_calls (prompt_id TEXT PRIMARY KEY, model TEXT NOT NULL, prompt TEXT NOT NULL, "
    "output TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
    "cost REAL NOT NULL, latency_s REAL NOT NULL, timestamp REAL NOT NULL)"
)


def _old_call(n: int) -> LLMCall:
    messages = [{"role": "system", "content": "sys ü"}, {"content": f"q{n}", "role": "user", "x": 1.0}]
    return LLMCall(
        prompt=Prompt(id=f"old{n}", messages=messages, tools=[{"name": "t"}], response_schema={"a": [1]}),
        output=LLMOutput(content=f"a{n}"),
        model="m",
        prompt_tokens=3,
        timestamp=100.0 + n,
    )


def _old_row(call: LLMCall) -> tuple[Any, ...]:
    """The row the store wrote before prompts were stored as parts: the whole prompt JSON."""
    return (
        call.prompt.id,
        call.model,
        call.prompt.model_dump_json(),
        call.output.model_dump_json(),
        call.prompt_tokens,
        call.output_tokens,
        call.cost,
        call.latency_s,
        call.timestamp,
    )


def _check_mixed(store: TapeStore, old: list[LLMCall], export: Path) -> None:
    """The old rows read back exactly, and new calls (sharing their messages) next to them,
    listed and exported (the export holds whole prompts)."""
    new = [_old_call(n) for n in range(10, 13)]
    for call in new:
        call.prompt.id = call.prompt.id.replace("old", "new")
        store.save_llm_call(call)
    for call in old + new:
        got = store.get_llm_call(call.prompt.id)
        assert got is not None and got.model_dump_json() == call.model_dump_json()
    assert store.list_llm_calls() == [c.prompt.id for c in old + new]
    store.export_jsonl(export)
    lines = [json.loads(line) for line in export.read_text(encoding="utf-8").splitlines()[1:]]
    exported = [LLMCall.model_validate(item["call"]) for item in lines if item["type"] == "llm_call"]
    assert [c.model_dump_json() for c in exported] == [c.model_dump_json() for c in old + new]


def test_an_old_sqlite_file_still_reads(tmp_path: Path) -> None:
    """A file whose llm_calls rows hold whole prompts (made with the old schema, before token
    ids and prompt parts): opening it adds the new table and columns, its calls read back
    exactly, and new calls are stored as parts next to them."""
    path = tmp_path / "old.db"
    old = [_old_call(n) for n in range(3)]
    db = sqlite3.connect(path)
    db.execute(_OLD_SCHEMA)
    db.executemany("INSERT INTO llm_calls VALUES (?,?,?,?,?,?,?,?,?)", [_old_row(c) for c in old])
    db.commit()
    db.close()
    with SQLiteStore(path) as store:
        _check_mixed(store, old, tmp_path / "export.jsonl")
    db = sqlite3.connect(path)
    forms = dict(db.execute("SELECT prompt_id, substr(prompt, 1, 7) FROM llm_calls").fetchall())
    db.close()
    assert forms == {
        "old0": '{"id":"',
        "old1": '{"id":"',
        "old2": '{"id":"',
        **dict.fromkeys(["new10", "new11", "new12"], '{"v":2,'),
    }


@pytest.mark.skipif(PG_UNAVAILABLE is not None, reason=f"PostgreSQL backend: {PG_UNAVAILABLE}")
def test_old_rows_still_read_on_postgres(tmp_path: Path) -> None:
    """Rows of the old form in a PostgreSQL database read back exactly, next to new ones."""
    import psycopg

    from tapekit.store import PostgresStore

    old = [_old_call(n) for n in range(3)]
    with TempPostgres() as pg:
        url = pg.create_database()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(_OLD_SCHEMA.replace("REAL", "DOUBLE PRECISION"))
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO llm_calls VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)", [_old_row(c) for c in old]
                )
        with PostgresStore(url) as store:
            _check_mixed(store, old, tmp_path / "export.jsonl")


# ---------------------------------------------------------------------------- a refused write


def test_a_refused_call_leaves_its_parts_for_the_next_prompts(tmp_path: Path) -> None:
    """A call the database refuses (here: a trigger) is reported and lost, but its prompt's
    parts are stored on their own: the next call, which refers to them, reads back."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        store.flush()
        db = sqlite3.connect(path)
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON llm_calls WHEN NEW.prompt_id = 'bad' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        db.commit()
        db.close()
        messages: list[Any] = [FrozenMessage({"role": "user", "content": str(n)}) for n in range(5)]
        store.save_llm_call(LLMCall(prompt=Prompt(id="bad", messages=messages[:4]), output=LLMOutput()))
        with pytest.raises(Exception, match="refused"):
            store.flush()
        following = Prompt(id="good", messages=messages)
        store.save_llm_call(LLMCall(prompt=following, output=LLMOutput()))
        got = store.get_llm_call("good")
        assert got is not None and got.prompt.model_dump_json() == following.model_dump_json()
        assert store.get_llm_call("bad") is None


def test_growing_token_ids_are_stored_once(tmp_path: Path) -> None:
    """A conversation's calls whose prompt ids extend the previous call's store each id once:
    every call adds one node of its new ids (base64 of uint16, ~2.7 bytes an id) and keeps only
    its output ids in ``token_data``; the old form held every call's whole prompt ids."""
    from tapekit.llm.base import TokenTrace

    turns, per_turn = 200, 50
    path = tmp_path / "ids.db"
    ids: list[int] = list(range(100))
    calls = []
    encoder = PromptEncoder()
    with SQLiteStore(path) as store:
        for turn in range(turns):
            output = [1000 + turn] * 10
            trace = TokenTrace(prompt_ids=list(ids), output_ids=output, output_logprobs=[-0.25] * 10)
            call = LLMCall(prompt=Prompt(id=f"p{turn}"), output=LLMOutput(content="x"), tokens=trace)
            calls.append(call)
            write = call_write(call, encoder)
            assert len([p for p in write.parts if p[2].startswith("t2:")]) == 1
            store.save_llm_call(call)
            ids = [*ids, *output, *range(turn, turn + per_turn - len(output))]
        for call in calls:
            got = store.get_llm_call(call.prompt.id)
            assert got is not None and got.tokens == call.tokens
    db = sqlite3.connect(path)
    data = db.execute("SELECT SUM(LENGTH(token_data)) FROM llm_calls").fetchone()[0]
    nodes = db.execute("SELECT SUM(LENGTH(body)) FROM prompt_parts WHERE body LIKE 't2:%'").fetchone()[0]
    db.close()
    assert data == turns * (10 * 2 + 10 * 4)  # output ids (uint16) and log-probs (float32) only
    assert nodes < 3 * len(ids) + 4 * turns  # each prompt id once (base64 of 2 bytes) and a prefix
    whole = sum(len(c.tokens.prompt_ids) * 2 for c in calls if c.tokens)  # the old form's ids
    assert nodes * 20 < whole
