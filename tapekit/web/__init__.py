"""Web agents in a real browser (extra ``web``): a Chromium environment, MiniWob++ as a task set
with a committed split, programmatic teachers and the LLM agent.

- :mod:`tapekit.web.steps`: BrowserGym's actions as typed steps, the observation, the call
  syntax parser.
- :class:`WebEnvironment`: tapes as episodes in one headless Chromium, a fresh context per
  episode, tapes that resume from any cut (see :mod:`tapekit.web.environment`); under it a
  browser pool that launches and relaunches the browser, puts a deadline on every call, makes
  spare pages ahead and bounds the pages open (:mod:`tapekit.web._pool`).
- Tasks: :class:`WebTask` (MiniWob++'s, or your own: :class:`PageTask` opens a URL); a task
  says which actions act on the outside world (:meth:`WebTask.effect`, :func:`submits_form`:
  a form submit on a real site is ``once``), and those are never replayed nor, in a stored
  session, done twice (docs/durability.md).
- MiniWob++: the tasks of the ``miniwob`` wheel, the split (:data:`SPLIT`,
  :data:`TEACHERLESS_TASKS`), a task's first tape (:func:`start_tape`), evaluation tasks
  (:func:`eval_tasks`, :func:`episodes`) and the reward scorer (:func:`reward_scorer`,
  :func:`raw_reward_mean`).
- :func:`teacher_agent`: programmatic policies that read only the goal and the observation.
- :func:`web_agent` / :class:`WebAgentNode`: the LLM agent (one node, any backend; the prompt
  holds the current observation and the last actions, never the whole tape).

Importing this package does not import Playwright; the browser starts with the first episode.
See docs/web.md.
"""

from tapekit.web._pool import CHROMIUM_ARGS, DEFAULT_CHROMIUM
from tapekit.web.agent import (
    DEFAULT_INSTRUCTION,
    TEXT_MAX_CHARS,
    THOUGHT_MAX_CHARS,
    EpisodeView,
    WebAbort,
    WebAgentNode,
    answer_schema,
    episode_view,
    llm_max_tokens,
    render_observation,
    web_agent,
    without_thoughts,
)
from tapekit.web.axtree import AXLine, flatten_axtree, parse_axtree
from tapekit.web.environment import WebEnvironment
from tapekit.web.miniwob import (
    SPLIT,
    TEACHERLESS_TASKS,
    episodes,
    eval_tasks,
    raw_reward_mean,
    reward_scorer,
    start_tape,
)
from tapekit.web.steps import (
    ACTION_CLASSES,
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
    WebThought,
    parse_action,
)
from tapekit.web.task import (
    PageTask,
    TaskStatus,
    WebEffect,
    WebElement,
    WebEnvironmentError,
    WebTask,
    submits_form,
)
from tapekit.web.teacher import teacher_agent

__all__ = [
    "ACTION_CLASSES",
    "CHROMIUM_ARGS",
    "DEFAULT_CHROMIUM",
    "DEFAULT_INSTRUCTION",
    "SPLIT",
    "TEACHERLESS_TASKS",
    "TEXT_MAX_CHARS",
    "THOUGHT_MAX_CHARS",
    "AXLine",
    "Click",
    "EpisodeView",
    "Fill",
    "GoBack",
    "Hover",
    "Noop",
    "OpenTask",
    "PageTask",
    "Press",
    "Scroll",
    "SelectOption",
    "SendMsgToUser",
    "TaskStatus",
    "WebAbort",
    "WebAction",
    "WebAgentNode",
    "WebEffect",
    "WebElement",
    "WebEnvironment",
    "WebEnvironmentError",
    "WebObservation",
    "WebTask",
    "WebThought",
    "answer_schema",
    "episode_view",
    "episodes",
    "eval_tasks",
    "flatten_axtree",
    "llm_max_tokens",
    "parse_action",
    "parse_axtree",
    "raw_reward_mean",
    "render_observation",
    "reward_scorer",
    "start_tape",
    "submits_form",
    "teacher_agent",
    "web_agent",
    "without_thoughts",
]
