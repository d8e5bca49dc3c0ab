"""The crash-test harness (tapekit.testing.chaos) in CI: a few hundred SIGKILLs of stored sessions
at every kill point, on SQLite and PostgreSQL, the sync and async loops, payments made in fork
branches, reconciled by the tool, and three sessions of a batch killed together; no payment is
ever made twice, no acknowledged step is lost, every session ends as an uninterrupted one. The
negative control (the payment tool declared without its effect) shows the harness does find
duplicates. bench/chaos.py runs the 10,000-scenario version (docs/durability.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit.store import SQLiteStore, TapeStore
from tapekit.testing.chaos import PaymentsWorkload, run_chaos
from tapekit.testing.postgres import TempPostgres, postgres_unavailable

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the harness forks (POSIX only)")


def sqlite_store(path: Path) -> TapeStore:
    return SQLiteStore(path, flush_interval_s=0.005)


@pytest.mark.parametrize(
    ("workload", "loop", "scenarios"),
    [
        (PaymentsWorkload(), "sync", 70),
        (PaymentsWorkload(), "async", 40),
        (PaymentsWorkload(fork=True), "sync", 50),
        (PaymentsWorkload(fork=True), "async", 30),
        (PaymentsWorkload(reconcile=True), "sync", 30),
        (PaymentsWorkload(sessions=3), "batch", 30),
    ],
    ids=["plain-sync", "plain-async", "fork-sync", "fork-async", "reconcile", "batch"],
)
def test_kills_on_sqlite_never_pay_twice(
    workload: PaymentsWorkload, loop: Any, scenarios: int, tmp_path: Path
) -> None:
    report = run_chaos(workload, sqlite_store, scenarios, loop=loop, seed=1, workdir=tmp_path)
    assert report.ok, report.failures
    assert report.scenarios == scenarios and report.killed >= scenarios * 0.8
    # the kills land everywhere: in the session's saves, the writer's commits and the journal
    assert {p.split(":")[0] for p in report.kill_points} >= {
        "session save",
        "writer commit",
        "journal record",
    }
    if workload.reconcile:
        assert report.reconciled > 0 and report.in_doubt_resolved == 0
    elif workload.fork or loop == "batch":
        assert report.in_doubt_resolved > 0  # concurrent branches or sessions leave calls in doubt


@pytest.fixture(scope="module")
def pg() -> Iterator[TempPostgres]:
    why = postgres_unavailable()
    if why is not None:
        pytest.skip(f"PostgreSQL: {why}")
    with TempPostgres(durable=True) as cluster:
        yield cluster


def test_kills_on_postgres_never_pay_twice(pg: TempPostgres, tmp_path: Path) -> None:
    import psycopg

    from tapekit.store import PostgresStore

    def name(path: Path) -> str:
        return "c_" + path.name.replace("-", "_")

    def open_pg(path: Path) -> TapeStore:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name(path),)).fetchone():
                conn.execute(f'CREATE DATABASE "{name(path)}"')
        return PostgresStore(pg.dsn(name(path)), flush_interval_s=0.005)

    forget: Callable[[Path], None] = lambda path: pg.drop_database(name(path))  # noqa: E731
    report = run_chaos(PaymentsWorkload(fork=True), open_pg, 30, seed=2, workdir=tmp_path, forget=forget)
    assert report.ok, report.failures
    assert report.killed >= 24


def test_the_harness_finds_duplicates_when_the_tool_does_not_declare_its_effect(tmp_path: Path) -> None:
    report = run_chaos(PaymentsWorkload(effect="read"), sqlite_store, 25, seed=3, workdir=tmp_path)
    assert report.duplicates > 0 and not report.ok
    assert any("done twice" in f for f in report.failures)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scenarios must be at least 1"):
        run_chaos(PaymentsWorkload(), sqlite_store, 0, workdir=tmp_path)
