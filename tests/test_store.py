"""The tape store's conformance suite: every test runs on SQLite and on PostgreSQL.

The PostgreSQL runs use a throwaway cluster that the session starts from the server binaries on
this machine (``scripts/install-system.sh`` installs them), with a fresh database per test; they
skip, with the reason, where the binaries or psycopg are missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from tapekit import LLMCall, Tape, Thought, UserStep, main_loop
from tapekit._diff import signatures
from tapekit.core import LLMOutput, Prompt
from tapekit.store import (
    PostgresStore,
    SQLiteStore,
    TapeInfo,
    TapeNotFoundError,
    TapeStore,
    open_store,
)
from tapekit.store._pgtemp import TempPostgres, postgres_unavailable
from tapekit.testing.analyst import ENVIRONMENT, make_analyst, start_tape

ROOT = Path(__file__).resolve().parent.parent
PG_UNAVAILABLE = postgres_unavailable()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[TempPostgres]:
    """One throwaway PostgreSQL cluster for the session."""
    if PG_UNAVAILABLE is not None:
        pytest.skip(f"PostgreSQL backend: {PG_UNAVAILABLE}")
    with TempPostgres() as pg:
        yield pg


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a fresh, empty store lives: an SQLite path or a new PostgreSQL database's URL."""
    if request.param == "sqlite":
        yield str(tmp_path / "t.db")
        return
    pg: TempPostgres = request.getfixturevalue("pg_cluster")
    url = pg.create_database()
    yield url
    pg.drop_database(url.split("/")[3].split("?")[0])


@pytest.fixture
def store(store_url: str) -> Iterator[TapeStore]:
    with open_store(store_url) as s:
        yield s


class Note(Thought):
    """A typed step for the round-trip tests."""

    kind: Literal["store_test_note"] = "store_test_note"
    text: str
    score: float = 0.0


class Brief(BaseModel):
    """A typed tape context."""

    topic: str
    budget: int


class NoteTape(Tape[Brief, Note | UserStep]):
    """A typed tape: context and step classes survive the store."""


def made_by(agent: str, node: str, prompt_id: str, content: str = "x") -> UserStep:
    step = UserStep(content=content)
    step.metadata.agent, step.metadata.node, step.metadata.prompt_id = agent, node, prompt_id
    return step


def call(prompt_id: str, prompt_tokens: int = 10, output_tokens: int = 2, cost: float = 0.5) -> LLMCall:
    return LLMCall(
        prompt=Prompt(id=prompt_id, messages=[{"role": "user", "content": f"q {prompt_id}"}]),
        output=LLMOutput(content=f"a {prompt_id}"),
        model="m",
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cost=cost,
    )


def run_recorded(store: TapeStore, watcher: TapeStore | None = None) -> tuple[Tape[Any, Any], str]:
    """Run the analyst demo, recording it; ``watcher`` (another connection) checks that every
    step is stored as soon as it is made."""
    start = start_tape()
    record = store.recorder(start, tags=["demo"])
    final = start
    made = len(start)
    for event in main_loop(make_analyst(), start, ENVIRONMENT):
        record(event)
        if event.tape is not None:
            final = event.tape
            made = len(event.tape)
        elif event.step is not None:
            made += 1
        if watcher is not None:
            store.flush()
            assert watcher.get_tape_info(start.metadata.id).n_steps == made
    return final, start.metadata.id


# ---------------------------------------------------------------------------- round trips


def test_a_recorded_session_round_trips_step_by_step(store: TapeStore, store_url: str) -> None:
    with open_store(store_url) as watcher:
        final, key = run_recorded(store, watcher)
    loaded = store.get_tape(key)
    assert signatures(loaded.steps) == signatures(final.steps)
    assert [type(s) for s in loaded.steps] == [type(s) for s in final.steps]
    assert [s.metadata for s in loaded.steps] == [s.metadata for s in final.steps]
    assert loaded.metadata.id == key and loaded.metadata.author == final.metadata.author
    assert store.list_tapes() == [key] and store.get_tape_info(key).tags == ["demo"]
    # the stored session continues its start tape, not the loop's short-lived per-turn tapes
    assert loaded.metadata.parent_id is None and store.ancestry(key) == []
    assert loaded.metadata.n_added_steps == len(final) - 1


