"""Fixtures shared by the store tests: one throwaway PostgreSQL cluster for the whole session
(each test makes its own database in it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tapekit.testing.postgres import TempPostgres, postgres_unavailable

PG_UNAVAILABLE = postgres_unavailable()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[TempPostgres]:
    """One throwaway PostgreSQL cluster for the session (skips where PostgreSQL is missing)."""
    if PG_UNAVAILABLE is not None:
        pytest.skip(f"PostgreSQL backend: {PG_UNAVAILABLE}")
    with TempPostgres() as pg:
        yield pg
