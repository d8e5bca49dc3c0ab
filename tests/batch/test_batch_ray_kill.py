"""A Ray worker killed inside a ``once`` tool: running the batch again pays nothing twice and
loses nothing (issue 45.3, docs/durability.md).

Four sessions of :class:`~tapekit.testing.chaos.PaymentsWorkload` (each pays its four invoices,
a ``once`` tool, with a balance check between payments) run on two Ray workers. The payment
tool writes every payment it makes to a ledger (an SQLite file: the outside world, which
survives the worker), and on the first run only (a marker file, claimed once) the worker that
pays ``s0-A2`` SIGKILLs its own process, right after the payment reached the ledger (its
outcome is not journalled) or right before it (only the intent is). The driver's batch must
return with that worker's tapes failed and not done; the next run resumes them, and the call in
doubt is settled by the tool's ``reconcile`` (looks the payment up in the ledger by
``tool_call_key()``) or, for a tool without one, stops the tape on ``InDoubtToolCall`` until
``store.resolve_tool_effect`` and a third run. Then every invoice is paid exactly once and
every tape ends as an uninterrupted run's. (In the ``slow`` tier with the other Ray tests:
tests/conftest.py's TIERS, by path.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from tapekit.batch import batch, batch_tags, batch_tape_id  # noqa: E402
from tapekit.dialog import ToolResult  # noqa: E402
from tapekit.effects import NOT_DONE, tool_call_key  # noqa: E402
from tapekit.environment import Tool, ToolEnvironment  # noqa: E402
from tapekit.store import SQLiteStore, TapeFilter  # noqa: E402
from tapekit.testing.chaos import PaymentsWorkload  # noqa: E402
from tests.batch.test_batch_ray import local_ray  # noqa: E402, F401  (one local Ray for the module)
from tests.conftest import gone_within  # noqa: E402

NAME = "paykill"
KILLED_INVOICE = "s0-A2"  # the second payment of session 0 (its first one is stored before the kill)
TIMEOUT_S = 240  # a driver that hangs on a dead worker fails the test instead of blocking it


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in the main thread (the driver) after ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the batch did not return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------- the outside world


def _ledger(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS paid (invoice TEXT NOT NULL, key TEXT NOT NULL, pid INTEGER NOT NULL)"
    )
    return conn


def _paid(path: Path) -> list[tuple[str, str, int]]:
    if not path.exists():
        return []
    with contextlib.closing(_ledger(path)) as conn:
        return [(str(i), str(k), int(p)) for i, k, p in conn.execute("SELECT * FROM paid ORDER BY rowid")]


def _environment(world: Path, kill: str | None, with_reconcile: bool) -> ToolEnvironment:
    """The payment tool on the ledger ``world/ledger.db``; ``kill`` ("before" or "after" the
    payment) makes the process that pays KILLED_INVOICE SIGKILL itself while the marker file
    ``world/first-run`` exists (it is claimed once: only one process dies, once)."""
    ledger, marker = world / "ledger.db", world / "first-run"

    def die_if_first_run(invoice: str) -> None:
        if invoice != KILLED_INVOICE:
            return
        try:
            marker.unlink()  # atomic: one claimant, on the first run only
        except FileNotFoundError:
            return
        import ray as ray_in_worker

        title = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()  # Ray names its workers
        worker_id = ray_in_worker.get_runtime_context().get_worker_id()
        died = {
            "pid": os.getpid(),
            "invoice": invoice,
            "key": tool_call_key(),
            "worker_id": worker_id,
            "title": title,
        }
        (world / "died.json").write_text(json.dumps(died))
        os.kill(os.getpid(), signal.SIGKILL)

    def pay(invoice: str) -> str:
        """Pay an invoice."""
        if kill == "before":
            die_if_first_run(invoice)
        with contextlib.closing(_ledger(ledger)) as conn:  # committed before the tool returns
            conn.execute("INSERT INTO paid VALUES (?, ?, ?)", (invoice, tool_call_key(), os.getpid()))
        if kill == "after":
            die_if_first_run(invoice)  # paid, and the outcome is not journalled
        return f"paid {invoice}"

    def look_up(call: Any) -> Any:
        """The payment's result if the ledger has it under the call's key, else NOT_DONE."""
        key = tool_call_key()
        return f"paid {call.arguments['invoice']}" if any(k == key for _, k, _ in _paid(ledger)) else NOT_DONE

    def balance() -> int:
        """The account's balance."""
        return 100

    reconcile = look_up if with_reconcile else None
    return ToolEnvironment([Tool(pay, effect="once", reconcile=reconcile), balance])


def _signature(tape: Any) -> list[Any]:
    return [s.llm_dict() for s in tape.steps]


def _tagged(store: SQLiteStore) -> Callable[[str], set[str]]:
    started, done, failed = batch_tags(NAME)
    tags = {"started": started, "done": done, "failed": failed}
    return lambda which: set(store.list_tapes(TapeFilter(tag=tags[which])))


