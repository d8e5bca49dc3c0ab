"""The Ray backend of :func:`tapekit.batch.abatch`: the tapes spread over a Ray cluster.

The tapes are dealt round-robin into one share per worker. Each worker is a Ray generator
task that runs the local batch (the same code as ``backend="local"``) on its share, with its
part of both concurrency limits, and streams each result back as its tape finishes, so the
driver yields results as they come, as the local backend does.

- **The agent and environment** travel pickled (cloudpickle, through the object store), or,
  with ``ray_factory="module:attr"``, each worker imports and calls the factory itself.
- **Tapes** travel as JSON (a tape's step buffer is shared and locked, so it is not pickled);
  the worker imports the modules of their step classes first, so every kind parses.
- **The store**: workers write to it themselves, exactly as a local batch does (every step as
  it is made, done tags, resume), so they must be able to open it: an SQLite file when every
  worker runs on the driver's machine, a PostgreSQL URL for a cluster of several machines.
  A worker commits each tape before reporting it, so a result the driver yields is stored.
- **Errors**: a tape's failure is recorded on its tape as locally. If a whole worker fails
  (it cannot import the agent's code, it is killed), each tape it had not reported is read
  back from the store: one the worker had committed as done before it died comes back as that
  stored tape (finished, with its own error if it had one; its LLM counters are 0, the worker
  never reported them); the others come back failed with that error and are not marked done,
  so the next run retries them. Ray itself does not retry a worker (``max_retries=0``): its
  replay of a generator task drops the results whose position was already reported, and a
  worker reports its tapes in the order they finish, which a replay does not repeat (one
  tape's result would come twice, another's never).

Ray is imported when a Ray batch starts, never with tapekit.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

from tapekit._loading import load_factory
from tapekit.agent import Agent
from tapekit.batch._config import BatchConfig
from tapekit.batch._local import alocal
from tapekit.batch._results import BatchResult, BatchStats, batch_tags, batch_tape_id
from tapekit.core import Tape
from tapekit.environment import Environment
from tapekit.store.base import TapeNotFoundError, TapeStore


def _split(total: int, parts: int, index: int) -> int:
    """Share ``index`` of ``total`` split into ``parts`` near-equal shares, at least 1."""
    return max(1, total // parts + (index < total % parts))


def _split_llm(llm_concurrency: Any, parts: int, index: int) -> Any:
    if llm_concurrency is None:
        return None
    if isinstance(llm_concurrency, int):
        return _split(llm_concurrency, parts, index)
    return {key: _split(limit, parts, index) for key, limit in llm_concurrency.items()}


def _store_address(store: TapeStore | None) -> str | None:
    """Where the workers open the store: a PostgreSQL DSN or an SQLite path."""
    if store is None:
        return None
    address = store.address
    if not address:
        raise ValueError(
            "the Ray backend needs a store its workers can open (an SQLite file or a PostgreSQL URL); "
            f"{type(store).__name__} lives in this process only (its address is None)"
        )
    return address


def _step_modules(tape: Tape[Any, Any]) -> set[str]:
    return {type(tape).__module__, *(type(step).__module__ for step in tape.steps)}


def _run_share(
    payload: Any,
    share: list[tuple[int, type[Tape[Any, Any]], str, list[str]]],
    config: BatchConfig,
    address: str | None,
) -> Iterator[dict[str, Any]]:
    """The body of one Ray worker: the local batch on ``share`` (with its part of the limits in
    ``config``) on the store it opens at ``address``, one result dict per tape."""
    from tapekit._sync import iterate_sync

    if isinstance(payload, str):
        agent, environment = load_factory(payload)
    else:
        agent, environment = payload
    items = []
    for index, tape_class, text, modules in share:
        for module in modules:
            importlib.import_module(module)
        items.append((index, tape_class.model_validate_json(text)))
    store = None
    if address is not None:
        from tapekit.store import open_store

        store = open_store(address)
    try:
        results = alocal(agent, environment, items, replace(config, store=store, stats=BatchStats()))
        for result in iterate_sync(results):
            if store is not None:
                store.flush()  # what the driver is told about is committed
            yield {
                "index": result.index,
                "start_id": result.start_id,
                "tape_id": result.tape_id,
                "tape": result.tape.model_dump_json(),
                "error": result.error,
                "skipped": result.skipped,
                "resumed": result.resumed,
                "external": result.external,
                "llm_calls": result.llm_calls,
                "prompt_tokens": result.prompt_tokens,
                "output_tokens": result.output_tokens,
            }
    finally:
        if store is not None:
            store.close()


def unreported_result(
    store: TapeStore | None, name: str, index: int, start: Tape[Any, Any], message: str
) -> BatchResult:
    """The result of input ``index`` (tape ``start``) of batch ``name`` whose Ray worker died
    before reporting it: the stored tape if the worker had committed it with the batch's done
    tag (it died between the commit and the report; its own error, if it finished with one),
    else ``start`` failed with ``message``."""
    start_id = start.metadata.id
    tape_id = batch_tape_id(name, start_id)
    if store is not None:
        try:
            if batch_tags(name)[1] in store.get_tape_info(tape_id).tags:
                stored = store.get_tape(tape_id, type(start))
                return BatchResult(index, start_id, tape_id, stored, stored.metadata.error)
        except TapeNotFoundError:
            pass
    return BatchResult(index, start_id, tape_id, start.with_metadata(error=message), message)


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError("backend='ray' needs Ray: pip install 'tapekit[ray]'") from e
    return ray


async def aray_batch(
    agent: Agent,
    environment: Environment,
    indexed: list[tuple[int, Tape[Any, Any]]],
    config: BatchConfig,
) -> AsyncIterator[BatchResult]:
    """Run ``indexed`` (input index, tape) on Ray workers; yield results as tapes finish.

    Calls ``ray.init()`` unless Ray is initialised (``RAY_ADDRESS`` picks a running cluster).
    """
    ray = _ray()
    store, stats, factory, name = config.store, config.stats, config.ray_factory, config.name
    max_concurrency = config.max_concurrency
    address = _store_address(store)
    if factory is not None:
        load_factory(factory)  # fail here, clearly, rather than in every worker
    if not indexed:
        return
    if store is not None:
        store.flush()  # the workers read the store from their own connections
    if not ray.is_initialized():
        ray.init()
    n = config.ray_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    n = min(n, len(indexed))
    payload: Any = factory if factory is not None else ray.put((agent, environment))
    run_share = ray.remote(_run_share).options(num_cpus=1, max_retries=0)  # see "Errors" above
    starts = dict(indexed)
    generators = []
    for w in range(n):
        share = [(i, type(t), t.model_dump_json(), sorted(_step_modules(t))) for i, t in indexed[w::n]]
        part = replace(  # plain data: it is pickled to the worker
            config,
            max_concurrency=_split(max_concurrency, n, w),
            llm_concurrency=_split_llm(config.llm_concurrency, n, w),
            store=None,
            stats=None,
            backend="local",
        )
        generators.append((run_share.remote(payload, share, part, address), [i for i, _ in indexed[w::n]]))
    queue: asyncio.Queue[BatchResult] = asyncio.Queue()
    total_concurrency = sum(_split(max_concurrency, n, w) for w in range(n))

    async def drain(generator: Any, indices: list[int]) -> None:
        reported: set[int] = set()
        try:
            async for ref in generator:
                data = await ref
                start = starts[data["index"]]
                tape = type(start).model_validate_json(data.pop("tape"))
                reported.add(data["index"])
                queue.put_nowait(BatchResult(tape=tape, **data))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the worker itself failed: its unreported tapes fail with it
            message = f"the Ray worker failed: {type(e).__name__}: {e}"
            for index in indices:
                if index not in reported:
                    result = await asyncio.to_thread(
                        unreported_result, store, name, index, starts[index], message
                    )
                    queue.put_nowait(result)

    tasks = [asyncio.create_task(drain(g, indices)) for g, indices in generators]
    try:
        for finished in range(len(indexed)):
            stats.running = min(total_concurrency, len(indexed) - finished)
            result = await queue.get()
            stats.llm_calls += result.llm_calls
            stats.prompt_tokens += result.prompt_tokens
            stats.output_tokens += result.output_tokens
            yield result
        stats.running = 0
    finally:
        for task in tasks:
            task.cancel()
        for generator, _ in generators:  # stop the workers: they write what they made and flush
            with contextlib.suppress(Exception):
                ray.cancel(generator)
        await asyncio.gather(*tasks, return_exceptions=True)
