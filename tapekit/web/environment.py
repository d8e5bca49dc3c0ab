"""The browser environment: web actions on a tape answered by a real Chromium.

:class:`WebEnvironment` is the episode layer over a :class:`~tapekit.web._pool.BrowserPool` (one
headless Chromium on an event loop of its own, which it owns: launch and relaunch, deadlines,
spare pages, eviction, hang counting; see :mod:`tapekit.web._pool`). The environment turns tapes
into episodes and back (the tape protocol, the journal of ``once`` actions, what a crash or a hang
means for an episode); its pages (:mod:`tapekit.web._episodes`) open, replay, act on and observe
the episodes' pages. Each episode gets a fresh browser context.

- **Episodes are tapes.** A start tape holds :class:`~tapekit.web.steps.OpenTask`; the
  environment answers it with the first :class:`~tapekit.web.steps.WebObservation` and every
  later action with the next one. The page of a running episode stays open between steps; a tape
  whose page is gone (another process, a fork from an earlier step, an evicted or crashed page)
  gets a fresh page on which the tape's earlier actions are replayed first, so any cut resumes.
- **A ``once`` action is never done twice.** A task says which actions act on the outside world
  (:meth:`WebTask.effect <tapekit.web.task.WebTask.effect>`: a form submit on a real site;
  every MiniWob++ action reads, its pages are local and reset per episode). Such an action is
  never replayed: a tape whose page is gone and whose answered actions include one is not
  rebuilt (the actions before it cannot rebuild the page after it, and replaying it would
  repeat it); its episode ends with an observation saying so, marked as the environment's
  failure. The observation of a ``once`` action says so (``metadata.other["once"]``). In a
  stored session (:mod:`tapekit.effects`) its intent, keyed by the action step's id, is
  committed before it is done and its outcome after; on resume an action with an intent and
  no outcome, or one whose page hung or whose browser crashed while it ran, is in doubt: it is
  not done again, the session waits (:class:`~tapekit.effects.InDoubtToolCall`) until
  ``store.resolve_tool_effect`` says done (the episode goes on from its page if that page is
  still open, else ends as above), failed, or retry (done again).
- **Bounded.** At most ``max_concurrent`` episodes use the browser at once and at most
  ``max_open`` pages stay open (the least recently used idle one is closed first; it is
  replayed if its tape comes back, unless it holds a ``once`` action).
- **Never hangs.** Every browser call has a deadline. A page that does not answer (a script
  that loops forever, a page that never loads) ends its episode with an error observation and
  its context is closed; if even that hangs, the browser is killed and relaunched. So is a
  browser on which ``restart_after_hangs`` page loads in a row hung (no load finished between
  them): a browser in trouble hangs every load, not one. A browser that crashed is relaunched
  and the episode replayed; the observation says the action was not performed (a ``once``
  action the crash interrupted may have been: it is in doubt, as above).
- **No stray processes.** :meth:`close` / :meth:`aclose` (or leaving ``with`` / ``async with``)
  closes the browser and its driver, killing the process tree if closing does not finish; the
  same happens when the environment is garbage-collected or the interpreter exits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, NoReturn, Self, TypeVar, overload

from tapekit.core import Tape, new_id
from tapekit.effects import NOT_DONE, EffectState, InDoubtToolCall, Journal, ToolEffect, ask_reconcile
from tapekit.effects import journal as current_journal
from tapekit.environment import (
    Environment,
    UnknownActionError,
    _jsonable,
    unanswered_indices,
)
from tapekit.web._actions import FILL_FORMATS as FILL_FORMATS
from tapekit.web._actions import fill_problem as fill_problem
from tapekit.web._episodes import (
    EpisodePages,
    TapeState,
    WouldRepeat,
    ended,
    marked_once,
    signature,
    timed,
)
from tapekit.web._pool import CHROMIUM_ARGS as CHROMIUM_ARGS
from tapekit.web._pool import DEFAULT_CHROMIUM as DEFAULT_CHROMIUM
from tapekit.web._pool import BrowserGone, BrowserPool, PageHung, first_line
from tapekit.web.steps import OpenTask, SendMsgToUser, WebAction, WebObservation
from tapekit.web.task import WebEnvironmentError, WebTask

_V = TypeVar("_V")


class _Doubt:
    """A ``once`` action's place in the session's journal: the journal and the action's key."""

    __slots__ = ("journal", "key")

    def __init__(self, journal: Journal, key: str) -> None:
        self.journal = journal
        self.key = key