def test_metadata_other_is_stored_listed_updated_and_exported(store: TapeStore, tmp_path: Path) -> None:
    """``TapeMetadata.other`` (e.g. the fields of a TapeAgents metadata subclass) is kept: read
    back, listed, replaced by a later save, carried by a JSONL export; a value that is not JSON is
    refused, naming the field."""
    other = {"tapeagents": {"task_id": "t-1", "level": 2, "other": {"timers": [1.5]}}, "note": "é"}
    tape = Tape(steps=[UserStep(content="hi")]).with_metadata(other=other)
    key = store.save_tape(tape)
    plain = store.save_tape(Tape(steps=[UserStep(content="plain")]))
    assert store.get_tape(key).metadata == tape.metadata
    assert store.get_tape_info(key).other == other and store.get_tape_info(plain).other == {}
    assert {i.id: i.other for i in store.list_tape_infos()} == {key: other, plain: {}}
    store.export_jsonl(tmp_path / "out.jsonl")
    with SQLiteStore(tmp_path / "copy.db") as copy:
        copy.import_jsonl(tmp_path / "out.jsonl")
        assert copy.get_tape(key).metadata.other == other
    grown = tape.append(UserStep(content="more")).with_metadata(id=key, other={"note": "changed"})
    store.save_tape(grown)
    assert store.get_tape(key).metadata.other == {"note": "changed"}
    with pytest.raises(ValueError, match=r"its metadata\.other cannot be stored as JSON"):
        store.save_tape(Tape().with_metadata(other={"when": object()}))


def test_a_typed_tape_keeps_its_context_step_classes_and_metadata(store: TapeStore) -> None:
    tape = NoteTape(
        context=Brief(topic="vulcan", budget=3),
        steps=[UserStep(content="hi"), Note(text="plan", score=0.25)],
    ).with_metadata(author="me", error="boom", result={"answer": [1, 2]}, n_added_steps=1, parent_id="p")
    key = store.save_tape(tape)
    loaded = store.get_tape(key, NoteTape)
    assert isinstance(loaded, NoteTape) and loaded.context == Brief(topic="vulcan", budget=3)
    assert loaded.steps == tape.steps and isinstance(loaded.steps[1], Note)
    assert loaded.metadata == tape.metadata
    info = store.get_tape_info(key)
    assert (info.n_steps, info.author, info.error, info.result, info.parent_id) == (
        2,
        "me",
        "boom",
        {"answer": [1, 2]},
        "p",
    )
    assert info.created <= info.updated


def test_every_step_leads_to_its_exact_llm_call(store: TapeStore) -> None:
    final, _ = run_recorded(store)
    for step in final.steps:
        found = store.llm_call_for_step(step)
        if step.metadata.agent:
            assert found is not None and found.prompt.id == step.metadata.prompt_id
        else:
            assert found is None
    assert len(store.list_llm_calls()) == 8 and store.list_llm_calls(model="nope") == []
    plan = final.steps[1]
    found = store.llm_call_for_step(plan)
    assert found is not None and found.output.content == plan.content  # type: ignore[attr-defined]
    assert found.prompt.messages[-1]["content"].startswith("Write a numbered plan")
    assert store.get_llm_call("no such prompt") is None


