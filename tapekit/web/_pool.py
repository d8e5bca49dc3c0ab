"""The browser pool under :class:`~tapekit.web.WebEnvironment`: one headless Chromium and the pages
open on it. It knows pages, not episodes.

:class:`BrowserPool` keeps one Chromium (Debian's ``/usr/bin/chromium`` unless told otherwise;
never a downloaded browser) driven by async Playwright on an event loop of its own, in a daemon
thread, so that it serves any caller: ``main_loop``'s private loop, an ``async`` application,
``evaluate``'s batch runner. Each page gets a browser context of its own.

- **Launch and relaunch.** The browser starts with the first call that needs it. A browser that
  crashed or was killed is relaunched by the next call; so is one on which ``restart_after_hangs``
  page loads in a row hung (no load finished between them): a browser in trouble hangs every
  load, not one. A context that does not close means the same: the browser is relaunched.
- **Deadlines.** Every browser call runs under :meth:`BrowserPool.guard`: past its deadline it
  raises :class:`PageHung`; a call whose page, context or browser closed raises
  :class:`BrowserGone`. ``stats`` counts both.
- **Spare pages.** Starting a page's renderer process is the largest part of a reset, so
  ``prewarm`` blank pages are made ahead of time, in the background.
- **Bounded.** At most ``max_concurrent`` callers hold a slot (:attr:`BrowserPool.slots`) at
  once, and at most ``max_open`` pages stay open between uses: the least recently used idle one
  is closed first (evicted).
- **No stray processes.** :meth:`~BrowserPool.close` / :meth:`~BrowserPool.aclose` close the
  browser and its driver, killing the process tree if closing does not finish; the same happens
  when the pool is garbage-collected or the interpreter exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tapekit.core import new_id
from tapekit.errors import TapekitError
from tapekit.web import _procs
from tapekit.web._js import TIMER_TRACKER
from tapekit.web.task import WebEnvironmentError

logger = logging.getLogger("tapekit.web.environment")  # the records' name predates the split
_T = TypeVar("_T")

DEFAULT_CHROMIUM = os.environ.get("TAPEKIT_CHROMIUM", "/usr/bin/chromium")
"""The browser executable: ``$TAPEKIT_CHROMIUM``, else Debian's ``/usr/bin/chromium``."""

CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
"""Switches every launch gets (Playwright adds ``--headless``)."""


class PageHung(TapekitError):
    """A browser call passed its deadline: the page is stuck."""


class BrowserGone(TapekitError):
    """The browser (or the page) closed under us: a crash or a kill."""


