"""Run one agent over many tapes at once, and pick up where a stopped batch left off.

``abatch`` runs the main loop on each input tape with a bound on how many tapes run at the same
time and, optionally, on how many requests each LLM has in flight. Results come out as each
tape finishes. With a store, every step is written as it is made and every LLM call when it
completes; a tape that finishes is written whole and tagged done in one write. Running the same
batch (same name, same store) again returns the finished tapes from the store without running
them and resumes the unfinished ones from their stored steps, so a batch stopped by Ctrl-C, a
crash or ``kill -9`` loses nothing that was committed and never runs a finished tape twice.

A failure of one tape (the agent, the environment, or anything unexpected) is recorded in that
tape's ``metadata.error`` and never stops the others. ``backend="ray"`` spreads the tapes over
a Ray cluster (see :mod:`tapekit.batch._ray`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from typing import Any, Unpack

from tapekit._loading import load_factory, load_object
from tapekit._sync import run_sync
from tapekit.agent import Agent
from tapekit.batch._config import DEFAULT_CONCURRENCY, BatchConfig, BatchOptions, check_inputs
from tapekit.batch._local import alocal
from tapekit.batch._results import BatchResult, BatchStats, batch_tags, batch_tape_id
from tapekit.core import Tape
from tapekit.environment import Environment

__all__ = [
    "DEFAULT_CONCURRENCY",
    "BatchOptions",
    "BatchResult",
    "BatchStats",
    "abatch",
    "batch",
    "batch_tags",
    "batch_tape_id",
    "load_factory",
    "load_object",
]


def abatch(
    agent: Agent,
    environment: Environment,
    tapes: Iterable[Tape[Any, Any]],
    **options: Unpack[BatchOptions],
) -> AsyncIterator[BatchResult]:
    """Run the main loop on every tape in ``tapes``; yield a :class:`BatchResult` as each
    tape finishes (not in input order).

    - ``max_concurrency``: how many tapes run at the same time.
    - ``llm_concurrency``: how many requests each LLM may have in flight: one int for every
      LLM, or ``{llm_key: int}`` by the keys of the agents' ``llms`` (others unlimited). The
      calls and tapes are the same as without a limit; only the timing changes.
    - ``store``: a :class:`~tapekit.store.TapeStore` (SQLite, PostgreSQL or memory; the Ray
      backend needs one its workers can open). Tapes are written as they run under
      :func:`batch_tape_id` and tagged (:func:`batch_tags`); running the same ``name`` again
      skips the done tapes (returned from the store) and resumes the others.
      ``retry_failed=True`` resumes the failed ones too.
    - ``max_loops``: agent/environment rounds per tape (a resumed tape counts the rounds its
      stored steps already made).
    - ``stats``: a :class:`BatchStats` the batch keeps up to date (for progress displays).
    - ``on_llm_call``: called with every LLM call the batch's tapes make, as it completes (in
      this process, so not with ``backend="ray"``); an exception it raises fails that tape.
    - ``backend="ray"``: spread the tapes over a Ray cluster (``ray.init`` is called if Ray
      is not initialised; ``RAY_ADDRESS`` picks the cluster). ``ray_workers`` tasks (default:
      the cluster's CPUs) each run a share of the tapes and of both concurrency limits;
      ``ray_factory`` (``module:attr``) makes the workers build the agent and environment
      themselves instead of unpickling them.

    Cancelling the iteration (Ctrl-C, ``task.cancel()``, ``break``) stops the running tapes,
    writes what they made, and flushes the store. Bad arguments raise here, before anything
    runs.
    """
    items = check_inputs(agent, environment, tapes)
    config = BatchConfig.of(agent, options)
    stats = config.stats if config.stats is not None else BatchStats()
    stats.total = len(items)
    stats.started_at = time.monotonic()
    config = replace(config, stats=stats)
    indexed = list(enumerate(items))
    if config.backend == "ray":
        from tapekit.batch._ray import aray_batch

        results = aray_batch(agent, environment, indexed, config)
    else:
        results = alocal(agent, environment, indexed, config)
    return _counted(results, stats)


async def _counted(results: AsyncIterator[BatchResult], stats: BatchStats) -> AsyncIterator[BatchResult]:
    try:
        async for result in results:
            stats._count(result)
            yield result
    finally:
        await results.aclose()  # type: ignore[attr-defined]


def batch(
    agent: Agent,
    environment: Environment,
    tapes: Iterable[Tape[Any, Any]],
    *,
    on_result: Callable[[BatchResult], None] | None = None,
    **options: Unpack[BatchOptions],
) -> list[BatchResult]:
    """Sync version of :func:`abatch` (same options): the results in input order (``on_result``
    sees each one as its tape finishes). Works inside a running event loop too (a notebook)."""

    async def collect() -> list[BatchResult]:
        out = []
        async for result in abatch(agent, environment, tapes, **options):
            if on_result is not None:
                on_result(result)
            out.append(result)
        return sorted(out, key=lambda r: r.index)

    return run_sync(collect())
