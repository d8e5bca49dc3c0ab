"""Web agents in a real browser (extra ``web``): a Chromium environment, MiniWob++ as a task set
with a committed split, and programmatic teachers.

- :mod:`tapekit.web.steps`: BrowserGym's actions as typed steps, the observation, the call
  syntax parser.
- :class:`WebEnvironment`: one headless Chromium, a fresh context per episode, bounded,
  deadlines on every call, tapes that resume from any cut (see :mod:`tapekit.web.environment`).
- :mod:`tapekit.web.miniwob`: the tasks of the ``miniwob`` wheel, the split, evaluation tasks
  and the reward scorer.
- :mod:`tapekit.web.teacher`: policies that read only the goal and the observation.

Importing this package does not import Playwright; the browser starts with the first episode.
See docs/web.md.
"""

from tapekit.web.axtree import AXLine, flatten_axtree, parse_axtree
from tapekit.web.environment import CHROMIUM_ARGS, DEFAULT_CHROMIUM, WebEnvironment, WebEnvironmentError
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
from tapekit.web.task import PageTask, TaskStatus, WebTask

__all__ = [
    "ACTION_CLASSES",
    "CHROMIUM_ARGS",
    "DEFAULT_CHROMIUM",
    "AXLine",
    "Click",
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
    "WebAction",
    "WebEnvironment",
    "WebEnvironmentError",
    "WebObservation",
    "WebTask",
    "WebThought",
    "flatten_axtree",
    "parse_action",
    "parse_axtree",
]
