"""MiniWob++ as a tapekit task set: the tasks of the ``miniwob`` wheel, run from ``file://`` URLs
(no server, no clone), with a split fixed in code.

The episode protocol is MiniWob's own JavaScript core, driven the way BrowserGym drives it:
load the task's page, seed ``Math.random`` with ``Math.seedrandom(seed)``, start the episode
with ``core.startEpisodeReal()`` under a long ``core.EPISODE_MAX_TIME``, wait for
``WOB_TASK_READY``, read the goal with ``core.getUtterance()``, and after every step read
``WOB_RAW_REWARD_GLOBAL`` and ``WOB_DONE_GLOBAL``. The reward is BrowserGym's: 1.0 when the raw
reward is positive, else 0.0 (the raw, time-discounted and reason figures go to the
observation's ``info``; :func:`raw_reward` reads the raw one). **Binary success is lenient
where the raw reward gives partial credit**: click-checkboxes scores (right boxes − wrong
boxes) / boxes, so clicking Submit at once, no box ticked, is a success whenever most boxes
should stay empty (12 of 30 pages in the issue-46 review). Report the raw reward's mean beside
success (the examples' figures do). The human display (last reward, timer, the START cover) and the goal
text are taken out of the page while the agent sees it, and put back around the core's calls.

Seeds are used as given: the tapekit seed ``s`` is ``Math.seedrandom(s)``. (BrowserGym draws its
page seed from ``numpy.random.RandomState(s).randint(0, 1_000_000)``.)

The split (:data:`SPLIT`): :data:`TRAIN_TASKS` (the tasks with a teacher) on training seeds,
validation seeds to choose settings on, **test seeds nobody tunes on**, and
:data:`HELD_OUT_TASKS` never trained on (evaluated on the test seeds), and
:data:`TEACHERLESS_TASKS`, tasks with no teacher that RL trains on (their own training,
validation and test seeds, the same ranges).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tapekit.core import StepSequence, Tape
from tapekit.evaluate import Score, Task
from tapekit.web.steps import OpenTask, WebObservation
from tapekit.web.task import TaskStatus, WebEnvironmentError, WebTask

TRAIN_TASKS: tuple[str, ...] = (
    "click-button",
    "click-link",
    "click-dialog",
    "click-tab",
    "focus-text",
    "enter-text",
    "enter-password",
    "login-user",
    "click-checkboxes",
    "click-option",
    "choose-list",
    "use-autocomplete",
    "navigate-tree",
    "email-inbox",
)
"""The tasks trained on: each has a programmatic teacher (:mod:`tapekit.web.teacher`)."""

HELD_OUT_TASKS: tuple[str, ...] = (
    "click-button-sequence",
    "click-dialog-2",
    "click-tab-2-easy",
    "enter-text-2",
    "focus-text-2",
    "login-user-popup",
    "click-checkboxes-large",
    "click-collapsible",
)
"""Tasks never trained or tuned on, close in skill to the training tasks: generalisation."""

TEACHERLESS_TASKS: tuple[str, ...] = (
    "click-widget",
    "click-checkboxes-soft",
    "click-checkboxes-transfer",
    "click-tab-2-medium",
    "enter-text-dynamic",
    "unicode-test",
    "identify-shape",
    "sign-agreement",
)
"""Tasks with no teacher that RL trains on from a reward alone: examples/web_agent/teacherless.py
chose them on their 20 validation seeds (the SFT student's greedy success was 0.05-0.50, in the
range 0.05-0.60 fixed beforehand; docs/experiments/web-teacherless/run/screen.json). Neither
training nor held-out tasks; split by seed as the training tasks are."""

STEP_LIMITS: dict[str, int] = {
    "click-button": 5,
    "click-link": 5,
    "click-dialog": 5,
    "click-tab": 6,
    "focus-text": 5,
    "enter-text": 6,
    "enter-password": 8,
    "login-user": 8,
    "click-checkboxes": 12,
    "click-option": 6,
    "choose-list": 6,
    "use-autocomplete": 8,
    "navigate-tree": 10,
    "email-inbox": 10,
    "click-button-sequence": 6,
    "click-dialog-2": 5,
    "click-tab-2-easy": 8,
    "enter-text-2": 6,
    "focus-text-2": 5,
    "login-user-popup": 10,
    "click-checkboxes-large": 20,
    "click-collapsible": 6,
}
"""Episode step limits: about twice what the teacher needs at most (10 for unlisted tasks)."""

DEFAULT_STEP_LIMIT = 10


@dataclass(frozen=True)
class MiniWobSplit:
    """Which (task, seed) pairs are for what. Seed ranges are disjoint, so a problem's page is
    never shared between splits by seed (tasks with few distinct problems can still repeat a
    goal across splits)."""

    train_tasks: tuple[str, ...]
    held_out_tasks: tuple[str, ...]
    train_seeds: range
    validation_seeds: range
    test_seeds: range


SPLIT = MiniWobSplit(
    train_tasks=TRAIN_TASKS,
    held_out_tasks=HELD_OUT_TASKS,
    train_seeds=range(0, 100_000),
    validation_seeds=range(100_000, 100_020),
    test_seeds=range(200_000, 200_060),
)
"""The committed split: training seeds 0-99,999, 20 validation seeds and 60 **test** seeds per
task (14 x 60 = 840 test pairs), and the held-out tasks on the test seeds. The first 40 test
seeds were there from the start (the zero-shot figures of docs/experiments/web-agent.md used
the first 20, the training study 40 per task to reach 160 pairs on four tasks); seeds
200,040-200,059 were added on 2026-11-28, before any study had evaluated them, as fresh test
seeds for the plateau study (examples/web_agent/plateau.py)."""

SplitName = Literal["train", "validation", "test", "held_out"]


def miniwob_html_dir() -> Path:
    """The wheel's ``miniwob/html`` folder (found without importing the package)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise WebEnvironmentError("MiniWob++ needs the miniwob package: pip install 'tapekit[web]'")
    return Path(next(iter(spec.submodule_search_locations))) / "html"


