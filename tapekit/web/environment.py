"""The browser environment: web actions on a tape answered by a real Chromium.

:class:`WebEnvironment` is the episode layer over a :class:`~tapekit.web._pool.BrowserPool` (one
headless Chromium on an event loop of its own, which it owns: launch and relaunch, deadlines,
spare pages, eviction, hang counting; see :mod:`tapekit.web._pool`). The environment turns tapes
into episodes and back; each episode gets a fresh browser context.

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
import base64
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, Self, TypeVar, overload

from tapekit.core import Observation, Tape, new_id
from tapekit.effects import NOT_DONE, EffectState, InDoubtToolCall, Journal, ToolEffect, ask_reconcile
from tapekit.effects import journal as current_journal
from tapekit.environment import (
    ENVIRONMENT_FAILURE,
    Environment,
    UnknownActionError,
    _jsonable,
    unanswered_indices,
)
from tapekit.errors import TapekitError
from tapekit.web._actions import FILL_FORMATS as FILL_FORMATS
from tapekit.web._actions import fill_problem as fill_problem
from tapekit.web._actions import perform
from tapekit.web._js import ELEMENT_INFO, HTML_TAGS, SETTLE_AND_MARK
from tapekit.web._pool import CHROMIUM_ARGS as CHROMIUM_ARGS
from tapekit.web._pool import DEFAULT_CHROMIUM as DEFAULT_CHROMIUM
from tapekit.web._pool import BrowserGone, BrowserPool, OpenPage, PageHung, first_line
from tapekit.web.axtree import flatten_axtree, snapshot_bids
from tapekit.web.steps import OpenTask, SendMsgToUser, WebAction, WebObservation
from tapekit.web.task import TaskStatus, WebElement, WebEnvironmentError, WebTask

_V = TypeVar("_V")


@dataclass(kw_only=True)
class _Episode(OpenPage):
    """An episode's page, kept open in the pool under the episode's id, with what the episode
    needs: its task, seed, goal, step limit, the actions done on the page (call texts) and
    whether one of them was ``once`` (such a page is never closed for another tape's fork)."""

    task: WebTask
    seed: int
    goal: str
    max_steps: int = 10
    history: list[str] = field(default_factory=list)
    once: bool = False


@dataclass
class _TapeState:
    """Where a tape's current episode stands: its OpenTask, the web actions already answered
    since, the steps (1-based, as :attr:`WebObservation.step`) of those that were ``once``, and
    the last observation."""

    open: OpenTask | None = None
    answered: list[WebAction] = field(default_factory=list)
    last: WebObservation | None = None
    once: list[int] = field(default_factory=list)

    def first_once(self) -> WebAction | None:
        """The first answered ``once`` action (None: every answered action reads)."""
        return self.answered[min(self.once) - 1] if self.once else None

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
                if step.metadata.other.get("once") and 0 < step.step <= len(state.answered):
                    state.once.append(step.step)
        return state


class _WouldRepeat(TapekitError):
    """The tape's page must be rebuilt, and that would replay a ``once`` action."""

    def __init__(self, action: WebAction, task: str, why: str) -> None:
        super().__init__(
            f"the episode's page is gone ({why}) and is not rebuilt: replaying would repeat a once "
            f"action, {action.call()} (task {task!r} declares it once: it acts outside the "
            "browser), and the actions before it cannot rebuild the page after it; the episode ended"
        )


class _Doubt:
    """A ``once`` action's place in the session's journal: the journal and the action's key."""

    __slots__ = ("journal", "key")

    def __init__(self, journal: Journal, key: str) -> None:
        self.journal = journal
        self.key = key


def _signature(action: WebAction) -> str:
    return action.call()


class _PoolSetting(Generic[_V]):
    """A setting of the environment that is its browser pool's: read and written there."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    @overload
    def __get__(self, env: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, env: WebEnvironment, owner: type | None = None) -> _V: ...
    def __get__(self, env: WebEnvironment | None, owner: type | None = None) -> _V | Self:
        if env is None:
            return self
        value: _V = getattr(env._pool, self.attr)
        return value

    def __set__(self, env: WebEnvironment, value: _V) -> None:
        setattr(env._pool, self.attr, value)


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

    The browser's settings (``executable``, ``max_concurrent``, ``max_open``,
    ``action_timeout_s``, ``timeout_s``, ``prewarm``, ``chromium_args``,
    ``restart_after_hangs``) are attributes of the environment kept by its browser pool;
    ``stats`` counts launches, replays, hangs, crashes, restarts and episodes.
    """

    executable: _PoolSetting[str] = _PoolSetting()
    max_concurrent: _PoolSetting[int] = _PoolSetting()
    max_open: _PoolSetting[int] = _PoolSetting()
    action_timeout_s: _PoolSetting[float] = _PoolSetting()
    timeout_s: _PoolSetting[float] = _PoolSetting()
    prewarm: _PoolSetting[int] = _PoolSetting()
    chromium_args: _PoolSetting[tuple[str, ...]] = _PoolSetting()
    restart_after_hangs: _PoolSetting[int | None] = _PoolSetting()

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
        self.settle_max_ms = settle_max_ms
        self.screenshots = screenshots
        self.axtree_max_chars = axtree_max_chars
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
        state = _TapeState.of(tape)
        observations: list[WebObservation] = []
        for index, action in zip(at, actions, strict=True):
            if isinstance(action, OpenTask):
                obs = await self._open(action)
                state = _TapeState(open=action, last=obs)
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
                episode = await self._new_episode(task, action.seed, blank.episode_id, action.max_steps)
            except WebEnvironmentError:
                raise
            except Exception as e:  # a page that does not load, a browser that fails
                self._pool.count(e)
                return _timed(_ended(blank, f"the task did not load: {first_line(e)}", 0), started)
            episode.busy = True
            try:
                obs = await self._observation(episode, step=0, error="")
            except (PageHung, BrowserGone) as e:
                self._pool.count(e)
                await self._pool.close_page(episode)
                blank.goal = episode.goal
                return _timed(_ended(blank, f"the page stopped answering: {e}", 0), started)
            finally:
                episode.busy = False
                episode.last_used = time.monotonic()
        if obs.done:
            await self._pool.close_page(episode)
        return _timed(obs, started)

    async def _act(
        self, state: _TapeState, action: WebAction, doubt_of: Callable[[], _Doubt] | None = None
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
            return _timed(_ended(state.last, over, step, failure=False), started)
        # a stored session's task that declares effects: this action's journal record, if any
        doubt = doubt_of() if doubt_of is not None and self.task(state.open.task).declares_effects else None
        if doubt is not None:
            known = await asyncio.to_thread(doubt.journal.store.tool_effect, doubt.key)
            how = "reused"
            if known is not None and known.state == "started":  # never done again blindly
                known, how = await self._reconciled(state, action, doubt, known), "reconciled"
            if known is not None and known.state in ("done", "failed"):
                return _timed(await self._reused(state, action, known, step, how), started)
        async with self._pool.slots:
            try:
                episode, replayed = await self._live_episode(state)
            except WebEnvironmentError:
                raise
            except _WouldRepeat as e:
                return _timed(_ended(state.last, str(e), step), started)
            except Exception as e:
                self._pool.count(e)
                return _timed(
                    _ended(state.last, f"the episode could not be restored: {first_line(e)}", step), started
                )
            episode.busy = True
            once = acting = done = False
            error = ""
            try:
                once = await self._is_once(episode, action)
                name, arguments = f"{self.name}.{action.function}", self._effect_arguments(state, action)
                if once and doubt is not None:
                    await asyncio.to_thread(doubt.journal.intend, doubt.key, name, arguments)
                acting = True
                try:
                    await self._perform(episode, action)
                except PageHung as e:
                    error = f"{action.call()}: {e}"
                    if once and doubt is not None:
                        raise  # it may have been done: in doubt (below)
                except (BrowserGone, UnknownActionError):
                    raise
                except Exception as e:  # the page said no: a missing element, one not actionable
                    error = f"{type(e).__name__}: {first_line(e)}"
                acting = False
                episode.history.append(_signature(action))
                if once:
                    episode.once = True
                    if doubt is not None:
                        outcome: EffectState = "failed" if error else "done"
                        await asyncio.to_thread(
                            doubt.journal.record, doubt.key, name, arguments, outcome, None, error or None
                        )
                    done = True
                obs = await self._observation(episode, step, error, final=isinstance(action, SendMsgToUser))
            except BrowserGone as e:
                episode.busy = False
                if not once:
                    return _timed(await self._recover(state, action, e), started)
                self._pool.count(e)
                if doubt is not None and not done:
                    await self._in_doubt(doubt, action, f"the browser crashed while it ran: {e}")
                when, what = ("after", "was done") if done else ("during", "may have been done")
                message = (
                    f"the browser crashed {when} {action.call()} ({e}), a once action that {what}: "
                    "the page after it cannot be rebuilt without repeating it, so the episode ended"
                )
                return _timed(_marked_once(_ended(state.last, message, step)), started)
            except PageHung as e:
                self._pool.count(e)
                await self._pool.close_page(episode)
                if once and doubt is not None and acting:
                    await self._in_doubt(doubt, action, f"the page stopped answering while it ran: {e}")
                message = f"{error}; " if error else ""
                obs = _ended(state.last, f"{message}the page stopped answering: {e}; the episode ended", step)
                return _timed(_marked_once(obs) if done else obs, started)
            finally:
                episode.busy = False
                episode.last_used = time.monotonic()
        if replayed:
            obs.metadata.other["replayed"] = replayed
        if once:
            _marked_once(obs)
        if obs.done:
            await self._pool.close_page(episode)
        return _timed(obs, started)

    async def _reused(
        self, state: _TapeState, action: WebAction, known: ToolEffect, step: int, how: str = "reused"
    ) -> WebObservation:
        """The observation of a ``once`` action whose outcome the journal holds (it died before
        its observation was stored, or a person resolved it): it is not done again. The page is
        observed as it is now if it is still open after the action; else a done action ends
        the episode (its page cannot be rebuilt), and a failed one is observed on the page
        before it (rebuilt from the reads before it if need be)."""
        assert state.open is not None and state.last is not None
        after = [*(_signature(a) for a in state.answered), _signature(action)]
        async with self._pool.slots:
            episode = self._open_episode(state.last.episode_id, after)
            if episode is None and known.state == "done":
                why = f"the journal says {action.call()} was done; its page is not open here"
                return _marked_once(_ended(state.last, str(_WouldRepeat(action, state.open.task, why)), step))
            if episode is None:
                try:
                    episode, _ = await self._live_episode(state)
                except WebEnvironmentError:
                    raise
                except _WouldRepeat as e:
                    return _marked_once(_ended(state.last, str(e), step))
                except Exception as e:
                    self._pool.count(e)
                    message = f"the episode could not be restored: {first_line(e)}"
                    return _marked_once(_ended(state.last, message, step))
                episode.history.append(_signature(action))
                episode.once = True
            episode.busy = True
            try:
                obs = await self._observation(episode, step, known.error or "")
            except (PageHung, BrowserGone) as e:
                self._pool.count(e)
                await self._pool.close_page(episode)
                return _marked_once(_ended(state.last, f"the page stopped answering: {e}", step))
            finally:
                episode.busy = False
                episode.last_used = time.monotonic()
        obs.metadata.other["effect"] = how  # "reused", or "reconciled" when the task settled it
        if obs.done:
            await self._pool.close_page(episode)
        return _marked_once(obs)

    async def _reconciled(
        self, state: _TapeState, action: WebAction, doubt: _Doubt, known: ToolEffect
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

    def _effect_arguments(self, state: _TapeState, action: WebAction) -> dict[str, Any]:
        """What the journal keeps of a ``once`` action: the action, the task and seed."""
        assert state.open is not None
        return {"action": action.call(), "task": state.open.task, "seed": state.open.seed}

    async def _is_once(self, episode: _Episode, action: WebAction) -> bool:
        """Whether the episode's task declares ``action`` (on its element as it is now) once."""
        task = episode.task
        if not task.declares_effects:
            return False
        effect = task.effect(action, await self._element(episode, action))
        if effect not in ("read", "once"):
            raise WebEnvironmentError(
                f"task {task.name!r}: effect({action.call()}) answered {effect!r}, not 'read' or 'once'"
            )
        return effect == "once"

    async def _element(self, episode: _Episode, action: WebAction) -> WebElement | None:
        """The element ``action`` targets, described (None: no bid, or not on the page)."""
        bid = getattr(action, "bid", None)
        if not isinstance(bid, str):
            return None
        locator = episode.page.locator(f'[bid="{bid}"]')
        guard = self._pool.guard
        try:
            if await guard(locator.count(), action.call()) == 0:
                return None
            info = await guard(locator.first.evaluate(ELEMENT_INFO), action.call())
        except (PageHung, BrowserGone):
            raise
        except Exception:  # detached meanwhile: the action itself will say so
            return None
        return WebElement(**info)

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
            await self._pool.ensure_browser()
            episode, _ = await self._live_episode(state)
        except _WouldRepeat as e:
            return _ended(state.last, f"the browser crashed during {action.call()} ({error}); {e}", step)
        except Exception as e:
            return _ended(state.last, f"{message}; the replay failed: {first_line(e)}", step)
        episode.busy = True
        try:
            episode.history.append(_signature(action))  # counted as taken, though not performed
            obs = await self._observation(episode, step, message)
        except (PageHung, BrowserGone) as e:
            await self._pool.close_page(episode)
            return _ended(state.last, f"{message}; then the page stopped answering: {e}", step)
        finally:
            episode.busy = False
            episode.last_used = time.monotonic()
        if obs.done:
            await self._pool.close_page(episode)
        return obs

    # ------------------------------------------------------------------ episodes and replay

    async def _new_episode(
        self, task: WebTask, seed: int, episode_id: str, max_steps: int | None
    ) -> _Episode:
        page = await self._pool.new_page(task.viewport)
        setup = task.setup(page.page, seed, self.timeout_s)
        goal = await self._pool.load(page, setup, f"loading {task.name}")
        episode = _Episode(id=episode_id, task=task, seed=seed, goal=goal, **page.handles())
        episode.max_steps = max_steps or task.max_steps
        self._pool.keep(episode)
        self.stats["episodes"] += 1
        return episode

    def _open_episode(self, episode_id: str, history: list[str]) -> _Episode | None:
        """The open, idle page of episode ``episode_id`` on the running browser if the actions
        done on it are ``history`` (None: there is none)."""
        episode = self._pool.pages.get(episode_id)
        assert episode is None or isinstance(episode, _Episode)
        if episode is None or episode.busy or not self._pool.current(episode) or episode.history != history:
            return None
        return episode

    async def _live_episode(self, state: _TapeState) -> tuple[_Episode, str]:
        """The open page of the tape's episode, or a fresh one with the tape's actions replayed;
        and why it was replayed ('' when the page was open). Raises :class:`_WouldRepeat`
        rather than replay a ``once`` action."""
        assert state.open is not None and state.last is not None
        history = [_signature(a) for a in state.answered]
        episode = self._pool.pages.get(state.last.episode_id)
        assert episode is None or isinstance(episode, _Episode)
        if episode is None:
            why = "no open page for this episode"
        elif episode.busy:
            why = "the episode's page is busy with another tape"
        elif not self._pool.current(episode):
            why = "the browser had stopped; it was relaunched"
        elif episode.history != history:
            why = "the tape forks from an earlier step"
        else:
            return episode, ""
        once = state.first_once()
        if once is not None:
            raise _WouldRepeat(once, state.open.task, why)
        # another tape's page stays open: one in use, or one past a once action (not rebuildable)
        keep = episode is not None and (episode.busy or (episode.once and self._pool.current(episode)))
        if episode is not None and not keep:
            await self._pool.close_page(episode)
        task = self.task(state.open.task)
        episode_id = new_id() if keep else state.last.episode_id
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

    # ------------------------------------------------------------------ act and observe

    async def _settle(self, episode: _Episode) -> dict[str, Any]:
        """Wait for the page's short timers (bounded) and give new elements their bids."""
        result: dict[str, Any] = await self._pool.guard(
            episode.page.evaluate(SETTLE_AND_MARK, [self.settle_max_ms, HTML_TAGS]),
            "observing the page",
            self.timeout_s + 4 * self.settle_max_ms / 1000,
        )
        return result

    async def _perform(self, episode: _Episode, action: WebAction) -> None:
        """Do ``action`` on the episode's page; the page's refusals raise (see :func:`perform`)."""
        await perform(
            episode.page,
            action,
            self._pool.guard,
            action_timeout_s=self.action_timeout_s,
            timeout_s=self.timeout_s,
            name=self.name,
        )

    async def _observe(self, episode: _Episode) -> tuple[dict[str, Any], TaskStatus, str, str | None]:
        """Settle and mark the page, read the task's status, the tree and (maybe) a screenshot."""
        page, task, guard = episode.page, episode.task, self._pool.guard
        page_info = await self._settle(episode)
        state, snapshot, tree = await asyncio.gather(
            guard(page.evaluate(task.status_js), "reading the task's status"),
            guard(
                episode.cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": ["cursor"]}),
                "DOM snapshot",
            ),
            guard(episode.cdp.send("Accessibility.getFullAXTree"), "accessibility tree"),
        )
        axtree = flatten_axtree(
            tree.get("nodes", []), snapshot_bids(snapshot), max_chars=self.axtree_max_chars
        )
        screenshot = None
        if self.screenshots:
            png = await guard(page.screenshot(type="png"), "screenshot")
            screenshot = base64.b64encode(png).decode("ascii")
        return page_info, task.status(state), axtree, screenshot

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


def _marked_once(obs: WebObservation) -> WebObservation:
    """``obs`` marked as the observation of a ``once`` action (never replayed: see the module)."""
    obs.metadata.other["once"] = True
    return obs


def _doubt_of(journal: Journal | None, tape: Tape[Any, Any], index: int) -> Callable[[], _Doubt] | None:
    """How to find the journal record of the action at ``tape.steps[index]`` (None: no journal);
    its key (the step's id) is worked out only when asked for."""
    if journal is None:
        return None
    return lambda: _Doubt(journal, journal.key(tape, index))


def _timed(obs: WebObservation, started: float) -> WebObservation:
    obs.metadata.other["browser_s"] = round(time.perf_counter() - started, 4)
    return obs
