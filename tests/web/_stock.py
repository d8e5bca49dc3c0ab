"""Stock BrowserGym, driven by the same policies: the reward-equivalence test and the bench's
baseline (``bench/web.py --browsergym`` imports it from here). Nothing in tapekit needs
BrowserGym, and this module is not in the wheel.

BrowserGym is not a dependency of the ``web`` extra: ``browsergym-core`` pins
``playwright==1.44`` and pulls ``mcp[cli]``. Install it beside tapekit without its dependencies
(``pip install --no-deps browsergym-core browsergym-miniwob beautifulsoup4 soupsieve "lxml<6"
pyparsing``); it runs on the Playwright the ``web`` extra installs. BrowserGym launches a second
browser for its chat window with no arguments; :func:`debian_chromium` points every launch at
Debian's Chromium so that no downloaded browser is needed.

BrowserGym seeds a MiniWob page with ``numpy.random.RandomState(seed).randint(0, 1_000_000)``;
:func:`page_seed` gives that number, the seed tapekit's :class:`~tapekit.web.steps.OpenTask`
takes for the same page.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tapekit.web import CHROMIUM_ARGS, DEFAULT_CHROMIUM
from tapekit.web.axtree import flatten_axtree, snapshot_bids
from tapekit.web.miniwob import STEP_LIMITS
from tapekit.web.steps import SendMsgToUser, WebAction, WebObservation

__all__ = ["Replay", "StockEpisode", "debian_chromium", "missing", "page_seed", "run_episode"]

Policy = Callable[[WebObservation, Sequence[WebAction]], tuple[WebAction, str]]


def missing() -> str | None:
    """Why stock BrowserGym cannot run here (None when it can)."""
    for module in ("browsergym.core", "browsergym.miniwob", "numpy", "playwright"):
        try:
            if importlib.util.find_spec(module) is None:
                raise ImportError
        except ImportError:
            return (
                f"{module} is not installed (stock BrowserGym: pip install --no-deps browsergym-core "
                'browsergym-miniwob beautifulsoup4 soupsieve "lxml<6" pyparsing)'
            )
    return None


def page_seed(seed: int) -> int:
    """The ``Math.seedrandom`` seed BrowserGym's MiniWob task uses for its ``seed``."""
    import numpy as np

    return int(np.random.RandomState(seed).randint(0, 1_000_000))


@contextlib.contextmanager
def debian_chromium(executable: str = DEFAULT_CHROMIUM) -> Iterator[None]:
    """Within the block, every sync Playwright launch that names no executable uses
    ``executable``, and every launch gets tapekit's switches (BrowserGym's chat window launch
    names neither)."""
    from playwright.sync_api import BrowserType

    launch = BrowserType.launch

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["executable_path"] = kwargs.get("executable_path") or executable
        given = list(kwargs.get("args") or [])
        kwargs["args"] = [*given, *(a for a in CHROMIUM_ARGS if a not in given)]
        return launch(self, *args, **kwargs)

    BrowserType.launch = patched  # type: ignore[method-assign]
    try:
        yield
    finally:
        BrowserType.launch = launch  # type: ignore[method-assign]


@dataclass(frozen=True)
class Replay:
    """A policy that replays recorded actions (call texts) in order; picklable, so an episode
    can run in a worker process (BrowserGym keeps a process-wide sync Playwright)."""

    calls: tuple[str, ...]

    def __call__(self, observation: WebObservation, history: Sequence[WebAction]) -> tuple[WebAction, str]:
        """The next recorded action."""
        from tapekit.web.steps import parse_action

        return parse_action(self.calls[len(history)]), "replayed"


@dataclass
class StockEpisode:
    """One episode in stock BrowserGym: the goal, the actions (call text), the reward after each
    step, the observations the policy saw, and the seconds of ``reset`` and each ``step``."""

    task: str
    seed: int
    goal: str = ""
    actions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    observations: list[WebObservation] = field(default_factory=list)
    reset_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def reward(self) -> float:
        """The last reward (0.0 if no step was taken)."""
        return self.rewards[-1] if self.rewards else 0.0


def _observation(
    env: Any, obs: dict[str, Any], task: str, seed: int, step: int, reward: float
) -> WebObservation:
    """BrowserGym's observation as tapekit's: the same compact tree (the pointer cursors read
    with one more DOM snapshot, which BrowserGym's own snapshot leaves out)."""
    page = env.unwrapped.page
    cdp = page.context.new_cdp_session(page)
    try:
        snapshot = cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": ["cursor"]})
    finally:
        cdp.detach()
    axtree = flatten_axtree(obs["axtree_object"]["nodes"], snapshot_bids(snapshot), max_chars=4000)
    return WebObservation(
        task=f"miniwob.{task}",
        seed=seed,
        episode_id="browsergym",
        goal=str(obs.get("goal", "")),
        axtree=axtree,
        url=str(obs.get("url", "")),
        last_action_error=str(obs.get("last_action_error", "")),
        reward=reward,
        step=step,
    )


def run_episode(
    task: str,
    seed: int,
    policy: Policy,
    max_steps: int | None = None,
    pre_observation_delay: float = 0.5,
    executable: str = DEFAULT_CHROMIUM,
) -> StockEpisode:
    """Run ``policy`` on MiniWob ``task`` with BrowserGym ``seed`` in stock BrowserGym (its own
    two browsers per episode, its fixed ``pre_observation_delay``), until the task ends, the
    policy answers with ``send_msg_to_user`` or ``max_steps`` (default: the split's limit)."""
    import importlib

    import gymnasium as gym

    from tapekit.web.miniwob import miniwob_html_dir

    limit = max_steps or STEP_LIMITS.get(task, 10)
    episode = StockEpisode(task=task, seed=seed)
    importlib.import_module("browsergym.miniwob")  # registers the tasks with gymnasium
    base_url = (miniwob_html_dir() / "miniwob").as_uri() + "/"
    with debian_chromium(executable):
        env = gym.make(
            f"browsergym/miniwob.{task}",
            task_kwargs={"base_url": base_url},
            pre_observation_delay=pre_observation_delay,
        )
        try:
            started = time.perf_counter()
            obs, _info = env.reset(seed=seed)
            episode.reset_s = time.perf_counter() - started
            web = _observation(env, obs, task, seed, 0, 0.0)
            episode.goal = web.goal
            episode.observations.append(web)
            history: list[WebAction] = []
            for step in range(1, limit + 1):
                action, _why = policy(web, history)
                history.append(action)
                episode.actions.append(action.call())
                started = time.perf_counter()
                obs, reward, terminated, truncated, _info = env.step(action.call())
                episode.step_s.append(time.perf_counter() - started)
                episode.rewards.append(float(reward))
                web = _observation(env, obs, task, seed, step, float(reward))
                episode.observations.append(web)
                if terminated or truncated or isinstance(action, SendMsgToUser):
                    break
        except Exception as e:  # reported with the episode, like tapekit's error observations
            episode.error = f"{type(e).__name__}: {e}"
        finally:
            env.close()
    return episode
