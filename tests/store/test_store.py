"""The tape store: the conformance suite (:mod:`tapekit.testing.store_conformance`) on every
backend, and what only some backends do.

Every check of the suite runs on :class:`MemoryStore`, :class:`SQLiteStore` and
:class:`PostgresStore`. The PostgreSQL runs use a throwaway cluster that the session starts from
the server binaries on this machine (``scripts/install-system.sh`` installs them), with a fresh
database per store; they skip, with the reason, where the binaries or psycopg are missing. The
tests after the suite are backend-specific: several connections, processes and crashes on
SQLite and PostgreSQL, opening and upgrading files and databases, what a database refuses on
commit, and the in-process store's own rules.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit import LLMCall, Tape, UserStep, main_loop
from tapekit.core import LLMOutput, Prompt
from tapekit.store import (
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    TapeFilter,
    TapeStore,
    open_store,
)
from tapekit.testing.analyst import ENVIRONMENT, make_analyst, start_tape
from tapekit.testing.postgres import TempPostgres, postgres_unavailable
from tapekit.testing.store_conformance import (
    CHECKS,
    Check,
    StoreFactory,
    check_a_save_stores_the_tape_as_it_was,
    check_every_filter_of_list_tapes,
    run_conformance,
)

ROOT = Path(__file__).resolve().parents[2]
PG_UNAVAILABLE = postgres_unavailable()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """A factory of new, empty stores of one backend (what the conformance checks take)."""
    if request.param == "memory":
        yield MemoryStore
        return
    if request.param == "sqlite":
        numbers = itertools.count()
        yield lambda: SQLiteStore(tmp_path / f"store{next(numbers)}.db")
        return
    pg: TempPostgres = request.getfixturevalue("pg_cluster")
    urls: list[str] = []

    def postgres() -> TapeStore:
        urls.append(pg.create_database())
        return PostgresStore(urls[-1])

    yield postgres
    for url in urls:
        pg.drop_database(url.split("/")[3].split("?")[0])


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
def test_conformance(check: Check, make_store: StoreFactory, tmp_path: Path) -> None:
    check(make_store, tmp_path)


# ---------------------------------------------------------------------------- the suite itself


class _OldestFirst(MemoryStore):
    """A broken backend: lists oldest first."""

    def _select_ids(self, where: TapeFilter, limit: int | None, offset: int) -> list[str]:
        return list(reversed(super()._select_ids(where, None, 0)))[
            offset : None if limit is None else offset + limit
        ]


class _KeepsReferences(MemoryStore):
    """A broken backend: hands back the very tape objects it was given (no snapshot)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, Tape[Any, Any]] = {}

    def save_tape(self, tape: Tape[Any, Any], tape_id: str | None = None, *, tags: Any = ()) -> str:
        key = super().save_tape(tape, tape_id, tags=tags)
        self.kept[key] = tape
        return key

    def get_tape(self, tape_id: str, tape_class: type[Tape[Any, Any]] = Tape) -> Tape[Any, Any]:
        return self.kept.get(tape_id) or super().get_tape(tape_id, tape_class)


@pytest.mark.parametrize(
    ("broken", "check", "message"),
    [
        (_OldestFirst, check_every_filter_of_list_tapes, "every tape, newest first"),
        (
            _KeepsReferences,
            check_a_save_stores_the_tape_as_it_was,
            "steps after the saved step object changed",
        ),
    ],
)
def test_the_suite_catches_a_broken_backend(
    broken: Callable[[], TapeStore], check: Check, message: str, tmp_path: Path
) -> None:
    with pytest.raises(AssertionError, match=message):
        check(broken, tmp_path)
    with pytest.raises(AssertionError, match=rf"1 of 1 store conformance checks failed:\n{check.__name__}"):
        run_conformance(broken, (check,))
    run_conformance(MemoryStore, (check,))  # the correct backend passes the same check