def all_tasks() -> list[str]:
    """Every MiniWob++ task in the installed wheel, by name (``click-button``, ...)."""
    return sorted(p.stem for p in (miniwob_html_dir() / "miniwob").glob("*.html"))


# MiniWob's core keeps writing to its human display; take it (and the goal text) off the page
# while the agent looks, and put it back around the core's calls that touch it.
_START = r"""
([seed, maxTimeMs]) => {
  const ids = ['reward-display', 'click-canvas', 'sync-task-cover'];
  const parked = {};
  let queryHtml = '';
  const park = () => {
    core.clearTimer();
    document.body.removeEventListener('click', core.canvasDrawClick);
    const query = document.getElementById('query');
    if (query) { queryHtml = query.innerHTML; query.innerHTML = ''; }
    for (const id of ids) {
      const el = document.getElementById(id);
      if (el) { parked[id] = el; el.remove(); }
    }
  };
  const unpark = () => {
    const query = document.getElementById('query');
    if (query) query.innerHTML = queryHtml;
    for (const id of ids) {
      if (parked[id] && !parked[id].isConnected) document.body.appendChild(parked[id]);
    }
  };
  for (const name of ['startEpisodeReal', 'endEpisode', 'getUtterance']) {
    const original = core[name];
    core[name] = function () {
      unpark();
      try { return original.apply(this, arguments); } finally { park(); }
    };
  }
  park();
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = maxTimeMs;
  core.startEpisodeReal();
  if (!WOB_TASK_READY) return null;
  const u = core.getUtterance();
  return (u && typeof u === 'object') ? u.utterance : u;
}
"""
_GOAL = "() => { const u = core.getUtterance(); return (u && typeof u === 'object') ? u.utterance : u; }"
_STATUS = (
    "() => [WOB_REWARD_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON, WOB_DONE_GLOBAL, "
    "WOB_EPISODE_ID, WOB_TASK_READY]"
)


