"""Crash tests: kill stored sessions at random kill points, resume them, count what went wrong.

Runs :func:`tapekit.testing.chaos.run_chaos` on the built-in payments workload (a ``once``
payment tool on an SQLite "bank", a read-only balance check between payments) in every
configuration asked for: store (SQLite, PostgreSQL from a throwaway cluster), loop (sync, async,
or a batch of three sessions killed together), workload (plain; ``fork``: the payments made by
two clerks in concurrent fork branches; ``reconcile``: the tool looks a payment up after a crash
instead of a person), and the negative control (``control``: the payment tool declared without
its effect, where duplicates must be found). Writes a JSON report (one entry per configuration,
and the totals) and prints it.

    python bench/chaos.py --scenarios 500 [--stores sqlite,postgres] [--loops sync,async,batch]
        [--workloads plain,fork,reconcile,control] [--out bench/results/chaos.json]

The run resumes: configurations already in ``--out`` with at least ``--scenarios`` scenarios are
skipped, so a stopped run continues with the same command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tapekit.store import SQLiteStore, TapeStore
from tapekit.testing.chaos import ChaosReport, PaymentsWorkload, run_chaos

WORKLOADS: dict[str, Callable[[], PaymentsWorkload]] = {
    "plain": PaymentsWorkload,
    "fork": lambda: PaymentsWorkload(fork=True),
    "reconcile": lambda: PaymentsWorkload(reconcile=True),
    "control": lambda: PaymentsWorkload(effect="read"),
}
BATCH_SESSIONS = 3  # loop "batch": three sessions of the workload run by one batch


def _stores(names: list[str]) -> tuple[dict[str, tuple[Callable[[Path], TapeStore], Any]], Any]:
    """Factories per store name (``open_store(path)``, ``forget(path)``), and the PostgreSQL
    cluster to stop at the end (or None)."""
    out: dict[str, tuple[Callable[[Path], TapeStore], Any]] = {}
    cluster = None
    if "sqlite" in names:
        out["sqlite"] = (lambda p: SQLiteStore(p, flush_interval_s=0.005), None)
    if "postgres" in names:
        import psycopg

        from tapekit.store import PostgresStore
        from tapekit.testing.postgres import TempPostgres, postgres_unavailable

        why = postgres_unavailable()
        if why:
            raise SystemExit(f"PostgreSQL: {why}")
        cluster = TempPostgres(durable=True).start()

        def dbname(path: Path) -> str:
            return "c_" + "".join(ch if ch.isalnum() else "_" for ch in path.name).lower()

        def open_pg(path: Path) -> TapeStore:
            name = dbname(path)
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                    conn.execute(f'CREATE DATABASE "{name}"')
            return PostgresStore(cluster.dsn(name), flush_interval_s=0.005)

        out["postgres"] = (open_pg, lambda path: cluster.drop_database(dbname(path)))
    return out, cluster


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", type=int, default=500, help="scenarios per configuration")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--loops", default="sync,async,batch")
    parser.add_argument("--workloads", default="plain,fork,reconcile,control")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/chaos.json"))
    args = parser.parse_args()
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    done: dict[str, Any] = json.loads(args.out.read_text())["configurations"] if args.out.exists() else {}
    stores, cluster = _stores(args.stores.split(","))
    try:
        with tempfile.TemporaryDirectory(prefix="tapekit-chaos-") as tmp:
            for store_name, (open_store, forget) in stores.items():
                for loop in args.loops.split(","):
                    for workload_name in args.workloads.split(","):
                        key = f"{store_name}/{loop}/{workload_name}"
                        if done.get(key, {}).get("scenarios", 0) >= args.scenarios:
                            continue
                        report = ChaosReport()
                        workload = WORKLOADS[workload_name]()
                        if loop == "batch":
                            if workload.fork:
                                continue  # the batch runs the plain sessions (forks: the other loops)
                            workload = dataclasses.replace(workload, sessions=BATCH_SESSIONS)
                        run_chaos(
                            workload,
                            open_store,
                            args.scenarios,
                            loop=loop,  # type: ignore[arg-type]
                            seed=args.seed,
                            workdir=Path(tmp) / key.replace("/", "-"),
                            report=report,
                            forget=forget,
                        )
                        done[key] = report.to_dict()
                        print(key, json.dumps(report.to_dict())[:400], flush=True)
                        _write(args.out, done)
    finally:
        if cluster is not None:
            cluster.stop()
    _write(args.out, done)
    print(json.dumps(_totals(done), indent=1))


def _totals(done: dict[str, Any]) -> dict[str, Any]:
    """The totals over the configurations that declare the tool's effect (not the control)."""
    real = {k: v for k, v in done.items() if not k.endswith("/control")}
    fields = [
        "scenarios",
        "killed",
        "duplicates",
        "lost_acknowledged",
        "unfinished",
        "different",
        "in_doubt_resolved",
    ]
    totals = {f: sum(v[f] for v in real.values()) for f in fields}
    totals["seconds"] = round(sum(v["seconds"] for v in real.values()), 1)
    points: dict[str, int] = {}
    for v in real.values():
        for point, count in v["kill_points"].items():
            points[point] = points.get(point, 0) + count
    totals["kill_points"] = dict(sorted(points.items()))
    control = {k: v["duplicates"] for k, v in done.items() if k.endswith("/control")}
    totals["control_duplicates"] = control
    return totals


def _write(path: Path, done: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    body = {"machine": machine, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    body.update(configurations=done, totals=_totals(done))
    path.write_text(json.dumps(body, indent=1) + "\n")


if __name__ == "__main__":
    main()