def test_totals_by_agent_node_and_tape(store: TapeStore) -> None:
    steps = [made_by("a", "n1", "p0"), made_by("a", "n1", "p0"), made_by("a/b", "n2", "p1")]
    tape = Tape(steps=[UserStep(content="q"), *steps])
    other = Tape(steps=[made_by("a", "n3", "p2")])
    store.save_tape(tape)
    store.save_tape(other)
    for pid, (pt, ot) in {"p0": (10, 2), "p1": (5, 1), "p2": (7, 3)}.items():
        store.save_llm_call(call(pid, pt, ot))
    assert store.totals("agent", tape.metadata.id) == {
        "a": {"calls": 1, "prompt_tokens": 10, "output_tokens": 2, "cost": 0.5},
        "a/b": {"calls": 1, "prompt_tokens": 5, "output_tokens": 1, "cost": 0.5},
    }
    assert store.totals("agent")["a"] == {"calls": 2, "prompt_tokens": 17, "output_tokens": 5, "cost": 1.0}
    assert set(store.totals("node")) == {"a.n1", "a/b.n2", "a.n3"}
    by_tape = store.totals("tape")
    assert by_tape[tape.metadata.id]["prompt_tokens"] == 15 and by_tape[other.metadata.id]["calls"] == 1
    # a continuation holds the same steps: its tape counts them, the agents do not count them twice
    more = store.save_tape(tape.with_new_steps([UserStep(content="more")]))
    assert store.totals("tape")[more] == store.totals("tape")[tape.metadata.id]
    assert store.totals("agent")["a"]["calls"] == 2 and store.totals("node")["a.n1"]["calls"] == 1
    with pytest.raises(ValueError, match="choose"):
        store.totals("model")  # type: ignore[arg-type]


def test_saving_a_growing_tape_writes_only_new_steps(store: TapeStore) -> None:
    tape = Tape(steps=[UserStep(content="0")])
    key = store.save_tape(tape)
    for i in range(1, 50):
        tape = tape.append(UserStep(content=str(i)))
        store.save_tape(tape, key)
    loaded = store.get_tape(key)
    assert [s.content for s in loaded.steps] == [str(i) for i in range(50)]  # type: ignore[attr-defined]
    assert [s.metadata.id for s in loaded.steps] == [s.metadata.id for s in tape.steps]
    with pytest.raises(ValueError, match="stored steps"):
        store.save_tape(Tape(steps=[UserStep(content="short")]), key)


def test_get_steps_pages_a_long_tape(store: TapeStore) -> None:
    tape = Tape(steps=[Note(text=str(i)) for i in range(250)])
    key = store.save_tape(tape)
    assert [s.text for s in store.get_steps(key, 0, 100)] == [str(i) for i in range(100)]  # type: ignore[attr-defined]
    assert [s.text for s in store.get_steps(key, 200)] == [str(i) for i in range(200, 250)]  # type: ignore[attr-defined]
    assert store.get_steps(key, -3) == list(tape.steps[-3:])
    assert store.get_steps(key, 240, 1000) == list(tape.steps[240:])
    assert store.get_steps(key, 300, 400) == [] and store.get_steps(key, 5, 5) == []
    with pytest.raises(TypeError, match="start"):
        store.get_steps(key, "0")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- tags and filters


def test_tags_are_added_by_saves_and_changed_only_explicitly(store: TapeStore) -> None:
    tape = Tape(steps=[UserStep(content="0")])
    key = store.save_tape(tape, tags=["eval", "v1"])
    tape = tape.append(UserStep(content="1"))
    store.save_tape(tape, key, tags=["v2", "eval"])
    store.save_tape(tape.append(UserStep(content="2")), key)  # no tags: nothing removed
    assert store.get_tape_info(key).tags == ["eval", "v1", "v2"]
    store.remove_tags(key, ["v1", "never-there"])
    store.add_tags(key, ["gold", "gold"])
    assert store.get_tape_info(key).tags == ["eval", "gold", "v2"]
    other = store.save_tape(Tape(steps=[UserStep(content="o")]), tags=["eval"])
    assert set(store.list_tapes(tag="eval")) == {key, other}
    assert store.list_tapes(tag="gold") == [key] and store.list_tapes(tag="v1") == []
    assert store.list_tape_infos(tag="gold")[0].tags == ["eval", "gold", "v2"]
    with pytest.raises(TypeError, match="list of strings"):
        store.add_tags(key, "gold")
    with pytest.raises(TypeError, match="non-empty"):
        store.save_tape(tape, key, tags=[""])
    with pytest.raises(TapeNotFoundError, match="nope"):
        store.add_tags("nope", ["x"])


