"""Episodes on pages: the page-level half of :class:`~tapekit.web.environment.WebEnvironment`.

:class:`EpisodePages` opens a task's page in the browser pool, finds a tape's open page or builds
it again by replaying the tape's actions (never past a ``once`` action: :class:`WouldRepeat`),
does an action on a page, and observes a page as a :class:`~tapekit.web.steps.WebObservation`.
It knows pages and tapes' states, not the tape protocol: which observation answers which action,
the journal of ``once`` actions and what a crash or a hang means for an episode stay in the
environment. Every browser call goes through the pool's deadline (:meth:`BrowserPool.guard`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from tapekit.core import Observation, Tape, new_id
from tapekit.environment import ENVIRONMENT_FAILURE
from tapekit.errors import TapekitError
from tapekit.web._actions import perform
from tapekit.web._js import ELEMENT_INFO, HTML_TAGS, SETTLE_AND_MARK
from tapekit.web._pool import BrowserGone, BrowserPool, OpenPage, PageHung, first_line
from tapekit.web.axtree import flatten_axtree, snapshot_bids
from tapekit.web.steps import OpenTask, WebAction, WebObservation
from tapekit.web.task import TaskStatus, WebElement, WebEnvironmentError, WebTask


@dataclass(kw_only=True)
class Episode(OpenPage):
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
class TapeState:
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
    def of(cls, tape: Tape[Any, Any]) -> TapeState:
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


class WouldRepeat(TapekitError):
    """The tape's page must be rebuilt, and that would replay a ``once`` action."""

    def __init__(self, action: WebAction, task: str, why: str) -> None:
        super().__init__(
            f"the episode's page is gone ({why}) and is not rebuilt: replaying would repeat a once "
            f"action, {action.call()} (task {task!r} declares it once: it acts outside the "
            "browser), and the actions before it cannot rebuild the page after it; the episode ended"
        )


def signature(action: WebAction) -> str:
    """How an action done on a page is remembered (:attr:`Episode.history`)."""
    return action.call()


