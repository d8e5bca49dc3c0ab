"""A throwaway PostgreSQL cluster for tests and benchmarks, from the server binaries on this
machine (Debian's ``/usr/lib/postgresql/<version>/bin``, or ``initdb`` on ``PATH``).

The cluster lives in a temporary directory and listens only on a unix socket there (no TCP),
so it needs no configuration and cannot clash with another server. PostgreSQL refuses to run as
root; as root the cluster runs as the ``postgres`` system user (``runuser``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Self
from urllib.parse import quote
from uuid import uuid4

__all__ = ["TempPostgres", "find_postgres_bin", "postgres_unavailable"]


def find_postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (the newest Debian version first)."""

    def version(p: Path) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in p.parent.parent.name.split("."))
        except ValueError:
            return (0,)

    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=version, reverse=True)
    if found:
        return found[0].parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def postgres_unavailable() -> str | None:
    """Why a throwaway cluster cannot be started here (None when it can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg 3 is not installed (pip install 'tapekit[postgres]')"
    bin_dir = find_postgres_bin()
    if bin_dir is None or not (bin_dir / "pg_ctl").exists():
        return "no PostgreSQL server binaries (initdb, pg_ctl): run scripts/install-system.sh"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root without runuser (PostgreSQL refuses to run as root)"
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TempPostgres:
    """A PostgreSQL cluster in a temporary directory, started by :meth:`start` and deleted by
    :meth:`stop` (or use it as a context manager). ``durable=False`` (the default, for tests)
    turns fsync off: fast, and a crash of the machine loses the data, which is fine here."""

    def __init__(self, durable: bool = False) -> None:
        self.durable = durable
        self.base: Path | None = None
        self.port = 0
        self._bin: Path | None = None
        self._as: list[str] = []

    @property
    def socket_dir(self) -> str:
        """The directory of the server's unix socket (the ``host`` to connect to)."""
        if self.base is None:
            raise RuntimeError("the cluster is not started")
        return str(self.base)

    def dsn(self, dbname: str = "postgres") -> str:
        """A ``postgresql://`` URL for database ``dbname`` of this cluster."""
        return f"postgresql://postgres@/{dbname}?host={quote(self.socket_dir, safe='')}&port={self.port}"

    def _run(self, *args: str, timeout: float = 60) -> None:
        assert self._bin is not None
        cmd = [*self._as, str(self._bin / args[0]), *args[1:]]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            log = ""
            if self.base is not None and (self.base / "server.log").exists():
                log = (self.base / "server.log").read_text()[-2000:]
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}\n{log}"
            )

    def start(self) -> Self:
        """Create the cluster and start the server (a few seconds); raises with the reason if
        that is impossible here."""
        why = postgres_unavailable()
        if why is not None:
            raise RuntimeError(f"cannot start a throwaway PostgreSQL: {why}")
        self._bin = find_postgres_bin()
        # short path in the system temp dir: unix socket paths are limited to ~100 characters,
        # and the postgres user must be able to reach it
        self.base = Path(
            tempfile.mkdtemp(prefix="tapekit-pg-", dir="/tmp" if os.path.isdir("/tmp") else None)
        )
        data = self.base / "data"
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        self.port = _free_port()
        settings = f"-p {self.port} -k {self.base} -c listen_addresses=''"
        if not self.durable:
            settings += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        try:
            self._run("initdb", "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
            self._run(
                "pg_ctl", "-D", str(data), "-l", str(self.base / "server.log"), "-w", "-t", "60",
                "-o", settings, "start",
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database (a fresh name by default) and return its URL."""
        import psycopg

        name = name or f"t_{uuid4().hex[:16]}"
        if not name.replace("_", "").isalnum():
            raise ValueError(f"database name {name!r}: use letters, digits and underscores")
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, closing its connections."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Stop the server at once and delete the cluster (stopping twice is harmless)."""
        if self.base is None:
            return
        data = self.base / "data"
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop", timeout=30)
        shutil.rmtree(self.base, ignore_errors=True)
        self.base = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
