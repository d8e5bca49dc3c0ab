"""The Ray backend on a local Ray instance: same results and same store as the local backend.

One Ray start for the whole module (it takes seconds); skipped when Ray is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from tapekit.batch import BatchStats, batch, batch_tags, batch_tape_id  # noqa: E402
from tapekit.store import SQLiteStore, TapeFilter  # noqa: E402
from tests.batch.test_batch import BEnv, calls_left, content, factory, make_agent, make_tapes, sequential  # noqa: E402
from tests.conftest import ray_cluster  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with ray_cluster(tmp_path_factory):  # workers import tests.batch.test_batch
        yield


def _stored(store: SQLiteStore, name: str) -> dict[str, Any]:
    started, done, failed = batch_tags(name)
    return {
        "started": sorted(store.list_tapes(TapeFilter(tag=started))),
        "done": sorted(store.list_tapes(TapeFilter(tag=done))),
        "failed": sorted(store.list_tapes(TapeFilter(tag=failed))),
    }


def test_ray_gives_the_local_results_and_store(tmp_path: Path) -> None:
    tapes = make_tapes(12, {5: "env", 7: "agent"})
    with SQLiteStore(tmp_path / "local.db") as local_store, SQLiteStore(tmp_path / "ray.db") as ray_store:
        local = batch(make_agent(), BEnv(), tapes, store=local_store, max_concurrency=4, llm_concurrency=2)
        stats = BatchStats()
        remote = batch(
            make_agent(),  # pickled to the workers
            BEnv(),
            tapes,
            store=ray_store,
            max_concurrency=4,
            llm_concurrency=2,
            backend="ray",
            stats=stats,
        )
        assert [r.index for r in remote] == list(range(12))
        for a, b in zip(local, remote, strict=True):
            assert (a.start_id, a.tape_id, a.error, a.llm_calls) == (
                b.start_id,
                b.tape_id,
                b.error,
                b.llm_calls,
            )
            assert content(a.tape) == content(b.tape) and not b.skipped
        assert (stats.finished, stats.failed, stats.running) == (12, 2, 0)
        assert stats.llm_calls == sum(r.llm_calls for r in local)
        assert _stored(ray_store, "batch") == _stored(local_store, "batch")
        for r in remote:  # the workers wrote every tape, step and LLM call
            stored = ray_store.get_tape(r.tape_id)
            assert content(stored) == content(r.tape)
            assert [s.metadata.id for s in stored.steps] == [s.metadata.id for s in r.tape.steps]
            assert all(ray_store.llm_call_for_step(s) for s in stored.steps if s.metadata.prompt_id)

        again = batch(make_agent(), BEnv(), tapes, store=ray_store, backend="ray", ray_workers=3)
        assert all(r.skipped and r.llm_calls == 0 for r in again)
        assert [content(r.tape) for r in again] == [content(r.tape) for r in remote]


def test_ray_workers_build_the_agent_from_a_factory_and_resume(tmp_path: Path) -> None:
    tapes = make_tapes(6)
    reference = sequential(tapes)
    with SQLiteStore(tmp_path / "ray.db") as store:
        cut = {}
        for i, (start, full) in enumerate(zip(tapes, reference, strict=True)):
            if i % 2:  # every other tape was cut by a crash, somewhere in the middle
                cut[i] = len(full) // 2
                prefix = full.model_copy(update={"steps": full.steps[: cut[i]]})
                store.save_tape(prefix, batch_tape_id("f", start.metadata.id), tags=[batch_tags("f")[0]])
        agent, env = factory()
        results = batch(
            agent,
            env,
            tapes,
            store=store,
            name="f",
            backend="ray",
            ray_factory="tests.batch.test_batch:factory",
        )
        for r in results:
            assert r.ok and content(r.tape) == content(reference[r.index])
            assert r.resumed == (r.index in cut)
            assert r.llm_calls == calls_left(reference[r.index], cut.get(r.index, 1))
        assert _stored(store, "f")["done"] == sorted(batch_tape_id("f", t.metadata.id) for t in tapes)


def test_a_failing_ray_worker_fails_its_tapes_not_the_batch() -> None:
    tapes = make_tapes(4)
    with pytest.raises(ValueError, match="has no attribute 'nope'"):  # checked before any worker starts
        batch(make_agent(), BEnv(), tapes, backend="ray", ray_factory="tests.batch.test_batch:nope")
    unpicklable = make_agent()
    results = batch(unpicklable, _BrokenOnArrival(), tapes, backend="ray", ray_workers=2)
    assert all(not r.ok and "the Ray worker failed" in (r.error or "") for r in results)
    assert all("cannot be rebuilt" in (r.error or "") for r in results)
    assert [r.tape.steps[0] for r in results] == [t.steps[0] for t in tapes]


def test_a_dead_workers_tape_committed_as_done_comes_back_as_stored(tmp_path: Path) -> None:
    """A worker killed between committing a tape as done and reporting it (a window the kill
    tests hit on a loaded machine): the driver reads that tape back from the store as it was
    finished (with its own error when it failed); a tape the worker never stored comes back
    failed with the worker's error, not done, to be retried."""
    from tapekit.batch._ray import unreported_result

    tapes = make_tapes(3, fail={1: "agent"})
    message = "the Ray worker failed: ActorDiedError: killed"
    with SQLiteStore(tmp_path / "s.db") as store:
        done, failed = batch(make_agent(), BEnv(), tapes[:2], store=store, name="b")
        assert done.ok and not failed.ok
        kept, kept_failed, never = (unreported_result(store, "b", i, tapes[i], message) for i in range(3))
    assert kept.ok and kept.tape_id == done.tape_id and content(kept.tape) == content(done.tape)
    assert kept_failed.error == failed.error != message and content(kept_failed.tape) == content(failed.tape)
    assert never.error == message and never.tape_id == batch_tape_id("b", "task-2")
    assert never.tape.steps == tapes[2].steps
    assert unreported_result(None, "b", 0, tapes[0], message).error == message  # no store: failed


class _BrokenOnArrival(BEnv):
    """An environment that pickles but cannot be unpickled (as when a worker lacks its code)."""

    def __reduce__(self) -> Any:
        return (_fail_to_rebuild, ())


def _fail_to_rebuild() -> None:
    raise RuntimeError("this environment cannot be rebuilt in a worker")


def test_the_batch_command_runs_on_ray(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tapekit.cli import app

    tapes_file = tmp_path / "tasks.jsonl"
    tapes_file.write_text("".join(t.model_dump_json() + "\n" for t in make_tapes(8)))
    db = tmp_path / "cli.db"
    args = [
        "batch",
        "tests.batch.test_batch:factory",
        "--tapes",
        str(tapes_file),
        "--db",
        str(db),
        "--name",
        "r",
    ]
    out = CliRunner().invoke(app, [*args, "--backend", "ray", "--ray-workers", "2"])
    assert out.exit_code == 0, out.output
    assert "8 of 8 finished (0 failed" in " ".join(out.output.split())
    with SQLiteStore(db) as store:
        for t, ref in zip(make_tapes(8), sequential(make_tapes(8)), strict=True):
            assert content(store.get_tape(batch_tape_id("r", t.metadata.id))) == content(ref)