def test_every_filter_of_list_tapes(store: TapeStore) -> None:
    root = Tape(steps=[made_by("analyst", "plan", "p1")]).with_metadata(author="analyst")
    store.save_tape(root, tags=["a"])
    store.flush()
    time.sleep(0.02)
    child = root.with_new_steps([made_by("analyst/search_agent", "search", "p2")], author="search_agent")
    store.save_tape(child, tags=["a", "b"])
    time.sleep(0.02)
    failed = Tape(steps=[UserStep(content="x")]).with_metadata(error="timeout", author="analyst")
    store.save_tape(failed, tags=["b"])
    r, c, f = root.metadata.id, child.metadata.id, failed.metadata.id
    t_child = store.get_tape_info(c).created

    assert store.list_tapes() == [f, c, r]  # newest first
    assert store.list_tapes(author="analyst") == [f, r] == store.list_tapes("analyst")
    assert store.list_tapes(agent="analyst/search_agent") == [c]
    assert store.list_tapes(agent="analyst") == [c, r] and store.list_tapes(agent="analyst/x") == []
    assert store.list_tapes(has_error=True) == [f] and store.list_tapes(has_error=False) == [c, r]
    assert store.list_tapes(tag="a") == [c, r] and store.list_tapes(tag="b", author="analyst") == [f]
    assert store.list_tapes(since=t_child) == [f, c] and store.list_tapes(until=t_child) == [r]
    assert store.list_tapes(since=t_child, until=t_child + 0.001) == [c]
    assert store.list_tapes(parent_id=r) == [c] and store.list_tapes(parent_id=c) == []
    assert store.list_tapes(limit=2) == [f, c] and store.list_tapes(limit=2, offset=2) == [r]
    assert store.list_tapes(offset=1) == [c, r] and store.list_tapes(limit=0) == []
    infos = store.list_tape_infos(has_error=False, limit=5)
    assert [i.id for i in infos] == [c, r] and all(isinstance(i, TapeInfo) for i in infos)
    assert infos[0].parent_id == r and infos[0].n_added_steps == 1 and infos[0].n_steps == 2
    assert store.count_tapes() == 3 and store.count_tapes(tag="a", has_error=False) == 2
    assert store.count_tapes(agent="analyst/search_agent", since=t_child) == 1


def test_ancestry_and_descendants(store: TapeStore) -> None:
    root = Tape(steps=[UserStep(content="r")])
    a = root.with_new_steps([UserStep(content="a")])
    b = root.with_new_steps([UserStep(content="b")])
    a1 = a.with_new_steps([UserStep(content="a1")])
    a1x = a1.with_new_steps([UserStep(content="a1x")])
    orphan = Tape(steps=[UserStep(content="o")]).with_metadata(parent_id="not stored")
    for tape in (root, a, b, a1, a1x, orphan):
        store.save_tape(tape)
        time.sleep(0.002)
    ids = {name: t.metadata.id for name, t in dict(root=root, a=a, b=b, a1=a1, a1x=a1x).items()}
    assert [i.id for i in store.ancestry(ids["a1x"])] == [ids["a1"], ids["a"], ids["root"]]
    assert store.ancestry(ids["root"]) == [] and store.ancestry(orphan.metadata.id) == []
    assert [i.id for i in store.descendants(ids["root"])] == [ids["b"], ids["a"], ids["a1"], ids["a1x"]]
    assert [i.id for i in store.descendants(ids["a"])] == [ids["a1"], ids["a1x"]]
    assert store.descendants(ids["a1x"]) == []


# ---------------------------------------------------------------------------- JSONL


def fill(store: TapeStore) -> list[str]:
    """A few tapes with tags, parents, a typed context and LLM calls."""
    first = NoteTape(context=Brief(topic="t", budget=1), steps=[made_by("a", "n", "p1"), Note(text="n")])
    second = first.with_new_steps([made_by("a/b", "m", "p2")], author="b", result=[1, "x"])
    store.save_tape(first, tags=["x"])
    store.save_tape(second, tags=["x", "y"])
    store.save_llm_call(call("p1"))
    store.save_llm_call(call("p2", 3, 4, 0.25))
    store.save_llm_call(call("unreferenced"))
    store.flush()
    return [first.metadata.id, second.metadata.id]