@pytest.mark.parametrize(
    ("kill", "with_reconcile"),
    [("after", True), ("before", False)],
    ids=["killed-after-the-payment-reconciled", "killed-before-the-payment-resolved-by-hand"],
)
def test_a_ray_worker_killed_in_a_once_tool_pays_once_on_resume(
    tmp_path: Path, kill: str, with_reconcile: bool
) -> None:
    workload = PaymentsWorkload(sessions=4)
    starts = workload.starts()
    ids = [batch_tape_id(NAME, t.metadata.id) for t in starts]
    agent, _ = workload.build(tmp_path / "unused.world")  # the payer on its scripted model

    # an uninterrupted run (local backend, its own ledger): the reference tapes
    (tmp_path / "reference").mkdir()
    with SQLiteStore(tmp_path / "reference" / "store.db") as ref_store:
        reference = batch(
            agent,
            _environment(tmp_path / "reference", None, with_reconcile),
            starts,
            store=ref_store,
            name=NAME,
        )
    assert all(r.ok for r in reference)
    assert sorted(i for i, _, _ in _paid(tmp_path / "reference" / "ledger.db")) == sorted(workload.expected())

    world = tmp_path / "world"
    world.mkdir()
    (world / "first-run").touch()
    env = _environment(world, kill, with_reconcile)
    ledger = world / "ledger.db"
    with SQLiteStore(tmp_path / "store.db") as store, _deadline(TIMEOUT_S):
        tagged = _tagged(store)

        def run() -> list[Any]:
            return batch(
                agent, env, starts, store=store, name=NAME, backend="ray", ray_workers=2, max_concurrency=4
            )

        # 1. the first run: the worker that pays s0-A2 dies; the driver returns
        first = run()
        died = json.loads((world / "died.json").read_text())
        assert not (world / "first-run").exists()
        assert died["invoice"] == KILLED_INVOICE and died["title"] == "ray::_run_share"  # a Ray worker's task
        assert died["pid"] != os.getpid() and died["worker_id"] != ray.get_runtime_context().get_worker_id()
        assert gone_within(died["pid"], 30), "the killed Ray worker is still running"
        # the shares are dealt round-robin: worker 0 ran sessions 0 and 2, worker 1 sessions 1 and 3
        killed_share, other_share = [0, 2], [1, 3]
        assert [r.index for r in first] == [0, 1, 2, 3]
        killed = first[0]
        assert not killed.ok and "the Ray worker failed" in (killed.error or "")
        for i in killed_share:  # what the dead worker had not reported is failed and not done
            r = first[i]
            assert r.ok or "the Ray worker failed" in (r.error or "")
            assert (r.tape_id in tagged("done")) == r.ok
        for i in other_share:  # the other worker finished its tapes, in its own process
            assert first[i].ok and ids[i] in tagged("done")
        by_pid = {invoice: pid for invoice, _, pid in _paid(ledger)}
        others = {invoice: pid for invoice, pid in by_pid.items() if invoice[:2] in ("s1", "s3")}
        assert len(others) == 8 and died["pid"] not in others.values()  # all paid, by another process
        assert (KILLED_INVOICE in by_pid) == (kill == "after")
        if kill == "after":
            assert by_pid[KILLED_INVOICE] == died["pid"]
        doubt = {e.key: e for e in store.tool_effects(in_doubt=True)}
        assert died["key"] in doubt  # its intent is journalled, its outcome is not

        # 2. the second run (same store, same tapes) resumes the dead worker's tapes only
        second = run()
        for i in other_share:
            assert second[i].skipped and second[i].llm_calls == 0
        for i in killed_share:
            assert second[i].skipped or second[i].resumed
        resolved = []
        if with_reconcile:  # the tool looked the payment up in the ledger by its key
            assert all(r.ok and not r.external for r in second)
            results = [s for s in second[0].tape.steps if isinstance(s, ToolResult)]
            assert [
                s.metadata.other.get("effect") for s in results if s.content == f"paid {KILLED_INVOICE}"
            ] == ["reconciled"]
        else:  # the tape waits on the call in doubt; a person checks the ledger and says what happened
            assert second[0].external and ids[0] not in tagged("done")
            keys = {k for _, k, _ in _paid(ledger)}
            for effect in store.tool_effects(in_doubt=True):
                paid = effect.key in keys
                store.resolve_tool_effect(
                    effect.key,
                    **({"result": f"paid {effect.arguments['invoice']}"} if paid else {"retry": True}),
                )
                resolved.append((effect.arguments["invoice"], paid))
            assert (KILLED_INVOICE, False) in resolved  # killed before paying: run it
            second = run()  # the third run
            assert all(r.ok and not r.external for r in second)
        finals = [store.get_tape(tape_id) for tape_id in ids]
        assert tagged("done") == set(ids) and not tagged("failed")
        assert not store.tool_effects(in_doubt=True)

    # nothing paid twice, nothing lost; the tapes are the uninterrupted run's
    made = Counter(i for i, _, _ in _paid(ledger))
    assert sorted(made) == sorted(workload.expected()) and set(made.values()) == {1}
    assert [_signature(t) for t in finals] == [_signature(r.tape) for r in reference]
    assert [_signature(r.tape) for r in second] == [_signature(r.tape) for r in reference]  # as reported
    for i in other_share:  # the other worker's tapes were not touched after the first run
        assert _signature(first[i].tape) == _signature(finals[i])