class MiniWobTask(WebTask):
    """One MiniWob++ task (``MiniWobTask("click-button")``), named ``miniwob.<task>``.

    ``base_url`` is where the task pages are (default ``$MINIWOB_URL``, else the wheel's
    folder as a ``file://`` URL); ``max_steps`` defaults to :data:`STEP_LIMITS`. The viewport
    is BrowserGym's (332 x 214).
    """

    viewport = (332, 214)
    status_js = _STATUS
    episode_max_time_ms = 1_000_000

    def __init__(self, task: str, base_url: str | None = None, max_steps: int | None = None) -> None:
        self.task = task.removeprefix("miniwob.")
        self.name = f"miniwob.{self.task}"
        self.max_steps = max_steps or STEP_LIMITS.get(self.task, DEFAULT_STEP_LIMIT)
        base = base_url or os.environ.get("MINIWOB_URL") or (miniwob_html_dir() / "miniwob").as_uri() + "/"
        self.url = base + self.task + ".html"

    async def setup(self, page: Any, seed: int, timeout_s: float) -> str:
        """Load the page, seed and start the episode, wait until the task is ready (most are at
        once); the goal."""
        await page.goto(self.url, wait_until="load", timeout=timeout_s * 1000)
        goal = await page.evaluate(_START, [seed, self.episode_max_time_ms])
        if goal is None:  # a task that gets ready later
            await page.wait_for_function("() => WOB_TASK_READY", timeout=timeout_s * 1000)
            goal = await page.evaluate(_GOAL)
        return str(goal)

    def status(self, state: Any) -> TaskStatus:
        """BrowserGym's binary reward (raw reward > 0) and MiniWob's done flag; the raw reward
        (in [-1, 1], partial credit on some tasks: a positive one is not always a solved page,
        see the module docstring), the time-discounted one and the reason go to ``info``."""
        if not isinstance(state, list) or len(state) < 6:
            return TaskStatus()
        reward, raw, reason, done = state[:4]
        info = {"raw_reward": raw, "reward_discounted": reward, "reason": reason}
        return TaskStatus(reward=1.0 if (raw or 0) > 0 else 0.0, done=bool(done), info=info)


# --------------------------------------------------------------------------- tasks for evaluation


def start_tape(task: str, seed: int, max_steps: int | None = None) -> Tape[Any, Any]:
    """The start tape of an episode: one :class:`OpenTask` (``task`` with or without
    ``miniwob.``)."""
    name = task if task.startswith("miniwob.") else f"miniwob.{task}"
    return Tape(steps=StepSequence([OpenTask(task=name, seed=seed, max_steps=max_steps)]))


def split_of(task: str, seed: int) -> SplitName | None:
    """The part of :data:`SPLIT` the episode ``(task, seed)`` belongs to, or None when it is
    outside the split (a task the split does not name, or a seed outside its part's range)."""
    task = task.removeprefix("miniwob.")
    if task in SPLIT.train_tasks or task in TEACHERLESS_TASKS:
        for part, seeds in (
            ("train", SPLIT.train_seeds),
            ("validation", SPLIT.validation_seeds),
            ("test", SPLIT.test_seeds),
        ):
            if seed in seeds:
                return part  # type: ignore[return-value]
    elif task in SPLIT.held_out_tasks and seed in SPLIT.test_seeds:
        return "held_out"
    return None


def check_tasks(tasks: Iterable[str]) -> list[str]:
    """The task names without ``miniwob.``; ``ValueError`` naming any that is not a task of the
    installed ``miniwob`` wheel (with the closest names). The split's tasks need no wheel."""
    names = [t.removeprefix("miniwob.") for t in tasks]
    others = [t for t in names if t not in SPLIT.train_tasks and t not in SPLIT.held_out_tasks]
    if others:
        known = set(all_tasks())
        for name in others:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=3)
                hint = f" (all_tasks() lists the {len(known)})"
                if close:
                    hint = f"; did you mean {', '.join(close)}?"
                raise ValueError(f"{name!r} is not a MiniWob++ task of the installed miniwob wheel{hint}")
    return names