def test_jsonl_round_trips_exactly_and_imports_once(store: TapeStore, tmp_path: Path) -> None:
    ids = fill(store)
    store.export_jsonl(tmp_path / "a.jsonl")
    with SQLiteStore(tmp_path / "copy.db") as copy:
        assert copy.import_jsonl(tmp_path / "a.jsonl") == list(reversed(store.list_tapes()))
        copy.import_jsonl(tmp_path / "a.jsonl")  # twice: nothing duplicated
        assert copy.count_tapes() == 2 and len(copy.list_llm_calls()) == 3
        for tape_id in ids:
            assert copy.get_tape_info(tape_id) == store.get_tape_info(tape_id)
            assert copy.get_tape(tape_id, NoteTape) == store.get_tape(tape_id, NoteTape)
        assert copy.totals("node") == store.totals("node")
        copy.export_jsonl(tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()


def test_jsonl_export_of_some_tapes_with_or_without_calls(store: TapeStore, tmp_path: Path) -> None:
    first, second = fill(store)
    assert store.export_jsonl(tmp_path / "one.jsonl", [second]) == 1
    lines = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert [line.get("type") for line in lines] == [None, "tape", "llm_call", "llm_call"]
    assert {line["call"]["prompt"]["id"] for line in lines[2:]} == {"p1", "p2"}
    store.export_jsonl(tmp_path / "bare.jsonl", [first], llm_calls=False)
    assert [json.loads(x).get("type") for x in (tmp_path / "bare.jsonl").read_text().splitlines()] == [
        None,
        "tape",
    ]
    with pytest.raises(TapeNotFoundError):
        store.export_jsonl(tmp_path / "x.jsonl", ["nope"])


def test_importing_a_bad_file_names_the_line(store: TapeStore, tmp_path: Path) -> None:
    fill(store)
    store.export_jsonl(tmp_path / "a.jsonl")
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    (tmp_path / "bad.jsonl").write_text("\n".join([lines[0], lines[1], '{"type": "tape", "info": {}}']))
    with pytest.raises(ValueError, match="line 3"):
        store.import_jsonl(tmp_path / "bad.jsonl")
    (tmp_path / "notours.jsonl").write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match="line 1: not a tapekit store export"):
        store.import_jsonl(tmp_path / "notours.jsonl")


# ---------------------------------------------------------------------------- errors


def test_a_missing_tape_is_a_clear_key_error(store: TapeStore) -> None:
    for method in (store.get_tape, store.get_tape_info, store.get_steps, store.ancestry, store.descendants):
        with pytest.raises(TapeNotFoundError) as caught:
            method("nope")
        assert isinstance(caught.value, KeyError) and str(caught.value).startswith("no tape 'nope' in ")
    with pytest.raises(KeyError):
        store.get_tape("nope")