@dataclass(kw_only=True)
class OpenPage:
    """A browser context with one page and its CDP session, made on the browser's
    ``generation``-th launch. A page kept open between uses is registered under its ``id``
    (:meth:`BrowserPool.keep`); a ``busy`` one is never evicted."""

    context: Any
    page: Any
    cdp: Any
    generation: int
    id: str = ""
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)

    def handles(self) -> dict[str, Any]:
        """The browser's handles of this page (context, page, CDP session, generation): what a
        record of the same page is made from."""
        return {"context": self.context, "page": self.page, "cdp": self.cdp, "generation": self.generation}


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (its type's name when it has none)."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _is_closed_error(error: BaseException) -> bool:
    text = str(error)
    return any(
        s in text
        for s in (
            "Target page, context or browser has been closed",
            "Target closed",
            "Browser has been closed",
            "Target crashed",
            "Connection closed",
            "has been closed",
        )
    )


class _Runner:
    """An event loop in a daemon thread: the browser's home."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="tapekit-browser", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_closed() or threading.current_thread() is self.thread:
            return
        if self.loop.is_running():
            # a few turns of the loop: closed subprocess transports finish their callbacks
            with contextlib.suppress(Exception):
                self.submit(asyncio.sleep(0.05)).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


def _kill_marked(marker: str) -> None:
    """Kill the browser launched with ``marker`` and its process tree."""
    pid = _procs.find_marked(marker)
    if pid is not None:
        _procs.kill_tree(pid)


@dataclass
class _Leftovers:
    """What a finaliser must stop if the pool is dropped without being closed: the browser (by
    its marker), Playwright's driver process and the loop thread."""

    marker: str
    driver_pid: int | None = None
    runner: _Runner | None = None
    playwright: Any = None

    def clean(self) -> None:
        """Kill the browser, stop Playwright's driver and the loop thread. Runs in whatever
        thread collects the pool, the loop's own included (then it cannot wait there)."""
        _kill_marked(self.marker)
        runner, playwright = self.runner, self.playwright
        if runner is not None and threading.current_thread() is runner.thread:
            runner.loop.create_task(self._finish_in_loop(playwright))
            return
        if playwright is not None and runner is not None and runner.loop.is_running():
            # let Playwright close its driver, so that nothing is left to the loop's garbage
            with contextlib.suppress(Exception):
                runner.submit(playwright.stop()).result(timeout=10)
        self._kill_driver()
        if runner is not None:
            runner.stop()

    def _kill_driver(self) -> None:
        if self.driver_pid is not None and _procs.alive(self.driver_pid):
            _procs.kill_tree(self.driver_pid)

    async def _finish_in_loop(self, playwright: Any) -> None:
        if playwright is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(playwright.stop(), 10)
        self._kill_driver()
        asyncio.get_running_loop().stop()


class BrowserPool:
    """One Chromium, its pages and their deadlines (see the module docstring).

    Methods marked *loop side* run on the pool's own event loop: submit a coroutine that calls
    them with :meth:`submit`. The settings are :class:`~tapekit.web.WebEnvironment`'s arguments
    of the same names (their defaults are the environment's).

    ``stats`` counts ``launches``, ``hangs`` (calls past their deadline), ``crashes`` (a browser
    or page that closed under a call), ``restarts`` (relaunches after ``restart_after_hangs``
    hung loads in a row), and, for its user, ``episodes`` and ``replays``.
    """

    def __init__(
        self,
        *,
        executable: str | None,
        max_concurrent: int,
        max_open: int | None,
        action_timeout_s: float,
        timeout_s: float,
        prewarm: int,
        chromium_args: Sequence[str],
        restart_after_hangs: int | None,
        name: str,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        if restart_after_hangs is not None and restart_after_hangs < 1:
            raise ValueError(f"restart_after_hangs must be at least 1 or None, got {restart_after_hangs}")
        self.name = name
        self.executable = executable or DEFAULT_CHROMIUM
        self.max_concurrent = max_concurrent
        self.max_open = max(max_open or 2 * max_concurrent, max_concurrent)
        self.action_timeout_s = action_timeout_s
        self.timeout_s = timeout_s
        self.prewarm = max(0, prewarm)
        self.chromium_args = tuple(chromium_args)
        self.restart_after_hangs = restart_after_hangs
        self.pages: dict[str, OpenPage] = {}
        """The pages kept open between uses, by id (loop side)."""
        self.stats: dict[str, int] = {
            "launches": 0,
            "replays": 0,
            "hangs": 0,
            "crashes": 0,
            "restarts": 0,
            "episodes": 0,
        }
        self._hangs_in_row = 0  # page loads that hung on this browser since one last finished
        self._marker = f"--tapekit-browser={new_id()}"
        self._runner: _Runner | None = None
        self._runner_lock = threading.Lock()
        self._closed = False
        # state owned by the runner's loop
        self._pw: Any = None
        self._browser: Any = None
        self._generation = 0
        self._launch_lock: asyncio.Lock | None = None
        self._slots: asyncio.Semaphore | None = None
        self._spares: list[OpenPage] = []
        self._refills: set[asyncio.Task[None]] = set()
        self._viewport: tuple[int, int] = (800, 600)
        self._closing = False
        self._leftovers = _Leftovers(self._marker)
        self._finalizer = weakref.finalize(self, self._leftovers.clean)

    # ------------------------------------------------------------------ any thread

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Run ``coro`` on the pool's loop (started on first use); raises once the pool is closed."""
        if self._closed:
            coro.close()
            raise WebEnvironmentError(f"{self.name}: the environment is closed")
        with self._runner_lock:
            if self._runner is None:
                self._runner = self._leftovers.runner = _Runner()
        return self._runner.submit(coro)

    async def astart(self) -> None:
        """Launch the browser now (it is otherwise launched by the first call that needs it)."""
        await asyncio.wrap_future(self.submit(self.ensure_browser()))

    async def aclose(self) -> None:
        """Close every page, the browser and its driver; kill what does not close in time."""
        if self._closed:
            return
        if self._runner is not None:
            future = self.submit(self._shutdown())
            try:
                await asyncio.wait_for(asyncio.wrap_future(future), timeout=self.timeout_s + 5)
            except Exception as e:  # a browser that does not close: kill it below
                logger.warning("%s: closing the browser failed (%s); killing it", self.name, e)
        self._closed = True
        await asyncio.to_thread(self._finalizer)  # kills nothing if the shutdown went well

    def close(self) -> None:
        """Sync version of :meth:`aclose`."""
        if self._closed:
            return
        if self._runner is not None:
            try:
                self.submit(self._shutdown()).result(timeout=self.timeout_s + 5)
            except Exception as e:
                logger.warning("%s: closing the browser failed (%s); killing it", self.name, e)
        self._closed = True
        self._finalizer()  # kills nothing if the shutdown went well; stops the loop thread

    def browser_pids(self) -> list[int]:
        """The pids of the browser's processes (main process first; empty if none runs).
        Linux only: for tests and diagnostics."""
        pid = _procs.find_marked(self._marker)
        return [] if pid is None else [pid, *_procs.descendants(pid)]

    # ------------------------------------------------------------------ the browser (loop side)

    @property
    def slots(self) -> asyncio.Semaphore:
        """The ``max_concurrent`` slots of the browser (made by the first launch)."""
        assert self._slots is not None, "the pool has not started: await ready() first"
        return self._slots

    async def ready(self) -> None:
        """Launch the browser if it never was (later relaunches happen where needed)."""
        if self._slots is None:
            await self.ensure_browser()

    async def ensure_browser(self) -> Any:
        """The running browser; launched (again, after a crash) if there is none."""
        if self._launch_lock is None:
            self._launch_lock = asyncio.Lock()
            self._slots = asyncio.Semaphore(self.max_concurrent)
        async with self._launch_lock:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            if self._browser is not None:  # crashed or killed: clear what is left
                self.stats["crashes"] += 1
                await self._drop_browser()
            try:
                from playwright.async_api import async_playwright
            except ImportError as e:
                raise WebEnvironmentError(
                    "the browser environment needs Playwright: pip install 'tapekit[web]' "
                    "(no `playwright install`: it drives the system's Chromium)"
                ) from e
            if not os.path.exists(self.executable):
                raise WebEnvironmentError(
                    f"no browser at {self.executable}: install Debian's chromium "
                    "(scripts/install-system.sh), set $TAPEKIT_CHROMIUM or pass executable="
                )
            if self._pw is None:
                self._pw = await asyncio.wait_for(async_playwright().start(), self.timeout_s * 3)
                self._leftovers.playwright = self._pw
            try:
                self._browser = await asyncio.wait_for(
                    self._pw.chromium.launch(
                        executable_path=self.executable,
                        headless=True,
                        args=[*CHROMIUM_ARGS, *self.chromium_args, self._marker],
                        timeout=self.timeout_s * 3000,
                    ),
                    self.timeout_s * 3,
                )
            except Exception as e:
                _kill_marked(self._marker)
                raise WebEnvironmentError(
                    f"{self.name}: Chromium ({self.executable}) did not start: {e}"
                ) from e
            self._generation += 1
            self._hangs_in_row = 0
            self.stats["launches"] += 1
            pid = _procs.find_marked(self._marker)
            if pid is not None and self._leftovers.driver_pid is None:
                self._leftovers.driver_pid = _procs.parent(pid)
            return self._browser

    def current(self, page: OpenPage) -> bool:
        """Whether ``page`` was made on the browser that runs now."""
        connected = self._browser is not None and self._browser.is_connected()
        return connected and page.generation == self._generation

    async def guard(self, coro: Coroutine[Any, Any, _T], what: str, timeout_s: float | None = None) -> _T:
        """Run one browser call under its deadline (``timeout_s``, default the pool's): past it
        :class:`PageHung`; a closed target becomes :class:`BrowserGone`."""
        try:
            return await asyncio.wait_for(coro, timeout_s or self.timeout_s)
        except TimeoutError:
            raise PageHung(f"{what} did not finish within {timeout_s or self.timeout_s:g} s") from None
        except Exception as e:
            if self._browser is None or not self._browser.is_connected() or _is_closed_error(e):
                raise BrowserGone(f"{what}: {first_line(e)}") from e
            raise

    def count(self, error: BaseException) -> None:
        """Count a hang or a crash in ``stats`` (other errors are not counted)."""
        if isinstance(error, PageHung):
            self.stats["hangs"] += 1
        elif isinstance(error, BrowserGone):
            self.stats["crashes"] += 1

    async def _drop_browser(self) -> None:
        """Forget the browser and its pages; close it, or kill it if it does not close."""
        browser, self._browser = self._browser, None
        self.pages.clear()
        self._spares.clear()
        if browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), self.timeout_s)
        _kill_marked(self._marker)

    async def _shutdown(self) -> None:
        self._closing = True
        for job in list(self._refills):
            job.cancel()
        await asyncio.gather(*self._refills, return_exceptions=True)
        for spare in self._spares:
            await self._close_context(spare)
        self._spares.clear()
        for page in list(self.pages.values()):
            await self.close_page(page)
        await self._drop_browser()
        if self._pw is not None:
            pw, self._pw = self._pw, None
            self._leftovers.playwright = None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pw.stop(), self.timeout_s)

    # ------------------------------------------------------------------ pages (loop side)

    async def new_page(self, viewport: tuple[int, int]) -> OpenPage:
        """A blank page (not yet kept) for a new use, ``viewport`` (width, height) in size: idle
        pages over ``max_open`` are closed first, and a spare made ahead is taken when there is
        one (the browser is launched if it does not run)."""
        await self.ensure_browser()
        await self._evict()
        self._viewport = viewport
        while self._spares:
            spare = self._spares.pop(0)
            if spare.generation == self._generation and not spare.page.is_closed():
                self._refill()
                size = {"width": viewport[0], "height": viewport[1]}
                if spare.page.viewport_size != size:
                    await self.guard(spare.page.set_viewport_size(size), "viewport")
                return spare
            await self._close_context(spare)
        fresh = await self._blank_page(viewport)
        self._refill()
        return fresh

    async def load(self, page: OpenPage, coro: Coroutine[Any, Any, _T], what: str) -> _T:
        """Run ``coro``, loading ``page``, under the deadline. A load that fails closes the
        page; one that hangs counts towards ``restart_after_hangs``; one that finishes on the
        current browser ends the count."""
        try:
            result = await self.guard(coro, what)
        except BaseException as e:
            await self._close_context(page)
            if isinstance(e, PageHung):
                await self._load_hung(page.generation)
            raise
        if page.generation == self._generation:
            self._hangs_in_row = 0
        return result

    def keep(self, page: OpenPage) -> None:
        """Keep ``page`` open under its ``id`` between uses (until evicted or closed)."""
        self.pages[page.id] = page

    async def close_page(self, page: OpenPage) -> None:
        """Close ``page`` and forget it (a browser whose page does not close is relaunched)."""
        if self.pages.get(page.id) is page:
            del self.pages[page.id]
        await self._close_context(page)

    async def _load_hung(self, generation: int) -> None:
        """Count a page load that hung on browser ``generation``; relaunch the browser (by
        dropping it: the next call launches one) after ``restart_after_hangs`` in a row on the
        current one. Loads that hung on a browser already replaced do not count."""
        if self.restart_after_hangs is None or generation != self._generation or self._browser is None:
            return
        self._hangs_in_row += 1
        if self._hangs_in_row >= self.restart_after_hangs:
            logger.warning(
                "%s: %d page loads in a row hung; restarting the browser", self.name, self._hangs_in_row
            )
            self._hangs_in_row = 0
            self.stats["restarts"] += 1
            await self._drop_browser()

    async def _blank_page(self, viewport: tuple[int, int]) -> OpenPage:
        """A new context with one blank page (timer tracker installed) and its CDP session."""
        browser = await self.ensure_browser()
        generation = self._generation
        width, height = viewport
        context = await self.guard(
            browser.new_context(viewport={"width": width, "height": height}), "new context"
        )
        try:
            await self.guard(context.add_init_script(TIMER_TRACKER), "init script")
            context.set_default_timeout(self.action_timeout_s * 1000)
            page = await self.guard(context.new_page(), "new page")
            cdp = await self.guard(context.new_cdp_session(page), "CDP session")
        except BaseException:
            await self._close_context(OpenPage(context=context, page=None, cdp=None, generation=generation))
            raise
        return OpenPage(context=context, page=page, cdp=cdp, generation=generation)

    def _refill(self) -> None:
        """Start making spare pages in the background, up to ``prewarm`` of them."""
        while self.prewarm and len(self._spares) + len(self._refills) < self.prewarm and not self._closing:
            job = asyncio.get_running_loop().create_task(self._make_spare())
            self._refills.add(job)
            job.add_done_callback(self._refills.discard)

    async def _make_spare(self) -> None:
        try:
            spare = await self._blank_page(self._viewport)
        except Exception as e:  # the next use makes its own page and says what is wrong
            logger.debug("%s: no spare page: %s", self.name, e)
            return
        if self._closing or spare.generation != self._generation:
            await self._close_context(spare)
        else:
            self._spares.append(spare)

    async def _evict(self) -> None:
        idle = [p for p in self.pages.values() if not p.busy]
        while len(self.pages) >= self.max_open and idle:
            oldest = min(idle, key=lambda p: p.last_used)
            idle.remove(oldest)
            await self.close_page(oldest)

    async def _close_context(self, page: OpenPage) -> None:
        try:
            await asyncio.wait_for(page.context.close(), self.timeout_s)
        except Exception:
            # a context that does not close means a browser in trouble: start over
            if self.current(page):
                logger.warning("%s: a page did not close; restarting the browser", self.name)
                await self._drop_browser()