def episodes(
    split: SplitName | None = None,
    n_seeds: int | None = None,
    tasks: Iterable[str] | None = None,
    *,
    seeds: Iterable[int] | None = None,
) -> list[tuple[str, int]]:
    """The (task, seed) pairs of ``split``: ``train`` (the first ``n_seeds`` training seeds,
    default 20), ``validation``, ``test`` (training tasks) or ``held_out`` (held-out tasks on the
    test seeds); ``tasks`` names the tasks instead, any task of the ``miniwob`` wheel (one the
    split does not name runs on the part's seeds, outside the split).

    ``seeds`` instead of a split: exactly those seeds, for ``tasks`` (default the training
    tasks), e.g. ``episodes(tasks=["enter-date"], seeds=range(300_000, 300_010))``; which of
    them fall in the split says :func:`split_of`. A name that is no MiniWob++ task is a
    ``ValueError``.
    """
    if seeds is not None:
        if split is not None or n_seeds is not None:
            raise ValueError("give either a split (and n_seeds) or seeds, not both")
        chosen = [int(s) for s in seeds]
        names = check_tasks(tasks) if tasks is not None else list(SPLIT.train_tasks)
        return [(task, seed) for task in names for seed in chosen]
    if split == "train":
        part: Sequence[int] = SPLIT.train_seeds[: n_seeds or 20]
    elif split == "validation":
        part = SPLIT.validation_seeds[:n_seeds] if n_seeds else SPLIT.validation_seeds
    elif split in ("test", "held_out"):
        part = SPLIT.test_seeds[:n_seeds] if n_seeds else SPLIT.test_seeds
    else:
        raise ValueError(f"unknown split {split!r}; use train, validation, test or held_out (or seeds=...)")
    if n_seeds is not None and n_seeds > len(part):
        # never fewer episodes than asked for without a word
        raise ValueError(f"the {split} split has {len(part)} seeds per task, {n_seeds} were asked for")
    names = list(SPLIT.held_out_tasks if split == "held_out" else SPLIT.train_tasks)
    if tasks is not None:
        names = check_tasks(tasks)
    return [(task, seed) for task in names for seed in part]


def eval_tasks(
    split: SplitName | None = None,
    n_seeds: int | None = None,
    tasks: Iterable[str] | None = None,
    *,
    seeds: Iterable[int] | None = None,
) -> list[Task]:
    """:class:`tapekit.Task` objects for :func:`tapekit.evaluate` (id ``task/seed``, category the
    task), each starting from :func:`start_tape`; score them with :func:`reward_scorer`. The
    arguments are :func:`episodes`'s; each task's metadata holds its ``seed`` and ``split``
    (:func:`split_of`: None marks an episode outside the split)."""
    return [
        Task(
            id=f"{task}/{seed}",
            start=start_tape(task, seed),
            category=task,
            metadata={"seed": seed, "split": split_of(task, seed)},
        )
        for task, seed in episodes(split, n_seeds, tasks, seeds=seeds)
    ]


def raw_reward(tape: Tape[Any, Any]) -> float | None:
    """MiniWob's raw reward of the episode on ``tape`` (its last observation's
    ``info["raw_reward"]``, in [-1, 1]; 0 for an episode the task did not end), or None when
    the tape has no observation with one. Unlike the binary reward it tells a partly right page
    from a right one (see the module docstring)."""
    last = next((s for s in reversed(tape.steps) if isinstance(s, WebObservation)), None)
    value = last.info.get("raw_reward") if last is not None else None
    return float(value) if isinstance(value, int | float) else None


def raw_reward_mean(tapes: Iterable[Tape[Any, Any]]) -> float | None:
    """The mean :func:`raw_reward` of ``tapes`` (those without one left out; None if none has
    one): the figure to report beside binary success."""
    values = [v for v in (raw_reward(t) for t in tapes) if v is not None]
    return sum(values) / len(values) if values else None


def reward_scorer(tape: Tape[Any, Any], task: Task | None = None) -> Score:
    """The reward of the tape's last observation (passed when positive), with why it ended.

    The reward is binary, 1.0 when MiniWob's raw reward is positive (as BrowserGym scores):
    partial credit counts as success (click-checkboxes with no box ticked passes when most boxes
    should stay empty); :func:`raw_reward` gives the raw figure."""
    last = next((s for s in reversed(tape.steps) if isinstance(s, WebObservation)), None)
    if last is None:
        return Score(value=0.0, passed=False, feedback="no observation: the episode never started")
    feedback = last.last_action_error or str(last.info.get("truncated_by") or last.info.get("reason") or "")
    return Score(value=last.reward, passed=last.reward > 0, feedback=feedback)
