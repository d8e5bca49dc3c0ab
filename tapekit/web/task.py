"""What a web task is to the browser environment: how to set up its page for a seed and how to read
its reward. :class:`tapekit.web.miniwob.MiniWobTask` is the main implementation; :class:`PageTask`
opens any URL (for tests and simple pages with no reward). :class:`WebEnvironmentError` is what
the environment, its browser pool and the tasks raise when they cannot work at all."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from tapekit.errors import TapekitError


class WebEnvironmentError(TapekitError, RuntimeError):
    """The browser environment cannot work: no Playwright, no browser executable, a launch that
    fails, a task it does not know or cannot load its pages for (no ``miniwob`` package), or a
    tape it cannot make sense of (a web action before any ``OpenTask``)."""


@dataclass(frozen=True)
class TaskStatus:
    """The task's verdict after a step: ``reward`` (what the agent is scored on), ``done`` (the
    task ended the episode) and ``info`` (the task's raw figures, kept on the observation)."""

    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class WebTask(ABC):
    """A task the browser environment can run: subclass it and implement :meth:`setup`.

    ``name`` is what :class:`~tapekit.web.steps.OpenTask` names; ``max_steps`` the episode's
    step limit; ``viewport`` the page size (width, height). ``status_js`` is a JavaScript
    function evaluated in the page after every step, in the same call that settles and marks the
    page; its result goes to :meth:`status`.
    """

    name: str = ""
    max_steps: int = 10
    viewport: tuple[int, int] = (800, 600)
    status_js: str = "() => null"

    @abstractmethod
    async def setup(self, page: Any, seed: int, timeout_s: float) -> str:
        """Load the task in ``page`` (a Playwright async page, fresh context), start the episode
        for ``seed`` and return its goal. Every browser call must finish within ``timeout_s``."""

    def status(self, state: Any) -> TaskStatus:
        """The reward and done flag from what ``status_js`` returned (default: no reward)."""
        return TaskStatus()


class PageTask(WebTask):
    """A plain page: open ``url``, the goal is ``goal``; no reward, never done by itself."""

    def __init__(self, name: str, url: str, goal: str = "", max_steps: int = 10) -> None:
        self.name = name
        self.url = url
        self.goal = goal
        self.max_steps = max_steps

    async def setup(self, page: Any, seed: int, timeout_s: float) -> str:
        """Open the URL (``seed`` is not used)."""
        await page.goto(self.url, timeout=timeout_s * 1000)
        return self.goal