def test_bad_arguments_are_refused(store: TapeStore) -> None:
    with pytest.raises(TypeError, match="needs a Tape"):
        store.save_tape({"steps": []})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tape_id"):
        store.save_tape(Tape(), "")
    with pytest.raises(TypeError, match="LLMCall"):
        store.save_llm_call("call")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        store.list_tapes(limit=-1)
    with pytest.raises(ValueError, match="offset"):
        store.list_tape_infos(offset=-5)
    with pytest.raises(TypeError, match="has_error"):
        store.list_tapes(has_error="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="since"):
        store.count_tapes(since="yesterday")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tag"):
        store.list_tapes(tag=["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Step"):
        store.llm_call_for_step("step")  # type: ignore[arg-type]
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.save_tape(Tape())


def test_open_store_picks_the_backend(tmp_path: Path) -> None:
    with open_store(tmp_path / "a.db") as s:
        assert isinstance(s, SQLiteStore)
    with pytest.raises(TypeError, match="open_store"):
        open_store(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="file path"):
        SQLiteStore(":memory:")
    with pytest.raises(ValueError, match="directory"):
        SQLiteStore(tmp_path)


@pytest.mark.skipif(PG_UNAVAILABLE is not None, reason=f"PostgreSQL backend: {PG_UNAVAILABLE}")
def test_postgres_urls_open_a_postgres_store(pg_cluster: TempPostgres, tmp_path: Path) -> None:
    url = pg_cluster.create_database()
    with open_store(url) as s:
        assert isinstance(s, PostgresStore)
    with open_store(url.replace("postgresql://", "postgres://", 1)) as s:
        assert isinstance(s, PostgresStore)
    with pytest.raises(ConnectionError, match=r"cannot connect to PostgreSQL at postgresql://u:\*\*\*@/x"):
        PostgresStore(f"postgresql://u:secret@/x?host={tmp_path}&port=1", connect_timeout_s=1)


@pytest.mark.skipif(PG_UNAVAILABLE is not None, reason=f"PostgreSQL backend: {PG_UNAVAILABLE}")
def test_postgres_store_survives_dropped_connections(pg_cluster: TempPostgres) -> None:
    import psycopg

    url = pg_cluster.create_database()
    with PostgresStore(url) as store:
        tape = Tape(steps=[UserStep(content="0")])
        key = store.save_tape(tape)
        store.flush()
        with psycopg.connect(url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        assert len(killed) == 2  # the store's reader and writer
        tape = tape.append(UserStep(content="1"))
        store.save_tape(tape, key, tags=["after"])
        assert store.get_tape_info(key).n_steps == 2 and store.list_tapes(tag="after") == [key]


def test_postgres_without_psycopg_names_the_extra() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["psycopg"] = None
        import tapekit.store
        try:
            tapekit.store.PostgresStore("postgresql://localhost/x")
        except ImportError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert "pip install 'tapekit[postgres]'" in out.stdout


def test_importing_the_store_does_not_import_psycopg() -> None:
    code = "import sys, tapekit, tapekit.store; print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_an_old_sqlite_file_without_tags_opens(tmp_path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript(
        "CREATE TABLE tapes (id TEXT PRIMARY KEY, parent_id TEXT, author TEXT, author_tape_id TEXT, "
        "n_added_steps INTEGER NOT NULL DEFAULT 0, error TEXT, result TEXT, context TEXT, "
        "n_steps INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, updated REAL NOT NULL);"
        "INSERT INTO tapes VALUES ('old', NULL, 'me', NULL, 0, NULL, 'null', 'null', 0, 1.0, 1.0);"
    )
    db.close()
    with SQLiteStore(tmp_path / "old.db") as store:
        store.add_tags("old", ["kept"])
        assert store.list_tapes(tag="kept") == ["old"] and store.get_tape("old").metadata.author == "me"
        # the tapes table gets the metadata.other column
        assert store.get_tape_info("old").other == {}
        store.save_tape(Tape().with_metadata(id="new", other={"level": 2}))
        assert store.get_tape("new").metadata.other == {"level": 2}


# ---------------------------------------------------------------------------- processes


WRITER = """
import sys
from tapekit import LLMCall, Tape, UserStep
from tapekit.core import LLMOutput, Prompt
from tapekit.store import open_store
url, worker = sys.argv[1], int(sys.argv[2])
with open_store(url, flush_interval_s=0.01) as store:
    for t in range(10):
        tape = Tape(steps=[UserStep(content="0")])
        key = store.save_tape(tape, f"w{worker}-t{t}", tags=[f"worker{worker}"])
        for i in range(1, 20):
            step = UserStep(content=str(i))
            step.metadata.agent, step.metadata.prompt_id = f"agent{worker}", f"w{worker}-t{t}-p{i}"
            tape = tape.append(step)
            store.save_tape(tape, key)
            done = LLMCall(prompt=Prompt(id=step.metadata.prompt_id), output=LLMOutput(content="x"))
            store.save_llm_call(done)
"""


def test_concurrent_writer_processes(store: TapeStore, store_url: str) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, store_url, str(w)], cwd=ROOT, stderr=subprocess.PIPE)
        for w in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    assert store.count_tapes() == 40 and len(store.list_llm_calls()) == 40 * 19
    for w in range(4):
        assert len(store.list_tapes(tag=f"worker{w}")) == 10
        assert store.totals("agent")[f"agent{w}"]["calls"] == 190
    for t in store.list_tape_infos():
        contents = [s.content for s in store.get_tape(t.id).steps]  # type: ignore[attr-defined]
        assert t.n_steps == 20 and contents == [str(i) for i in range(20)]