def test_run_conformance_runs_every_check_without_pytest() -> None:
    code = (
        "import sys; from tapekit.store import MemoryStore; "
        "from tapekit.testing.store_conformance import run_conformance; "
        "run_conformance(MemoryStore); print('pytest' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # the suite needs no test runner


# ---------------------------------------------------------------------------- the interface


def test_the_filter_keywords_of_earlier_versions_still_work_and_warn() -> None:
    with MemoryStore() as store:
        tagged = store.save_tape(Tape(steps=[UserStep(content="a")]), tags=["x"])
        store.save_tape(Tape(steps=[UserStep(content="b")]).with_metadata(author="me"))
        with pytest.warns(
            DeprecationWarning, match=r"list_tapes\(tag=...\) is deprecated: pass where=TapeFilter"
        ):
            assert store.list_tapes(tag="x") == [tagged] == store.list_tapes(TapeFilter(tag="x"))
        with pytest.warns(DeprecationWarning, match="count_tapes"):
            assert store.count_tapes(author="me", has_error=False) == 1
        with pytest.warns(DeprecationWarning, match="list_tape_infos"):
            assert [i.id for i in store.list_tape_infos(tag="x", limit=1)] == [tagged]
        with pytest.raises(TypeError, match="not also as keywords"):
            store.list_tapes(TapeFilter(author="me"), tag="x")
        with pytest.raises(TypeError, match=r"unexpected keyword arguments \['colour'\]"):
            store.count_tapes(colour="red")
        with pytest.raises(TypeError, match="where must be a TapeFilter"):
            store.count_tapes({"tag": "x"})  # type: ignore[arg-type]


def test_a_store_says_where_another_process_opens_it(tmp_path: Path) -> None:
    from tapekit.batch._ray import _store_address

    with SQLiteStore(tmp_path / "a.db") as sqlite, MemoryStore() as memory:
        assert sqlite.address == str(tmp_path / "a.db") and _store_address(sqlite) == sqlite.address
        assert memory.address is None and _store_address(None) is None
        with pytest.raises(ValueError, match="MemoryStore lives in this process only"):
            _store_address(memory)


def test_the_memory_store_commits_at_once_and_forgets_on_close() -> None:
    store = MemoryStore()
    tape = Tape(steps=[UserStep(content="x")])
    store.save_tape(tape, tags=["t"])
    assert store.pending_writes() == 0 and store._stored_length(tape.metadata.id) == 1  # no queue
    assert repr(store) == "MemoryStore(1 tapes, 0 LLM calls)"
    other = MemoryStore()
    assert other.list_tapes() == []  # stores share nothing
    store.close()
    assert repr(store) == "MemoryStore(0 tapes, 0 LLM calls)"
    with pytest.raises(RuntimeError, match="MemoryStore on memory is closed"):
        store.get_tape(tape.metadata.id)


def test_the_deprecated_recorder_still_records(tmp_path: Path) -> None:
    with MemoryStore() as store:
        start = start_tape()
        with pytest.warns(DeprecationWarning, match="recorder"):
            record = store.recorder(start, tags=["demo"])
        final = start
        for event in main_loop(make_analyst(), start, ENVIRONMENT):
            record(event)
            final = event.tape or final
        assert store.get_tape(start.metadata.id).steps == final.steps
        assert store.get_tape_info(start.metadata.id).tags == ["demo"]


# ---------------------------------------------------------------------------- SQLite and PostgreSQL


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


def test_another_connection_sees_each_step_as_soon_as_it_is_made(store: TapeStore, store_url: str) -> None:
    start = start_tape()
    made = len(start)
    with open_store(store_url) as watcher:
        for event in main_loop(make_analyst(), start, ENVIRONMENT, store=store, tags=["demo"]):
            if event.tape is not None:
                made = len(event.tape)
            elif event.step is not None:
                made += 1
            store.flush()
            assert watcher.get_tape_info(start.metadata.id).n_steps == made
        store.flush()
        assert watcher.get_tape(start.metadata.id) == store.get_tape(start.metadata.id)


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
        assert store.get_tape_info(key).n_steps == 2 and store.list_tapes(TapeFilter(tag="after")) == [key]


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
        assert (
            store.list_tapes(TapeFilter(tag="kept")) == ["old"]
            and store.get_tape("old").metadata.author == "me"
        )
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
        assert len(store.list_tapes(TapeFilter(tag=f"worker{w}"))) == 10
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
        store.save_llm_call(LLMCall(prompt=Prompt(id="p1"), output=LLMOutput(content="x")))
        with pytest.raises(StoreWriteError, match=r"1 queued write.*tape 'poison'.*refused by a trigger"):
            store.flush()
        store.flush()  # reported once; the writer goes on
        assert store.get_tape("before") == before and store.get_tape("after") == after
        assert store.list_llm_calls() == ["p1"] and "poison" not in store.list_tapes()
        later = Tape(steps=[UserStep(content="later")])
        store.save_tape(later)
        assert store.get_tape(later.metadata.id) == later


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
        admin.execute("ALTER TABLE tapes DROP COLUMN steps_digest")  # and before step digests
        admin.execute("DROP INDEX tapes_author")
    with PostgresStore(url) as store:
        assert store._missing_schema() == []
        store.save_tape(Tape(steps=[UserStep(content="after the upgrade")]), tags=["t"])
        store.flush()
        assert len(store.list_tapes(TapeFilter(tag="t"))) == 1
        store.save_tape(Tape().with_metadata(id="other", other={"level": 2}))
        assert store.get_tape_info("other").other == {"level": 2}
        assert store._stored_state("other") == (0, "")


# ---------------------------------------------------------------------------- a save under a stored id


def _null_digests(store_url: str) -> None:
    """Make every tape's row look as written before digests were kept (NULL)."""
    if store_url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as db:
            db.execute("UPDATE tapes SET steps_digest = NULL")
        return
    import sqlite3

    conn = sqlite3.connect(store_url)
    conn.execute("UPDATE tapes SET steps_digest = NULL")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("rows", ["with digests", "written before digests"])
def test_another_store_on_the_database_refuses_a_tape_that_does_not_extend_the_stored_one(
    store_url: str, rows: str
) -> None:
    """The check holds across store objects and processes: the digest is stored with the tape
    (a row written before digests is checked against its stored steps, and gets one)."""
    a, b = UserStep(content="a"), UserStep(content="b")
    with open_store(store_url) as store:
        store.save_tape(Tape(steps=[a, b]), "t")
    if rows == "written before digests":
        _null_digests(store_url)
    with open_store(store_url) as store:
        with pytest.raises(
            ValueError, match=r"tape t has 2 stored steps .* its step 1 differs from the stored step 1"
        ):
            store.save_tape(Tape(steps=[a, UserStep(content="B"), UserStep(content="c")]), "t")
        with pytest.raises(ValueError, match=r"its step 0 differs"):
            store.save_tape(Tape(steps=[UserStep(content="a"), b]), "t")  # the same text, another step id
        store.save_tape(Tape(steps=[a, b]), "t")  # the same steps: only the metadata is written
        store.save_tape(store.get_tape("t").append(UserStep(content="c")), "t")
        assert [s.content for s in store.get_tape("t").steps] == ["a", "b", "c"]  # type: ignore[attr-defined]
        digest = store._stored_state("t")
    assert digest is not None and digest[0] == 3 and digest[1] is not None and len(digest[1]) == 64
    with open_store(store_url) as store, pytest.raises(ValueError, match=r"its step 2 differs"):
        store.save_tape(Tape(steps=[a, b, UserStep(content="C")]), "t")


def test_steps_stored_as_other_json_are_the_same_steps(tmp_path: Path) -> None:
    """A stored step whose JSON differs from what its step writes now (here: the keys in another
    order and spaces, as another version might have written it) still counts as the same step:
    a tape read back from the store extends it."""
    import json
    import sqlite3

    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        store.save_tape(Tape(steps=[UserStep(content="a"), UserStep(content="b")]), "t")
    db = sqlite3.connect(path)
    for idx, data in db.execute("SELECT idx, data FROM steps").fetchall():
        other = json.dumps(dict(reversed(json.loads(data).items())), indent=1)
        db.execute("UPDATE steps SET data = ? WHERE idx = ?", (other, idx))
    db.commit()
    db.close()
    with SQLiteStore(path) as store:
        tape = store.get_tape("t")
        for text in ("c", "d"):
            tape = tape.append(UserStep(content=text))
            store.save_tape(tape, "t")
        assert [s.content for s in store.get_tape("t").steps] == ["a", "b", "c", "d"]  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="its step 1 differs"):
            store.save_tape(Tape(steps=[tape.steps[0], UserStep(content="x"), *tape.steps[2:]]), "t")


