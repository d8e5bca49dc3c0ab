"""Drive tapekit's async core from synchronous code.

tapekit has one implementation of every loop, and it is async; the sync API is a thin layer
that runs it on a private event loop. When the calling thread already runs an event loop (a
notebook, an async web handler), the private loop lives in a helper thread instead, because a
thread can run only one loop at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

_T = TypeVar("_T")
_DONE = object()


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _kept(coro: Coroutine[Any, Any, _T], box: list[_T]) -> None:
    box.append(await coro)


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion from sync code and return its result.

    The result is handed back through a list, not as the main task's result: at its end,
    ``asyncio.run`` in the main thread reads the SIGINT handler it installed, and Python's
    ``signal.getsignal`` then builds the ``repr`` of that handler, of the finished task and of
    the task's result. For a long tape or a large report that repr costs time proportional to
    its size on every sync call (86 ms per call at 4,000 steps, measured by bench/web_agent.py).
    """
    if not _loop_running():
        box: list[_T] = []
        asyncio.run(_kept(coro, box))
        return box[0]
    result: list[Any] = []

    def target() -> None:
        try:
            result.append((True, asyncio.run(coro)))
        except BaseException as e:  # re-raised in the caller's thread
            result.append((False, e))

    thread = threading.Thread(target=target, name="tapekit-sync", daemon=True)
    thread.start()
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def iterate_sync(agen: AsyncIterator[_T]) -> Iterator[_T]:
    """Iterate an async iterator from sync code, one item at a time.

    Closing the returned generator early (``break``) closes the async iterator too, so the
    async code's ``finally`` blocks run.
    """
    if _loop_running():
        yield from _iterate_in_thread(agen)
        return
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                item = loop.run_until_complete(agen.__anext__())  # type: ignore[arg-type]
            except StopAsyncIteration:
                return
            yield item
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            loop.run_until_complete(aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _iterate_in_thread(agen: AsyncIterator[_T]) -> Iterator[_T]:
    items: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    async def pump() -> None:
        try:
            async for item in agen:
                items.put((True, item))
                if stop.is_set():
                    break
            items.put((True, _DONE))
        except BaseException as e:
            items.put((False, e))
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                await aclose()

    thread = threading.Thread(target=asyncio.run, args=(pump(),), name="tapekit-sync", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = items.get()
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock the pump if it waits on a full queue
            with contextlib.suppress(queue.Empty):
                items.get_nowait()
            thread.join(timeout=0.01)


async def iterate_in_thread(
    make_items: Callable[[], Iterable[_T]], name: str = "tapekit-worker"
) -> AsyncIterator[_T]:
    """Run a blocking iterable in a worker thread and receive its items on the event loop.

    The opposite direction of :func:`iterate_sync`: it keeps a model's blocking token loop off
    the event loop. An exception in the worker is raised here; if the consumer stops early, the
    worker stops after its current item.
    """
    queue: asyncio.Queue[Any] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    stopped = threading.Event()

    def worker() -> None:
        try:
            for item in make_items():
                if stopped.is_set():
                    break
                loop.call_soon_threadsafe(queue.put_nowait, (True, item))
            loop.call_soon_threadsafe(queue.put_nowait, (True, _DONE))
        except BaseException as e:
            loop.call_soon_threadsafe(queue.put_nowait, (False, e))

    threading.Thread(target=worker, name=name, daemon=True).start()
    try:
        while True:
            ok, item = await queue.get()
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        stopped.set()