def test_concurrent_threads_and_stores_on_one_database(store_url: str) -> None:
    import threading

    stores = [open_store(store_url) for _ in range(3)]
    try:

        def work(s: TapeStore, n: int) -> None:
            tape = Tape(steps=[UserStep(content="0")])
            key = s.save_tape(tape, f"s{n}")
            for i in range(1, 30):
                tape = tape.append(UserStep(content=str(i)))
                s.save_tape(tape, key, tags=[f"t{i % 3}"])

        threads = [threading.Thread(target=work, args=(stores[n % 3], n)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in stores:
            s.flush()
        assert sorted(stores[0].list_tapes()) == [f"s{n}" for n in range(6)]
        assert all(i.n_steps == 30 and i.tags == ["t0", "t1", "t2"] for i in stores[1].list_tape_infos())
    finally:
        for s in stores:
            s.close()


def test_a_killed_writer_process_loses_nothing_flushed(store_url: str) -> None:
    script = textwrap.dedent(f"""
        import os
        from tapekit import Tape, UserStep
        from tapekit.store import open_store
        store = open_store({store_url!r}, flush_interval_s=0.01)
        tape = Tape(steps=[UserStep(content="0")])
        key = store.save_tape(tape, "session")
        for i in range(1, 30):
            tape = tape.append(UserStep(content=str(i)))
            store.save_tape(tape, "session")
        store.flush()
        print("flushed", flush=True)
        os.kill(os.getpid(), 9)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert "flushed" in result.stdout and result.returncode == -9, result.stderr
    with open_store(store_url) as store:
        loaded = store.get_tape("session")
        assert [s.content for s in loaded.steps] == [str(i) for i in range(30)]  # type: ignore[attr-defined]
        assert store.get_tape_info("session").n_steps == 30


# ---------------------------------------------------------------------------- text the databases refuse


def test_a_lone_surrogate_is_refused_at_save_naming_the_tape_step_and_field(store: TapeStore) -> None:
    bad = Tape(steps=[UserStep(content="fine"), UserStep(content="half an emoji \ud83d")])
    bad = bad.with_metadata(id="bad")
    message = r"tape 'bad': step 1 \(user, id \w+\).* field content .*lone surrogate"
    with pytest.raises(ValueError, match=message):
        store.save_tape(bad)
    good = Tape(steps=[UserStep(content="whole emoji \U0001f600")]).with_metadata(id="good")
    store.save_tape(good)
    with pytest.raises(ValueError, match=r"tape 'x': its metadata.error .*lone surrogate"):
        store.save_tape(Tape().with_metadata(id="x", error="\udcff"))
    with pytest.raises(ValueError, match=r"tag '\\udcff'"):
        store.save_tape(good, tags=["\udcff"])
    with pytest.raises(ValueError, match="NUL"):
        store.save_tape(Tape().with_metadata(id="y", author="a\x00b"))
    surrogate_call = call("p-bad")
    surrogate_call.output.content = "\ud800"
    with pytest.raises(ValueError, match=r"LLM call 'p-bad': its output .*field content"):
        store.save_llm_call(surrogate_call)
    store.save_llm_call(call("p-good"))
    # nothing bad reached the writer: the store keeps working and holds every good row
    assert store.list_tapes() == ["good"] and store.get_tape("good") == good
    assert store.list_llm_calls() == ["p-good"]
    # a NUL inside a step's text is JSON-escaped, and round-trips
    nul = Tape(steps=[UserStep(content="a\x00b")])
    store.save_tape(nul)
    assert store.get_tape(nul.metadata.id) == nul


def _refuse_tape_id(store_url: str, tape_id: str) -> None:
    """Make the database itself refuse to store tape ``tape_id`` (a trigger), as a row that
    passed every check but fails on commit."""
    if store_url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as db:
            db.execute(
                "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN IF NEW.id = '"
                + tape_id
                + "' THEN RAISE EXCEPTION 'refused by a trigger'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            db.execute("CREATE TRIGGER refuse BEFORE INSERT ON tapes FOR EACH ROW EXECUTE FUNCTION refuse()")
        return
    import sqlite3

    db = sqlite3.connect(store_url)
    db.execute(
        f"CREATE TRIGGER refuse BEFORE INSERT ON tapes WHEN NEW.id = '{tape_id}' "
        "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
    )
    db.commit()
    db.close()


def test_one_row_the_database_refuses_loses_no_other_row_nor_the_writer(store_url: str) -> None:
    from tapekit.store import StoreWriteError

    with open_store(store_url, flush_interval_s=5.0) as store:  # all three saves in one commit
        store.save_tape(Tape())  # the tables exist before the trigger is made
        store.flush()
        _refuse_tape_id(store_url, "poison")
        before = Tape(steps=[UserStep(content="before")]).with_metadata(id="before")
        after = Tape(steps=[UserStep(content="after")]).with_metadata(id="after")
        store.save_tape(before)
        store.save_tape(Tape(steps=[UserStep(content="p")]).with_metadata(id="poison"))
        store.save_tape(after)
        store.save_llm_call(call("p1"))
        with pytest.raises(StoreWriteError, match=r"1 queued write.*tape 'poison'.*refused by a trigger"):
            store.flush()
        store.flush()  # reported once; the writer goes on
        assert store.get_tape("before") == before and store.get_tape("after") == after
        assert store.list_llm_calls() == ["p1"] and "poison" not in store.list_tapes()
        later = Tape(steps=[UserStep(content="later")])
        store.save_tape(later)
        assert store.get_tape(later.metadata.id) == later


def test_a_bad_jsonl_line_names_the_file_and_line_and_the_import_stores_nothing(
    store: TapeStore, tmp_path: Path
) -> None:
    with SQLiteStore(tmp_path / "src.db") as src:
        fill(src)
        src.export_jsonl(tmp_path / "a.jsonl")
    good = (tmp_path / "a.jsonl").read_bytes().splitlines(keepends=True)
    cases = {
        b'{"type": "tape", "info": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n": "nested too deeply",
        b'{"type": "tape", "caf\xe9": 1}\n': r"not valid UTF-8 \(byte 0xe9 at column 22\)",
        b'{"type": "llm_call", "call": ' + b"9" * 5000 + b"}\n": "not valid JSON",
        b'{"type": "tape", "info": {"id": "x\\udcff", "n_steps": 0}, "steps": []}\n': "lone surrogate",
    }
    for bad, message in cases.items():
        path = tmp_path / "bad.jsonl"
        path.write_bytes(b"".join([*good[:3], bad, *good[3:]]))  # after a tape and a call
        with pytest.raises(ValueError, match=rf"bad.jsonl, line 4: .*{message}"):
            store.import_jsonl(path)
        assert store.count_tapes() == 0 and store.list_llm_calls() == []  # nothing stored
    store.import_jsonl(tmp_path / "a.jsonl")  # the store is fine
    assert store.count_tapes() == 2 and len(store.list_llm_calls()) == 3


@pytest.mark.skipif(PG_UNAVAILABLE is not None, reason=f"PostgreSQL backend: {PG_UNAVAILABLE}")
def test_postgres_opens_without_ddl_and_upgrades_an_old_schema(pg_cluster: TempPostgres) -> None:
    import psycopg

    from tapekit.store._sql import TOKEN_COLUMNS

    url = pg_cluster.create_database()
    with PostgresStore(url) as store:
        # a complete schema: a second store opens without DDL (DDL's table locks deadlocked a
        # live writer in another process), so nothing is left to add
        assert store._missing_schema() == []
    with psycopg.connect(url, autocommit=True) as admin:  # a database made before token ids
        for name in TOKEN_COLUMNS:
            admin.execute(f"ALTER TABLE llm_calls DROP COLUMN {name}")
        admin.execute("ALTER TABLE tapes DROP COLUMN other")  # and before metadata.other
        admin.execute("DROP INDEX tapes_author")
    with PostgresStore(url) as store:
        assert store._missing_schema() == []
        store.save_tape(Tape(steps=[UserStep(content="after the upgrade")]), tags=["t"])
        store.flush()
        assert len(store.list_tapes(tag="t")) == 1
        store.save_tape(Tape().with_metadata(id="other", other={"level": 2}))
        assert store.get_tape_info("other").other == {"level": 2}