class _Kept(Generic[_V]):
    """A setting of the environment kept by one of its parts (``holder``: the attribute that
    holds it, its browser pool or its pages): read and written there."""

    def __init__(self, holder: str) -> None:
        self.holder = holder

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    @overload
    def __get__(self, env: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, env: WebEnvironment, owner: type | None = None) -> _V: ...
    def __get__(self, env: WebEnvironment | None, owner: type | None = None) -> _V | Self:
        if env is None:
            return self
        value: _V = getattr(getattr(env, self.holder), self.attr)
        return value

    def __set__(self, env: WebEnvironment, value: _V) -> None:
        setattr(getattr(env, self.holder), self.attr, value)


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

    The settings are attributes of the environment (set them at any time): the browser's
    (``executable``, ``max_concurrent``, ``max_open``, ``action_timeout_s``, ``timeout_s``,
    ``prewarm``, ``chromium_args``, ``restart_after_hangs``) are kept by its browser pool, the
    observations' (``settle_max_ms``, ``screenshots``, ``axtree_max_chars``) by its pages
    (:mod:`tapekit.web._episodes`); ``stats`` counts launches, replays, hangs, crashes, restarts
    and episodes.
    """

    executable: _Kept[str] = _Kept("_pool")
    max_concurrent: _Kept[int] = _Kept("_pool")
    max_open: _Kept[int] = _Kept("_pool")
    action_timeout_s: _Kept[float] = _Kept("_pool")
    timeout_s: _Kept[float] = _Kept("_pool")
    prewarm: _Kept[int] = _Kept("_pool")
    chromium_args: _Kept[tuple[str, ...]] = _Kept("_pool")
    restart_after_hangs: _Kept[int | None] = _Kept("_pool")
    settle_max_ms: _Kept[int] = _Kept("_pages")
    screenshots: _Kept[bool] = _Kept("_pages")
    axtree_max_chars: _Kept[int | None] = _Kept("_pages")

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
        self._pool = BrowserPool(
            executable=executable,
            max_concurrent=max_concurrent,
            max_open=max_open,
            action_timeout_s=action_timeout_s,
            timeout_s=timeout_s,
            prewarm=prewarm,
            chromium_args=chromium_args,
            restart_after_hangs=restart_after_hangs,
            name=name,
        )
        self.name = name
        if tasks is None:
            self.tasks: dict[str, WebTask] = {}
        elif isinstance(tasks, Mapping):
            self.tasks = dict(tasks)
        else:
            self.tasks = {t.name: t for t in tasks}
        self._pages = EpisodePages(
            self._pool,
            name=name,
            settle_max_ms=settle_max_ms,
            screenshots=screenshots,
            axtree_max_chars=axtree_max_chars,
        )
        self.stats: dict[str, int] = self._pool.stats

    # ------------------------------------------------------------------ lifecycle

    async def astart(self) -> Self:
        """Launch the browser now (it is otherwise launched by the first episode)."""
        await self._pool.astart()
        return self

    async def aclose(self) -> None:
        """Close every page, the browser and its driver; kill what does not close in time."""
        await self._pool.aclose()

    def close(self) -> None:
        """Sync version of :meth:`aclose`."""
        self._pool.close()

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
        return self._pool.browser_pids()

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

    # ------------------------------------------------------------------ tape ↔ episode

    async def areact(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """The tape with one :class:`WebObservation` per unanswered action (see the class)."""
        # the browser's loop does not see this context: the stored session's journal goes along
        return await asyncio.wrap_future(self._pool.submit(self._react(tape, current_journal())))

    def react(self, tape: Tape[Any, Any]) -> Tape[Any, Any]:
        """Sync version of :meth:`areact` (usable with no event loop, or inside one)."""
        return self._pool.submit(self._react(tape, current_journal())).result()

    async def _react(self, tape: Tape[Any, Any], journal: Journal | None = None) -> Tape[Any, Any]:
        at = unanswered_indices(tape)
        if not at:
            return tape
        actions = [tape.steps[i] for i in at]
        for action in actions:
            if not isinstance(action, WebAction | OpenTask):
                raise UnknownActionError(
                    f"{self.name} cannot answer action {action.kind!r} ({type(action).__name__}); "
                    "it answers OpenTask and the web actions of tapekit.web.steps"
                )
        await self._pool.ready()
        state = TapeState.of(tape)
        observations: list[WebObservation] = []
        for index, action in zip(at, actions, strict=True):
            if isinstance(action, OpenTask):
                obs = await self._open(action)
                state = TapeState(open=action, last=obs)
            else:
                assert isinstance(action, WebAction)
                obs = await self._act(state, action, _doubt_of(journal, tape, index))
                state.answered.append(action)
                if obs.metadata.other.get("once"):
                    state.once.append(len(state.answered))
                state.last = obs
            observations.append(obs)
        return self._continued(tape, observations)

    async def _open(self, action: OpenTask) -> WebObservation:
        started = time.perf_counter()
        task = self.task(action.task)
        blank = WebObservation(task=action.task, seed=action.seed, episode_id=new_id(), goal="")
        async with self._pool.slots:
            try:
                episode = await self._pages.new(task, action.seed, blank.episode_id, action.max_steps)
            except WebEnvironmentError:
                raise
            except Exception as e:  # a page that does not load, a browser that fails
                self._pool.count(e)
                return timed(ended(blank, f"the task did not load: {first_line(e)}", 0), started)
            episode.busy = True
            try:
                obs = await self._pages.observation(episode, step=0, error="")
            except (PageHung, BrowserGone) as e:
                self._pool.count(e)
                await self._pool.close_page(episode)
                blank.goal = episode.goal
                return timed(ended(blank, f"the page stopped answering: {e}", 0), started)
            finally:
                episode.busy = False
                episode.last_used = time.monotonic()
        if obs.done:
            await self._pool.close_page(episode)
        return timed(obs, started)

    async def _act(
        self, state: TapeState, action: WebAction, doubt_of: Callable[[], _Doubt] | None = None
    ) -> WebObservation:
        started = time.perf_counter()
        if state.open is None or state.last is None:
            raise WebEnvironmentError(
                f"{self.name}: {action.call()} comes before any episode; start the tape with "
                "OpenTask(task=..., seed=...)"
            )
        step = len(state.answered) + 1
        if state.last.done:
            over = "the episode is over; start another one with OpenTask"
            return timed(ended(state.last, over, step, failure=False), started)
        # a stored session's task that declares effects: this action's journal record, if any
        doubt = doubt_of() if doubt_of is not None and self.task(state.open.task).declares_effects else None
        if doubt is not None:
            known = await asyncio.to_thread(doubt.journal.store.tool_effect, doubt.key)
            how = "reused"
            if known is not None and known.state == "started":  # never done again blindly
                known, how = await self._reconciled(state, action, doubt, known), "reconciled"
            if known is not None and known.state in ("done", "failed"):
                return timed(await self._reused(state, action, known, step, how), started)
        async with self._pool.slots:
            try:
                episode, replayed = await self._pages.live(state, self.task(state.open.task))
            except WebEnvironmentError:
                raise
            except WouldRepeat as e:
                return timed(ended(state.last, str(e), step), started)
            except Exception as e:
                self._pool.count(e)
                return timed(
                    ended(state.last, f"the episode could not be restored: {first_line(e)}", step), started
                )
            episode.busy = True
            once = acting = done = False
            error = ""
            try:
                once = await self._pages.is_once(episode, action)
                name, arguments = f"{self.name}.{action.function}", self._effect_arguments(state, action)
                if once and doubt is not None:
                    await asyncio.to_thread(doubt.journal.intend, doubt.key, name, arguments)
                acting = True
                try:
                    await self._pages.perform(episode, action)
                except PageHung as e:
                    error = f"{action.call()}: {e}"
                    if once and doubt is not None:
                        raise  # it may have been done: in doubt (below)
                except (BrowserGone, UnknownActionError):
                    raise
                except Exception as e:  # the page said no: a missing element, one not actionable
                    error = f"{type(e).__name__}: {first_line(e)}"
                acting = False
                episode.history.append(signature(action))
                if once:
                    episode.once = True
                    if doubt is not None:
                        outcome: EffectState = "failed" if error else "done"
                        await asyncio.to_thread(
                            doubt.journal.record, doubt.key, name, arguments, outcome, None, error or None
                        )
                    done = True
                final = isinstance(action, SendMsgToUser)
                obs = await self._pages.observation(episode, step, error, final=final)
            except BrowserGone as e:
                episode.busy = False
                if not once:
                    return timed(
                        await self._pages.recover(state, self.task(state.open.task), action, e), started
                    )
                self._pool.count(e)
                if doubt is not None and not done:
                    await self._in_doubt(doubt, action, f"the browser crashed while it ran: {e}")
                when, what = ("after", "was done") if done else ("during", "may have been done")
                message = (
                    f"the browser crashed {when} {action.call()} ({e}), a once action that {what}: "
                    "the page after it cannot be rebuilt without repeating it, so the episode ended"
                )
                return timed(marked_once(ended(state.last, message, step)), started)
            except PageHung as e:
                self._pool.count(e)
                await self._pool.close_page(episode)
                if once and doubt is not None and acting:
                    await self._in_doubt(doubt, action, f"the page stopped answering while it ran: {e}")
                message = f"{error}; " if error else ""
                obs = ended(state.last, f"{message}the page stopped answering: {e}; the episode ended", step)
                return timed(marked_once(obs) if done else obs, started)
            finally:
                episode.busy = False
                episode.last_used = time.monotonic()
        if replayed:
            obs.metadata.other["replayed"] = replayed
        if once:
            marked_once(obs)
        if obs.done:
            await self._pool.close_page(episode)
        return timed(obs, started)

    async def _reused(
        self, state: TapeState, action: WebAction, known: ToolEffect, step: int, how: str = "reused"
    ) -> WebObservation:
        """The observation of a ``once`` action whose outcome the journal holds (it died before
        its observation was stored, or a person resolved it): it is not done again. The page is
        observed as it is now if it is still open after the action; else a done action ends
        the episode (its page cannot be rebuilt), and a failed one is observed on the page
        before it (rebuilt from the reads before it if need be)."""
        assert state.open is not None and state.last is not None
        after = [*(signature(a) for a in state.answered), signature(action)]
        async with self._pool.slots:
            episode = self._pages.open(state.last.episode_id, after)
            if episode is None and known.state == "done":
                why = f"the journal says {action.call()} was done; its page is not open here"
                return marked_once(ended(state.last, str(WouldRepeat(action, state.open.task, why)), step))
            if episode is None:
                try:
                    episode, _ = await self._pages.live(state, self.task(state.open.task))
                except WebEnvironmentError:
                    raise
                except WouldRepeat as e:
                    return marked_once(ended(state.last, str(e), step))
                except Exception as e:
                    self._pool.count(e)
                    message = f"the episode could not be restored: {first_line(e)}"
                    return marked_once(ended(state.last, message, step))
                episode.history.append(signature(action))
                episode.once = True
            episode.busy = True
            try:
                obs = await self._pages.observation(episode, step, known.error or "")
            except (PageHung, BrowserGone) as e:
                self._pool.count(e)
                await self._pool.close_page(episode)
                return marked_once(ended(state.last, f"the page stopped answering: {e}", step))
            finally:
                episode.busy = False
                episode.last_used = time.monotonic()
        obs.metadata.other["effect"] = how  # "reused", or "reconciled" when the task settled it
        if obs.done:
            await self._pool.close_page(episode)
        return marked_once(obs)

    async def _reconciled(
        self, state: TapeState, action: WebAction, doubt: _Doubt, known: ToolEffect
    ) -> ToolEffect | None:  # None: not done
        """Ask the task whether the ``once`` action in doubt happened (:meth:`WebTask.reconcile`)
        and journal its answer: done (the journal's outcome from now on), not done (None: do it
        now), or :class:`InDoubtToolCall` when it cannot tell."""
        assert state.open is not None
        task = self.task(state.open.task)
        answer = await ask_reconcile(lambda a: task.reconcile(a, known), action, known)
        if answer is NOT_DONE:
            return None
        await asyncio.to_thread(
            doubt.journal.record, doubt.key, known.tool, known.arguments, "done", _jsonable(answer), None
        )
        return await asyncio.to_thread(doubt.journal.store.tool_effect, doubt.key)

    async def _in_doubt(self, doubt: _Doubt, action: WebAction, why: str) -> NoReturn:
        """Raise :class:`InDoubtToolCall` for ``action``, whose intent is journalled."""
        effect = await asyncio.to_thread(doubt.journal.store.tool_effect, doubt.key)
        assert effect is not None
        raise InDoubtToolCall(action, effect, why)

    def _effect_arguments(self, state: TapeState, action: WebAction) -> dict[str, Any]:
        """What the journal keeps of a ``once`` action: the action, the task and seed."""
        assert state.open is not None
        return {"action": action.call(), "task": state.open.task, "seed": state.open.seed}


def _doubt_of(journal: Journal | None, tape: Tape[Any, Any], index: int) -> Callable[[], _Doubt] | None:
    """How to find the journal record of the action at ``tape.steps[index]`` (None: no journal);
    its key (the step's id) is worked out only when asked for."""
    if journal is None:
        return None
    return lambda: _Doubt(journal, journal.key(tape, index))