def test_the_check_hashes_each_step_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefix check costs no step serialisation for a growing tape (its new steps are
    serialised once, for their rows and their digest), a tape read back by a new store has its
    stored steps' digest with it (none of them is serialised, or even parsed, to save it
    again), and a tape rebuilt from a list of the same step objects on every save has its
    steps hashed once, not on every save."""
    serialised = []
    to_json = UserStep.model_dump_json

    def counting(self: UserStep, **kwargs: Any) -> str:
        serialised.append(self.content)
        return to_json(self, **kwargs)

    monkeypatch.setattr(UserStep, "model_dump_json", counting)
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        tape: Tape[Any, Any] = Tape(steps=[UserStep(content="0")])
        store.save_tape(tape, "t")
        for i in range(1, 200):
            tape = tape.append(UserStep(content=str(i)))
            store.save_tape(tape, "t")
        assert len(serialised) == 200
    with SQLiteStore(path) as store:
        tape = store.get_tape("t")
        serialised.clear()
        for i in range(200, 250):
            tape = tape.append(UserStep(content=str(i)))
            store.save_tape(tape, "t")
        assert len(serialised) == 50  # each new step once; the stored 200 not at all
        serialised.clear()
        for i in range(250, 300):  # a tape rebuilt from a list each time: the same step objects
            tape = Tape(steps=[*tape.steps, UserStep(content=str(i))])
            store.save_tape(tape, "t")
        assert len(serialised) == 250 + 50  # the rebuilt tape's 250 once, then each new step once
        serialised.clear()
        for i in range(300, 320):
            tape = Tape(steps=[*tape.steps, UserStep(content=str(i))])
            store.save_tape(tape, "t")
        assert len(serialised) == 20


# ---------------------------------------------------------------------------- another application's file


def test_another_applications_sqlite_file_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """An SQLite file with its own ``tapes`` table (other columns), in rollback-journal mode:
    ``open_store`` raises ``ValueError`` naming the file and the table, and the file is
    byte-for-byte as it was (no WAL switch, no table made, no header change)."""
    import sqlite3

    path = tmp_path / "theirs.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE tapes (id INTEGER PRIMARY KEY, title TEXT, length_s REAL)")
    db.execute("INSERT INTO tapes (title, length_s) VALUES ('Abbey Road', 2832.0)")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(
        ValueError, match=rf"{path} is not a tapekit store: its table 'tapes' lacks the columns"
    ) as e:
        open_store(path)
    assert "another application's database?" in str(e.value) and "parent_id" in str(e.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]  # no -wal, no -shm
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("tapes",)]
    db.close()


def test_files_another_application_marked_or_that_are_not_sqlite_are_refused(tmp_path: Path) -> None:
    """A database whose header names another application (``application_id``) and a file that
    is not a database are refused, naming the file; a new store is marked as tapekit's, and an
    SQLite file with only other tables gets the store's tables next to them."""
    import sqlite3

    from tapekit.store.sqlite import APPLICATION_ID

    marked = tmp_path / "marked.db"
    db = sqlite3.connect(marked)
    db.execute("PRAGMA application_id = 1234")
    db.execute("CREATE TABLE notes (text TEXT)")
    db.commit()
    db.close()
    before = marked.read_bytes()
    with pytest.raises(ValueError, match=rf"{marked} is not a tapekit store: its application_id is 0x4d2"):
        SQLiteStore(marked)
    assert marked.read_bytes() == before
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database " * 100)
    with pytest.raises(ValueError, match=rf"cannot open the SQLite store {junk}: file is not a database"):
        SQLiteStore(junk)
    assert junk.read_bytes() == b"not a database " * 100
    with SQLiteStore(tmp_path / "new.db") as store:
        store.save_tape(Tape(), "t")
    db = sqlite3.connect(tmp_path / "new.db")
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    db.close()
    shared = tmp_path / "shared.db"
    db = sqlite3.connect(shared)
    db.execute("CREATE TABLE notes (text TEXT)")
    db.commit()
    db.close()
    with SQLiteStore(shared) as store:
        store.save_tape(Tape(), "t")
        assert store.list_tapes() == ["t"]


@pytest.mark.skipif(PG_UNAVAILABLE is not None, reason=f"PostgreSQL backend: {PG_UNAVAILABLE}")
def test_a_postgres_database_with_another_applications_tapes_table_is_refused(
    pg_cluster: TempPostgres,
) -> None:
    import psycopg

    url = pg_cluster.create_database()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("CREATE TABLE tapes (id SERIAL PRIMARY KEY, title TEXT)")
    with pytest.raises(ValueError, match=r"is not a tapekit store: its table 'tapes' lacks the columns"):
        PostgresStore(url)
    with psycopg.connect(url, autocommit=True) as db:
        tables = db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
    assert tables == [("tapes",)]