class EpisodePages:
    """The episodes' pages in ``pool`` (see the module docstring).

    ``settle_max_ms``, ``screenshots`` and ``axtree_max_chars`` are the environment's
    observation settings (documented there); ``name`` names the environment in errors.
    """

    def __init__(
        self,
        pool: BrowserPool,
        *,
        name: str,
        settle_max_ms: int,
        screenshots: bool,
        axtree_max_chars: int | None,
    ) -> None:
        self.pool = pool
        self.name = name
        self.settle_max_ms = settle_max_ms
        self.screenshots = screenshots
        self.axtree_max_chars = axtree_max_chars

    # ------------------------------------------------------------------ finding a page

    async def new(self, task: WebTask, seed: int, episode_id: str, max_steps: int | None) -> Episode:
        """A fresh page with ``task`` loaded at ``seed``, kept open in the pool."""
        page = await self.pool.new_page(task.viewport)
        setup = task.setup(page.page, seed, self.pool.timeout_s)
        goal = await self.pool.load(page, setup, f"loading {task.name}")
        episode = Episode(id=episode_id, task=task, seed=seed, goal=goal, **page.handles())
        episode.max_steps = max_steps or task.max_steps
        self.pool.keep(episode)
        self.pool.stats["episodes"] += 1
        return episode

    def open(self, episode_id: str, history: list[str]) -> Episode | None:
        """The open, idle page of episode ``episode_id`` on the running browser if the actions
        done on it are ``history`` (None: there is none)."""
        episode = self.pool.pages.get(episode_id)
        assert episode is None or isinstance(episode, Episode)
        if episode is None or episode.busy or not self.pool.current(episode) or episode.history != history:
            return None
        return episode

    async def live(self, state: TapeState, task: WebTask) -> tuple[Episode, str]:
        """The open page of the tape's episode (of ``task``), or a fresh one with the tape's
        actions replayed; and why it was replayed ('' when the page was open). Raises
        :class:`WouldRepeat` rather than replay a ``once`` action."""
        assert state.open is not None and state.last is not None
        history = [signature(a) for a in state.answered]
        episode = self.pool.pages.get(state.last.episode_id)
        assert episode is None or isinstance(episode, Episode)
        if episode is None:
            why = "no open page for this episode"
        elif episode.busy:
            why = "the episode's page is busy with another tape"
        elif not self.pool.current(episode):
            why = "the browser had stopped; it was relaunched"
        elif episode.history != history:
            why = "the tape forks from an earlier step"
        else:
            return episode, ""
        once = state.first_once()
        if once is not None:
            raise WouldRepeat(once, state.open.task, why)
        # another tape's page stays open: one in use, or one past a once action (not rebuildable)
        keep = episode is not None and (episode.busy or (episode.once and self.pool.current(episode)))
        if episode is not None and not keep:
            await self.pool.close_page(episode)
        episode_id = new_id() if keep else state.last.episode_id
        episode = await self.new(task, state.open.seed, episode_id, state.open.max_steps)
        episode.busy = True
        self.pool.stats["replays"] += 1
        await self.settle(episode)
        for action in state.answered:
            with contextlib.suppress(Exception):
                await self.perform(episode, action)
            episode.history.append(signature(action))
            await self.settle(episode)
        return episode, why

    # ------------------------------------------------------------------ act and observe

    async def is_once(self, episode: Episode, action: WebAction) -> bool:
        """Whether the episode's task declares ``action`` (on its element as it is now) once."""
        task = episode.task
        if not task.declares_effects:
            return False
        effect = task.effect(action, await self.element(episode, action))
        if effect not in ("read", "once"):
            raise WebEnvironmentError(
                f"task {task.name!r}: effect({action.call()}) answered {effect!r}, not 'read' or 'once'"
            )
        return effect == "once"

    async def element(self, episode: Episode, action: WebAction) -> WebElement | None:
        """The element ``action`` targets, described (None: no bid, or not on the page)."""
        bid = getattr(action, "bid", None)
        if not isinstance(bid, str):
            return None
        locator = episode.page.locator(f'[bid="{bid}"]')
        guard = self.pool.guard
        try:
            if await guard(locator.count(), action.call()) == 0:
                return None
            info = await guard(locator.first.evaluate(ELEMENT_INFO), action.call())
        except (PageHung, BrowserGone):
            raise
        except Exception:  # detached meanwhile: the action itself will say so
            return None
        return WebElement(**info)

    async def settle(self, episode: Episode) -> dict[str, Any]:
        """Wait for the page's short timers (bounded) and give new elements their bids."""
        result: dict[str, Any] = await self.pool.guard(
            episode.page.evaluate(SETTLE_AND_MARK, [self.settle_max_ms, HTML_TAGS]),
            "observing the page",
            self.pool.timeout_s + 4 * self.settle_max_ms / 1000,
        )
        return result

    async def perform(self, episode: Episode, action: WebAction) -> None:
        """Do ``action`` on the episode's page; the page's refusals raise (see :func:`perform`)."""
        await perform(
            episode.page,
            action,
            self.pool.guard,
            action_timeout_s=self.pool.action_timeout_s,
            timeout_s=self.pool.timeout_s,
            name=self.name,
        )

    async def _observe(self, episode: Episode) -> tuple[dict[str, Any], TaskStatus, str, str | None]:
        """Settle and mark the page, read the task's status, the tree and (maybe) a screenshot."""
        page, task, guard = episode.page, episode.task, self.pool.guard
        page_info = await self.settle(episode)
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

    async def observation(
        self, episode: Episode, step: int, error: str, final: bool = False
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

    async def recover(
        self, state: TapeState, task: WebTask, action: WebAction, error: Exception
    ) -> WebObservation:
        """The browser went away during ``action`` (of a tape's episode of ``task``): relaunch,
        replay the tape, observe."""
        self.pool.stats["crashes"] += 1
        assert state.open is not None and state.last is not None
        step = len(state.answered) + 1
        message = (
            f"the browser crashed during {action.call()} ({error}); it was restarted, the episode "
            "replayed, and the action was not performed"
        )
        try:
            await self.pool.ensure_browser()
            episode, _ = await self.live(state, task)
        except WouldRepeat as e:
            return ended(state.last, f"the browser crashed during {action.call()} ({error}); {e}", step)
        except Exception as e:
            return ended(state.last, f"{message}; the replay failed: {first_line(e)}", step)
        episode.busy = True
        try:
            episode.history.append(signature(action))  # counted as taken, though not performed
            obs = await self.observation(episode, step, message)
        except (PageHung, BrowserGone) as e:
            await self.pool.close_page(episode)
            return ended(state.last, f"{message}; then the page stopped answering: {e}", step)
        finally:
            episode.busy = False
            episode.last_used = time.monotonic()
        if obs.done:
            await self.pool.close_page(episode)
        return obs


def ended(last: WebObservation, error: str, step: int, failure: bool = True) -> WebObservation:
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


def marked_once(obs: WebObservation) -> WebObservation:
    """``obs`` marked as the observation of a ``once`` action (never replayed)."""
    obs.metadata.other["once"] = True
    return obs


def timed(obs: WebObservation, started: float) -> WebObservation:
    """``obs`` with the seconds since ``started`` spent in the browser (``browser_s``)."""
    obs.metadata.other["browser_s"] = round(time.perf_counter() - started, 4)
    return obs
