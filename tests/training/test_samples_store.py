"""Token ids in the store: compact columns in SQLite and PostgreSQL, older files migrated."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tapekit import LLMCall, LLMOutput, Prompt
from tapekit.llm.base import TokenTrace
from tapekit.store import open_store
from tapekit.store._tokens import decode_tokens, encode_tokens
from tapekit.testing.postgres import TempPostgres, postgres_unavailable

PG_UNAVAILABLE = postgres_unavailable()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "t.db")
        return
    if PG_UNAVAILABLE is not None:
        pytest.skip(f"PostgreSQL backend: {PG_UNAVAILABLE}")
    with TempPostgres() as pg:
        yield pg.create_database()


def _call(pid: str, tokens: TokenTrace | None) -> LLMCall:
    return LLMCall(
        prompt=Prompt(id=pid, messages=[{"role": "user", "content": "hi"}]),
        output=LLMOutput(content="hello"),
        model="m",
        tokens=tokens,
    )


TRACE = TokenTrace(
    prompt_ids=[1, 2, 49151, 0],
    output_ids=[7, 2],
    output_logprobs=[-0.25, -1.5],
    tokenizer="tk1-49152-abc",
    policy_version="v3",
    finish_reason="stop",
)


def test_codec_round_trips_and_is_compact() -> None:
    meta, data = encode_tokens(TRACE)
    assert data is not None and len(data) == 2 * 6 + 4 * 2  # uint16 ids, float32 logprobs
    assert decode_tokens(meta, data) == TRACE
    big = TRACE.model_copy(update={"prompt_ids": [1, 65536, 3, 0], "output_ids": [-1, 2]})
    meta, data = encode_tokens(big)
    assert data is not None and len(data) == 4 * 6 + 4 * 2  # an id over 65,535: int32 ids
    assert decode_tokens(meta, data) == big
    no_logprobs = TRACE.model_copy(update={"output_logprobs": None})
    assert decode_tokens(*encode_tokens(no_logprobs)) == no_logprobs
    assert encode_tokens(None) == (None, None) and decode_tokens(None, None) is None


def test_codec_reads_rows_written_before_the_id_width_was_recorded() -> None:
    from array import array

    meta = (
        '{"n_prompt":4,"n_output":2,"logprobs":true,"tokenizer":"tk1-49152-abc",'
        '"policy_version":"v3","finish_reason":"stop"}'
    )
    data = array("i", [1, 2, 49151, 0, 7, 2]).tobytes() + array("f", [-0.25, -1.5]).tobytes()
    assert sys.byteorder == "little"  # the stored form is little-endian
    assert decode_tokens(meta, data) == TRACE
    with pytest.raises(ValueError, match="id_bytes=3"):
        decode_tokens(meta.replace('"n_output":2,', '"n_output":2,"id_bytes":3,'), data)


def test_stored_calls_keep_their_token_ids(store_url: str) -> None:
    with open_store(store_url) as store:
        store.save_llm_call(_call("with", TRACE))
        store.save_llm_call(_call("without", None))
        store.flush()
        assert store.get_llm_call("with").tokens == TRACE  # type: ignore[union-attr]
        assert store.get_llm_call("without").tokens is None  # type: ignore[union-attr]


def test_a_file_made_before_token_ids_opens_and_gains_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE llm_calls (prompt_id TEXT PRIMARY KEY, model TEXT NOT NULL, prompt TEXT NOT NULL, "
        "output TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
        "cost DOUBLE PRECISION NOT NULL, latency_s DOUBLE PRECISION NOT NULL, "
        "timestamp DOUBLE PRECISION NOT NULL)"
    )
    old = _call("old", None)
    db.execute(
        "INSERT INTO llm_calls VALUES (?,?,?,?,?,?,?,?,?)",
        ("old", "m", old.prompt.model_dump_json(), old.output.model_dump_json(), 1, 1, 0.0, 0.0, 1.0),
    )
    db.commit()
    db.close()
    with open_store(str(path)) as store:
        assert store.get_llm_call("old").output.content == "hello"  # type: ignore[union-attr]
        store.save_llm_call(_call("new", TRACE))
        store.flush()
        assert store.get_llm_call("new").tokens == TRACE  # type: ignore[union-attr]
