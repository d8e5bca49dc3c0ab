"""The browser environment: web actions on a tape answered by a real Chromium.

:class:`WebEnvironment` keeps one headless Chromium (Debian's ``/usr/bin/chromium`` unless told
otherwise; never a downloaded browser) driven by async Playwright on an event loop of its own, in
a daemon thread, so the environment works from any caller: ``main_loop``'s private loop, an
``async`` application, ``evaluate``'s batch runner. Each episode gets a fresh browser context.

- **Episodes are tapes.** A start tape holds :class:`~tapekit.web.steps.OpenTask`; the
  environment answers it with the first :class:`~tapekit.web.steps.WebObservation` and every
  later action with the next one. The page of a running episode stays open between steps; a tape
  whose page is gone (another process, a fork from an earlier step, an evicted or crashed page)
  gets a fresh page on which the tape's earlier actions are replayed first, so any cut resumes.
- **Bounded.** At most ``max_concurrent`` episodes use the browser at once and at most
  ``max_open`` pages stay open (the least recently used idle one is closed first; it is
  replayed if its tape comes back).
- **Never hangs.** Every browser call has a deadline. A page that does not answer (a script
  that loops forever, a page that never loads) ends its episode with an error observation and
  its context is closed; if even that hangs, the browser is killed and relaunched. So is a
  browser on which ``restart_after_hangs`` page loads in a row hung (no load finished between
  them): a browser in trouble hangs every load, not one. A browser that crashed is relaunched
  and the episode replayed; the observation says the action was not performed.
- **No stray processes.** :meth:`close` / :meth:`aclose` (or leaving ``with`` / ``async with``)
  closes the browser and its driver, killing the process tree if closing does not finish; the
  same happens when the environment is garbage-collected or the interpreter exits.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from tapekit.core import Observation, Tape, new_id
from tapekit.environment import ENVIRONMENT_FAILURE, Environment, UnknownActionError, unanswered_actions
from tapekit.errors import TapekitError
from tapekit.web import _procs
from tapekit.web._js import HTML_TAGS, SETTLE_AND_MARK, TIMER_TRACKER
from tapekit.web.axtree import flatten_axtree, snapshot_bids
from tapekit.web.steps import (
    Click,
    Fill,
    GoBack,
    Hover,
    Noop,
    OpenTask,
    Press,
    Scroll,
    SelectOption,
    SendMsgToUser,
    WebAction,
    WebObservation,
)
from tapekit.web.task import TaskStatus, WebTask

__all__ = [
    "CHROMIUM_ARGS",
    "DEFAULT_CHROMIUM",
    "FILL_FORMATS",
    "WebEnvironment",
    "WebEnvironmentError",
    "fill_problem",
]

logger = logging.getLogger(__name__)
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


class WebEnvironmentError(TapekitError, RuntimeError):
    """The browser environment cannot work: no Playwright, no browser executable, a launch that
    fails, or a tape it cannot make sense of (a web action before any ``OpenTask``)."""


class _PageHung(TapekitError):
    """A browser call passed its deadline: the page is stuck."""


class _BrowserGone(TapekitError):
    """The browser (or the episode's page) closed under us: a crash or a kill."""


@dataclass
class _Episode:
    id: str
    task: WebTask
    seed: int
    goal: str
    context: Any
    page: Any
    cdp: Any
    generation: int
    max_steps: int = 10
    history: list[str] = field(default_factory=list)
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class _TapeState:
    """Where a tape's current episode stands: its OpenTask, the web actions already answered
    since, and the last observation."""

    open: OpenTask | None = None
    answered: list[WebAction] = field(default_factory=list)
    last: WebObservation | None = None

    @classmethod
    def of(cls, tape: Tape[Any, Any]) -> _TapeState:
        """The state before the tape's unanswered actions (those after its last observation)."""
        state = cls()
        steps = list(tape.steps)
        answered = max((i + 1 for i, s in enumerate(steps) if isinstance(s, Observation)), default=0)
        for step in steps[:answered]:
            if isinstance(step, OpenTask):
                state = cls(open=step)
            elif isinstance(step, WebAction) and state.open is not None:
                state.answered.append(step)
            elif isinstance(step, WebObservation) and state.open is not None:
                state.last = step
        return state


def _signature(action: WebAction) -> str:
    return action.call()


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
    """What a finaliser must stop if the environment is dropped without being closed: the
    browser (by its marker), Playwright's driver process and the loop thread."""

    marker: str
    driver_pid: int | None = None
    runner: _Runner | None = None
    playwright: Any = None

    def clean(self) -> None:
        """Kill the browser, stop Playwright's driver and the loop thread. Runs in whatever
        thread collects the environment, the loop's own included (then it cannot wait there)."""
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


class WebEnvironment(Environment):
    """A Chromium that answers :mod:`tapekit.web.steps` actions (see the module docstring).

    Args:
        tasks: the tasks :class:`~tapekit.web.steps.OpenTask` may name (objects or a name →
            task mapping). Names ``miniwob.<task>`` not listed resolve to MiniWob++ tasks.
        executable: the Chromium binary (default :data:`DEFAULT_CHROMIUM`).
        max_concurrent: episodes using the browser at the same time.
        max_open: pages kept open between steps (default ``2 * max_concurrent``).
        action_timeout_s: Playwright's wait for an element to be actionable; past it the action
            fails with an error observation and the episode goes on.
        timeout_s: the deadline of every browser call (a page load, an observation, an action);
            past it the page counts as hung and its episode ends.
        settle_max_ms: after an action, the page is observed once the short timers due within
            this many milliseconds have fired (a late one is waited for up to 4 times as long,
            for loaded machines) and its animations are done, at most this long (BrowserGym
            sleeps a fixed 500 ms).
        screenshots: put a base64 PNG of the viewport on every observation.
        prewarm: blank pages kept ready for the next episodes (0: none); starting a page's
            renderer is the largest part of a reset, and a spare is started in the background.
        axtree_max_chars: cut longer trees (None: never).
        chromium_args: extra command-line switches.
        restart_after_hangs: relaunch the browser once this many page loads in a row hung on it
            (None: never); the episodes still open on it are replayed on the new one.
            ``stats["restarts"]`` counts such relaunches.
    """

    def __init__(
        self,
        tasks: Mapping[str, WebTask] | Iterable[WebTask] | None = None,
        *,
        executable: str | None = None,
        max_concurrent: int = 2,
        max_open: int | None = None,
        action_timeout_s: float = 2.0,
        timeout_s: float = 10.0,
        settle_max_ms: int = 500,
        screenshots: bool = False,
        prewarm: int = 1,
        axtree_max_chars: int | None = 4000,
        chromium_args: Sequence[str] = (),
        restart_after_hangs: int | None = 3,
        name: str = "browser",
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        if restart_after_hangs is not None and restart_after_hangs < 1:
            raise ValueError(f"restart_after_hangs must be at least 1 or None, got {restart_after_hangs}")
        self.name = name
        if tasks is None:
            self.tasks: dict[str, WebTask] = {}
        elif isinstance(tasks, Mapping):
            self.tasks = dict(tasks)
        else:
            self.tasks = {t.name: t for t in tasks}
        self.executable = executable or DEFAULT_CHROMIUM
        self.max_concurrent = max_concurrent
        self.max_open = max(max_open or 2 * max_concurrent, max_concurrent)
        self.action_timeout_s = action_timeout_s
        self.timeout_s = timeout_s
        self.settle_max_ms = settle_max_ms
        self.screenshots = screenshots
        self.prewarm = max(0, prewarm)
        self.axtree_max_chars = axtree_max_chars
        self.chromium_args = tuple(chromium_args)
        self.restart_after_hangs = restart_after_hangs
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
        self._episodes: dict[str, _Episode] = {}
        self._spares: list[tuple[Any, Any, Any, int]] = []
        self._refills: set[asyncio.Task[None]] = set()
        self._viewport: tuple[int, int] = (800, 600)
        self._closing = False
        self._leftovers = _Leftovers(self._marker)
        self._finalizer = weakref.finalize(self, self._leftovers.clean)
        self.stats: dict[str, int] = {
            "launches": 0,
            "replays": 0,
            "hangs": 0,
            "crashes": 0,
            "restarts": 0,
            "episodes": 0,
        }

    # ------------------------------------------------------------------ lifecycle

    def _call(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        if self._closed:
            coro.close()
            raise WebEnvironmentError(f"{self.name}: the environment is closed")
        with self._runner_lock:
            if self._runner is None:
                self._runner = self._leftovers.runner = _Runner()
        return self._runner.submit(coro)

    async def astart(self) -> Self:
        """Launch the browser now (it is otherwise launched by the first episode)."""
        await asyncio.wrap_future(self._call(self._ensure_browser()))
        return self

    async def aclose(self) -> None:
        """Close every page, the browser and its driver; kill what does not close in time."""
        if self._closed:
            return
        if self._runner is not None:
            future = self._call(self._shutdown())
            try:
                await asyncio.wait_for(asyncio.wrap_future(future), timeout=self.timeout_s + 5)
            except Exception as e:  # a browser that does not close: kill it below
                logger.warning("%s: closing the browser failed (%s); killing it", self.name, e)
        self._closed = True
        await asyncio.to_thread(self._stop_runner)

    def close(self) -> None:
        """Sync version of :meth:`aclose`."""
        if self._closed:
            return
        if self._runner is not None:
            try:
                self._call(self._shutdown()).result(timeout=self.timeout_s + 5)
            except Exception as e:
                logger.warning("%s: closing the browser failed (%s); killing it", self.name, e)
        self._closed = True
        self._stop_runner()

    def _stop_runner(self) -> None:
        self._finalizer()  # kills nothing if the shutdown went well; stops the loop thread

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def browser_pids(self) -> list[int]:
        """The pids of the browser's processes (main process first; empty if none runs).
        Linux only: for tests and diagnostics."""
        pid = _procs.find_marked(self._marker)
        return [] if pid is None else [pid, *_procs.descendants(pid)]

    # ------------------------------------------------------------------ the browser (runner loop)

    async def _ensure_browser(self) -> Any:
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

    async def _drop_browser(self) -> None:
        """Forget the browser and its pages; close it, or kill it if it does not close."""
        browser, self._browser = self._browser, None
        self._episodes.clear()
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
        for context, _page, _cdp, generation in self._spares:
            await self._close_context(context, generation)
        self._spares.clear()
        for episode in list(self._episodes.values()):
            await self._close_episode(episode)
        await self._drop_browser()
        if self._pw is not None:
            pw, self._pw = self._pw, None
            self._leftovers.playwright = None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pw.stop(), self.timeout_s)

    async def _guard(self, coro: Coroutine[Any, Any, _T], what: str, timeout_s: float | None = None) -> _T:
        """Run one browser call under its deadline; a closed target becomes :class:`_BrowserGone`."""
        try:
            return await asyncio.wait_for(coro, timeout_s or self.timeout_s)
        except TimeoutError:
            raise _PageHung(f"{what} did not finish within {timeout_s or self.timeout_s:g} s") from None
        except Exception as e:
            if self._browser is None or not self._browser.is_connected() or _is_closed_error(e):
                raise _BrowserGone(f"{what}: {_first_line(e)}") from e
            raise

    # ------------------------------------------------------------------ episodes (runner loop)

    def task(self, name: str) -> WebTask:
        """The task called ``name`` (``miniwob.<task>`` resolves to MiniWob++'s)."""
        known = self.tasks.get(name)
        if known is not None:
            return known
        if name.startswith("miniwob."):
            from tapekit.web.miniwob import MiniWobTask

            task = MiniWobTask(name.removeprefix("miniwob."))
            self.tasks[name] = task
            return task
        raise WebEnvironmentError(
            f"{self.name}: unknown task {name!r}; known: {', '.join(sorted(self.tasks)) or 'none'} "
            "and miniwob.<task>"
        )

    async def _new_episode(
        self, task: WebTask, seed: int, episode_id: str, max_steps: int | None
    ) -> _Episode:
        await self._ensure_browser()
        await self._evict()
        context, page, cdp, generation = await self._fresh_page(task.viewport)
        try:
            goal = await self._guard(task.setup(page, seed, self.timeout_s), f"loading {task.name}")
        except BaseException as e:
            await self._close_context(context, generation)
            if isinstance(e, _PageHung):
                await self._load_hung(generation)
            raise
        if generation == self._generation:
            self._hangs_in_row = 0
        episode = _Episode(episode_id, task, seed, goal, context, page, cdp, generation)
        episode.max_steps = max_steps or task.max_steps
        self._episodes[episode_id] = episode
        self.stats["episodes"] += 1
        return episode

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

    async def _blank_page(self, viewport: tuple[int, int]) -> tuple[Any, Any, Any, int]:
        """A new context with one blank page (timer tracker installed) and its CDP session."""
        browser = await self._ensure_browser()
        generation = self._generation
        width, height = viewport
        context = await self._guard(
            browser.new_context(viewport={"width": width, "height": height}), "new context"
        )
        try:
            await self._guard(context.add_init_script(TIMER_TRACKER), "init script")
            context.set_default_timeout(self.action_timeout_s * 1000)
            page = await self._guard(context.new_page(), "new page")
            cdp = await self._guard(context.new_cdp_session(page), "CDP session")
        except BaseException:
            await self._close_context(context, generation)
            raise
        return context, page, cdp, generation

    async def _fresh_page(self, viewport: tuple[int, int]) -> tuple[Any, Any, Any, int]:
        """A blank page for an episode: a spare made ahead of time when there is one (a new
        page starts a renderer process, the largest part of a reset), else a new one."""
        self._viewport = viewport
        while self._spares:
            context, page, cdp, generation = self._spares.pop(0)
            if generation == self._generation and not page.is_closed():
                self._refill()
                if page.viewport_size != {"width": viewport[0], "height": viewport[1]}:
                    await self._guard(
                        page.set_viewport_size({"width": viewport[0], "height": viewport[1]}), "viewport"
                    )
                return context, page, cdp, generation
            await self._close_context(context, generation)
        fresh = await self._blank_page(viewport)
        self._refill()
        return fresh

    def _refill(self) -> None:
        """Start making spare pages in the background, up to ``prewarm`` of them."""
        while self.prewarm and len(self._spares) + len(self._refills) < self.prewarm and not self._closing:
            job = asyncio.get_running_loop().create_task(self._make_spare())
            self._refills.add(job)
            job.add_done_callback(self._refills.discard)

    async def _make_spare(self) -> None:
        try:
            spare = await self._blank_page(self._viewport)
        except Exception as e:  # the next episode makes its own page and says what is wrong
            logger.debug("%s: no spare page: %s", self.name, e)
            return
        if self._closing or spare[3] != self._generation:
            await self._close_context(spare[0], spare[3])
        else:
            self._spares.append(spare)

    async def _evict(self) -> None:
        idle = [e for e in self._episodes.values() if not e.busy]
        while len(self._episodes) >= self.max_open and idle:
            oldest = min(idle, key=lambda e: e.last_used)
            idle.remove(oldest)
            await self._close_episode(oldest)

    async def _close_episode(self, episode: _Episode) -> None:
        if self._episodes.get(episode.id) is episode:
            del self._episodes[episode.id]
        await self._close_context(episode.context, episode.generation)

    async def _close_context(self, context: Any, generation: int) -> None:
        try:
            await asyncio.wait_for(context.close(), self.timeout_s)
        except Exception:
            # a context that does not close means a browser in trouble: start over
            if generation == self._generation and self._browser is not None and self._browser.is_connected():
                logger.warning("%s: a page did not close; restarting the browser", self.name)
                await self._drop_browser()

    async def _live_episode(self, state: _TapeState) -> tuple[_Episode, str]:
        """The open page of the tape's episode, or a fresh one with the tape's actions replayed;
        and why it was replayed ('' when the page was open)."""
        assert state.open is not None and state.last is not None
        history = [_signature(a) for a in state.answered]
        episode = self._episodes.get(state.last.episode_id)
        connected = self._browser is not None and self._browser.is_connected()
        if episode is None:
            why = "no open page for this episode"
        elif episode.busy:
            why = "the episode's page is busy with another tape"
        elif episode.generation != self._generation or not connected:
            why = "the browser had stopped; it was relaunched"
        elif episode.history != history:
            why = "the tape forks from an earlier step"
        else:
            return episode, ""
        if episode is not None and not episode.busy:
            await self._close_episode(episode)
        task = self.task(state.open.task)
        episode_id = new_id() if episode is not None and episode.busy else state.last.episode_id
        episode = await self._new_episode(task, state.open.seed, episode_id, state.open.max_steps)
        episode.busy = True
        self.stats["replays"] += 1
        await self._settle(episode)
        for action in state.answered:
            with contextlib.suppress(Exception):
                await self._perform(episode, action)
            episode.history.append(_signature(action))
            await self._settle(episode)
        return episode, why

    async def _settle(self, episode: _Episode) -> dict[str, Any]:
        """Wait for the page's short timers (bounded) and give new elements their bids."""
        result: dict[str, Any] = await self._guard(
            episode.page.evaluate(SETTLE_AND_MARK, [self.settle_max_ms, HTML_TAGS]),
            "observing the page",
            self.timeout_s + 4 * self.settle_max_ms / 1000,
        )
        return result

    async def _perform(self, episode: _Episode, action: WebAction) -> None:
        """Do ``action`` on the page; Playwright's errors (no such element, not actionable) raise."""
        page = episode.page
        t = self.action_timeout_s * 1000
        if isinstance(action, Click | Fill | SelectOption | Press | Hover):
            locator = page.locator(f'[bid="{action.bid}"]')
            count = await self._guard(locator.count(), action.call())
            if count == 0:
                raise ValueError(f'Could not find element with bid "{action.bid}"')
            if isinstance(action, Click):
                await self._guard(locator.click(timeout=t), action.call())
            elif isinstance(action, Fill):
                await self._guard(locator.fill(action.text, timeout=t), action.call())
                held = await self._guard(locator.evaluate(_FIELD_VALUE), action.call())
                problem = fill_problem(action.text, held)
                if problem:
                    raise ValueError(f"{action.call()} did not take: {problem}")
            elif isinstance(action, SelectOption):
                await self._guard(locator.select_option(action.options, timeout=t), action.call())
            elif isinstance(action, Press):
                await self._guard(locator.press(action.key_comb, timeout=t), action.call())
            else:
                await self._guard(locator.hover(timeout=t), action.call())
        elif isinstance(action, Scroll):
            await self._guard(page.mouse.wheel(action.dx, action.dy), action.call())
        elif isinstance(action, GoBack):
            await self._guard(page.go_back(timeout=self.timeout_s * 1000), action.call())
        elif isinstance(action, Noop):
            await asyncio.sleep(max(0.0, min(action.wait_ms, self.timeout_s * 1000 - 1)) / 1000)
        elif isinstance(action, SendMsgToUser):
            pass  # the final answer: nothing to do on the page
        else:
            raise UnknownActionError(f"{self.name} cannot perform {action.kind!r}")

    async def _observe(self, episode: _Episode) -> tuple[dict[str, Any], TaskStatus, str, str | None]:
        """Settle and mark the page, read the task's status, the tree and (maybe) a screenshot."""
        page, task = episode.page, episode.task
        page_info = await self._settle(episode)
        state, snapshot, tree = await asyncio.gather(
            self._guard(page.evaluate(task.status_js), "reading the task's status"),
            self._guard(
                episode.cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": ["cursor"]}),
                "DOM snapshot",
            ),
            self._guard(episode.cdp.send("Accessibility.getFullAXTree"), "accessibility tree"),
        )
        axtree = flatten_axtree(
            tree.get("nodes", []), snapshot_bids(snapshot), max_chars=self.axtree_max_chars
        )
        screenshot = None
        if self.screenshots:
            png = await self._guard(page.screenshot(type="png"), "screenshot")
            screenshot = base64.b64encode(png).decode("ascii")
        return page_info, task.status(state), axtree, screenshot

    async def _open(self, action: OpenTask) -> WebObservation:
        started = time.perf_counter()
        task = self.task(action.task)
        blank = WebObservation(task=action.task, seed=action.seed, episode_id=new_id(), goal="")
        assert self._slots is not None
        async with self._slots:
            try:
                episode = await self._new_episode(task, action.seed, blank.episode_id, action.max_steps)
            except WebEnvironmentError:
                raise
            except Exception as e:  # a page that does not load, a browser that fails
                self._count(e)
                return _timed(_ended(blank, f"the task did not load: {_first_line(e)}", 0), started)
            episode.busy = True
            try:
                obs = await self._observation(episode, step=0, error="")
            except (_PageHung, _BrowserGone) as e:
                self._count(e)
                await self._close_episode(episode)
                blank.goal = episode.goal
                return _timed(_ended(blank, f"the page stopped answering: {e}", 0), started)
            finally:
                episode.busy = False
                episode.last_used = time.monotonic()
        if obs.done:
            await self._close_episode(episode)
        return _timed(obs, started)

    def _count(self, error: BaseException) -> None:
        if isinstance(error, _PageHung):
            self.stats["hangs"] += 1
        elif isinstance(error, _BrowserGone):
            self.stats["crashes"] += 1

    async def _observation(
        self, episode: _Episode, step: int, error: str, final: bool = False
    ) -> WebObservation:
        """The observation of ``episode``'s page now (raises if the page hangs or is gone)."""
        page_info, status, axtree, screenshot = await self._observe(episode)
        truncated = not status.done and (final or step >= episode.max_steps)
        info = dict(status.info)
        if truncated:
            info["truncated_by"] = "final answer" if final else f"step limit {episode.max_steps}"
        return WebObservation(
            task=episode.task.name,
            seed=episode.seed,
            episode_id=episode.id,
            goal=episode.goal,
            step=step,
            axtree=axtree,
            url=str(page_info.get("url", "")),
            title=str(page_info.get("title", "")),
            last_action_error=error,
            reward=status.reward,
            done=status.done or truncated,
            truncated=truncated,
            info=info,
            screenshot=screenshot,
        )

    async def _act(self, state: _TapeState, action: WebAction) -> WebObservation:
        started = time.perf_counter()
        if state.open is None or state.last is None:
            raise WebEnvironmentError(
                f"{self.name}: {action.call()} comes before any episode; start the tape with "
                "OpenTask(task=..., seed=...)"
            )
        step = len(state.answered) + 1
        if state.last.done:
            over = "the episode is over; start another one with OpenTask"
            return _timed(_ended(state.last, over, step, failure=False), started)
        assert self._slots is not None
        async with self._slots:
            try:
                episode, replayed = await self._live_episode(state)
            except WebEnvironmentError:
                raise
            except Exception as e:
                self._count(e)
                return _timed(
                    _ended(state.last, f"the episode could not be restored: {_first_line(e)}", step), started
                )
            episode.busy = True
            try:
                error = ""
                try:
                    await self._perform(episode, action)
                except _PageHung as e:
                    error = f"{action.call()}: {e}"
                except (_BrowserGone, UnknownActionError):
                    raise
                except Exception as e:  # the page said no: a missing element, one not actionable
                    error = f"{type(e).__name__}: {_first_line(e)}"
                episode.history.append(_signature(action))
                obs = await self._observation(episode, step, error, final=isinstance(action, SendMsgToUser))
            except _BrowserGone as e:
                episode.busy = False
                return _timed(await self._recover(state, action, e), started)
            except _PageHung as e:
                self._count(e)
                await self._close_episode(episode)
                message = f"{error}; " if error else ""
                obs = _ended(state.last, f"{message}the page stopped answering: {e}; the episode ended", step)
                return _timed(obs, started)
            finally:
                episode.busy = False
                episode.last_used = time.monotonic()
        if replayed:
            obs.metadata.other["replayed"] = replayed
        if obs.done:
            await self._close_episode(episode)
        return _timed(obs, started)

    async def _recover(self, state: _TapeState, action: WebAction, error: Exception) -> WebObservation:
        """The browser went away during ``action``: relaunch, replay the tape, observe."""
        self.stats["crashes"] += 1
        assert state.last is not None
        step = len(state.answered) + 1
        message = (
            f"the browser crashed during {action.call()} ({error}); it was restarted, the episode "
            "replayed, and the action was not performed"
        )
        try:
            await self._ensure_browser()
            episode, _ = await self._live_episode(state)
        except Exception as e:
            return _ended(state.last, f"{message}; the replay failed: {_first_line(e)}", step)
        episode.busy = True
        try:
            episode.history.append(_signature(action))  # counted as taken, though not performed
            obs = await self._observation(episode, step, message)
        except (_PageHung, _BrowserGone) as e:
            await self._close_episode(episode)
            return _ended(state.last, f"{message}; then the page stopped answering: {e}", step)
        finally:
            episode.busy = False
            episode.last_used = time.monotonic()
        if obs.done:
            await self._close_episode(episode)
        return obs

    async def _react(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        actions = unanswered_actions(tape)
        if not actions:
            return tape
        for action in actions:
            if not isinstance(action, WebAction | OpenTask):
                raise UnknownActionError(
                    f"{self.name} cannot answer action {action.kind!r} ({type(action).__name__}); "
                    "it answers OpenTask and the web actions of tapekit.web.steps"
                )
        if self._slots is None:
            await self._ensure_browser()
        state = _TapeState.of(tape)
        observations: list[WebObservation] = []
        for action in actions:
            if isinstance(action, OpenTask):
                obs = await self._open(action)
                state = _TapeState(open=action, last=obs)
            else:
                assert isinstance(action, WebAction)
                obs = await self._act(state, action)
                state.answered.append(action)
                state.last = obs
            observations.append(obs)
        return self._continued(tape, observations)

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """The tape with one :class:`WebObservation` per unanswered action (see the class)."""
        return await asyncio.wrap_future(self._call(self._react(tape)))

    def react(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """Sync version of :meth:`areact` (usable with no event loop, or inside one)."""
        return self._call(self._react(tape)).result()


# what a filled field holds: an input's or a textarea's value (None for other elements, e.g. a
# contenteditable, whose text the browser may lay out differently from what was typed)
_FIELD_VALUE = """el => {
  const tag = el.tagName.toLowerCase();
  if (tag !== 'input' && tag !== 'textarea') return null;
  return {value: el.value, type: tag === 'input' ? (el.type || 'text').toLowerCase() : tag,
          maxLength: el.maxLength};
}"""

FILL_FORMATS: dict[str, str] = {
    "date": "YYYY-MM-DD (e.g. 2016-11-07)",
    "time": "HH:MM, 24-hour (e.g. 14:05)",
    "datetime-local": "YYYY-MM-DDTHH:MM (e.g. 2016-11-07T14:05)",
    "month": "YYYY-MM (e.g. 2016-11)",
    "week": "YYYY-Www (e.g. 2016-W45)",
    "number": "a number (e.g. 42 or -3.5)",
    "range": "a number within the slider's range",
    "color": "#rrggbb (e.g. #ff0000)",
}
"""The value format of the input types that refuse other text: a ``fill`` of a date input with
``11/07/2016`` leaves it empty (in BrowserGym too, silently); tapekit's observation says so and
names the format."""

_ONE_LINE = frozenset({"text", "search", "tel", "url", "email", "password"})  # drop line breaks


def fill_problem(text: str, held: dict[str, Any] | None) -> str:
    """Why a ``fill`` of ``text`` did not take, from what the field holds after it (``held``:
    its ``value``, ``type`` and ``maxLength``); '' when it took (or the element is no input).

    The browser's own clean-up of a value is not a problem: a one-line input drops line breaks,
    an email or URL input trims spaces, a textarea writes ``\r\n`` as ``\n``.
    """
    if not held:
        return ""
    value, kind = str(held.get("value") or ""), str(held.get("type") or "text")
    expected = text.replace("\r\n", "\n")
    if kind in _ONE_LINE:
        expected = expected.replace("\r", "").replace("\n", "")
    if kind in ("email", "url"):
        expected = expected.strip()
    if value == expected:
        return ""
    problem = f"the {kind} field holds {json.dumps(value, ensure_ascii=False)}, not the text given"
    if kind in FILL_FORMATS:
        problem += f"; a {kind} input takes {FILL_FORMATS[kind]}"
    limit = held.get("maxLength")
    if isinstance(limit, int) and 0 <= limit < len(expected):
        problem += f"; it keeps at most {limit} characters"
    return problem


def _ended(last: WebObservation, error: str, step: int, failure: bool = True) -> WebObservation:
    """An observation that ends the episode with ``error``: the last one's page, no screenshot;
    marked as the environment's failure (:data:`~tapekit.environment.ENVIRONMENT_FAILURE`) unless
    ``failure`` is false (the agent's own doing)."""
    obs = WebObservation(
        **{
            **last.model_dump(exclude={"metadata", "kind", "screenshot"}),
            "last_action_error": error,
            "step": step,
            "done": True,
            "truncated": True,
        }
    )
    if failure:
        obs.metadata.other[ENVIRONMENT_FAILURE] = error
    return obs


def _timed(obs: WebObservation, started: float) -> WebObservation:
    obs.metadata.other["browser_s"] = round(time.perf_counter() - started, 4)
    return obs


def _first_line(error: BaseException) -> str:
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
