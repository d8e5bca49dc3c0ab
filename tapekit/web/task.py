"""What a web task is to the browser environment: how to set up its page for a seed, how to read
its reward, and which of its actions act on the outside world (:meth:`WebTask.effect`).
:class:`tapekit.web.miniwob.MiniWobTask` is the main implementation; :class:`PageTask` opens any
URL (for tests, simple pages with no reward, and a real site whose form submits are ``once``:
``PageTask(..., once=submits_form)``). :class:`WebEnvironmentError` is what the environment, its
browser pool and the tasks raise when they cannot work at all."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tapekit.effects import UNKNOWN
from tapekit.errors import TapekitError

if TYPE_CHECKING:
    from tapekit.effects import ToolEffect
    from tapekit.web.steps import WebAction

WebEffect = Literal["read", "once"]
"""What doing a web action again does (:meth:`WebTask.effect`): ``"read"``, nothing that
matters (MiniWob++, whose pages are local and reset per episode: every action); ``"once"``, it
acts on the outside world (a form submitted to a real site: an order, a payment, a post), so it
must never be done twice: the environment never replays it and, in a stored session, journals
it (see :mod:`tapekit.web.environment` and docs/durability.md)."""


class WebEnvironmentError(TapekitError, RuntimeError):
    """The browser environment cannot work: no Playwright, no browser executable, a launch that
    fails, a task it does not know or cannot load its pages for (no ``miniwob`` package), or a
    tape it cannot make sense of (a web action before any ``OpenTask``)."""


@dataclass(frozen=True)
class WebElement:
    """The element a web action targets, as :meth:`WebTask.effect` sees it (read from the page
    just before the action): its ``tag`` (lower case), ``type`` (an input's or a button's type,
    e.g. ``"submit"``; '' for other elements), ``id``, ``name``, ``text`` (its text, value or
    label, at most 200 characters) and, when it belongs to a form, the form's ``form_action``
    (the URL it submits to) and ``form_method`` (``"get"``, ``"post"`` or ``"dialog"``)."""

    tag: str
    type: str = ""
    id: str = ""
    name: str = ""
    text: str = ""
    form_action: str | None = None
    form_method: str | None = None


_NOT_TYPED_TEXT = frozenset({"button", "reset", "file", "hidden", "image", "submit"})


def submits_form(action: WebAction, element: WebElement | None) -> bool:
    """Whether ``action`` on ``element`` submits the element's form, the common ``once`` web
    action: a click on a submit button (``<button>`` of type submit, the default, or
    ``<input type=submit|image>``) of a form, or Enter pressed in a form's text field or on its
    submit button. A form of method ``dialog`` only closes a dialog and does not count.
    ``PageTask(..., once=submits_form)`` makes every form submit of a page ``once``.

    A GET form (a search box) counts too: whether it acts is the site's business; a task that
    knows its GET forms only read, or a site that acts from script (a ``<button type=button>``
    that posts with ``fetch``), writes its own :meth:`WebTask.effect` (by the element's ``id``,
    ``name``, ``text`` or ``form_action``)."""
    if element is None or element.form_method is None or element.form_method == "dialog":
        return False
    submit = (element.tag == "button" and element.type == "submit") or (
        element.tag == "input" and element.type in ("submit", "image")
    )
    if action.kind == "web_click":
        return submit
    if action.kind == "web_press":
        key = str(getattr(action, "key_comb", "")).split("+")[-1]
        text_field = element.tag == "input" and element.type not in _NOT_TYPED_TEXT
        return key == "Enter" and (submit or text_field)
    return False


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

    def effect(self, action: WebAction, element: WebElement | None) -> WebEffect:
        """What doing ``action`` (on ``element``, read from the page just before; None for an
        action on no element, or a bid not on the page) again would do: ``"read"`` (the
        default: every action of every MiniWob++ task) or ``"once"`` (it acts on the outside
        world; :func:`submits_form` answers the common case). A ``once`` action is never
        replayed to rebuild a page, and a stored session journals it: see
        :mod:`tapekit.web.environment`."""
        return "read"

    def reconcile(self, action: WebAction, effect: ToolEffect) -> Any:
        """Whether the ``once`` ``action`` in doubt (its intent journalled as ``effect``, no
        outcome: the session died, the page hung or the browser crashed while it ran) happened,
        looked up in the outside world (the site's orders, by ``effect.key``): any value but the
        two markers means it did (the value is kept as the outcome, and the episode goes on as
        after an outcome the journal holds); :data:`~tapekit.effects.NOT_DONE` that it did not
        (it is done now); :data:`~tapekit.effects.UNKNOWN` (the default) that it cannot be told,
        and the session waits for a person (:class:`~tapekit.effects.InDoubtToolCall`). May be
        a coroutine function. Called on resume, before anything is done again."""
        return UNKNOWN

    @property
    def declares_effects(self) -> bool:
        """Whether :meth:`effect` may answer ``"once"``: only then does the environment read
        each action's element and, in a stored session, look each action up in the journal.
        Default: whether the task's class overrides :meth:`effect`."""
        return type(self).effect is not WebTask.effect


class PageTask(WebTask):
    """A plain page: open ``url``, the goal is ``goal``; no reward, never done by itself.

    ``once`` says which actions act on the outside world (``once=submits_form``: every form
    submit; any predicate of the action and its element): those are ``"once"``
    (:meth:`WebTask.effect`), every other action reads. ``reconcile`` looks an action left in
    doubt up in the outside world (:meth:`WebTask.reconcile`)."""

    def __init__(
        self,
        name: str,
        url: str,
        goal: str = "",
        max_steps: int = 10,
        *,
        once: Callable[[WebAction, WebElement | None], bool] | None = None,
        reconcile: Callable[[WebAction, ToolEffect], Any] | None = None,
    ) -> None:
        if reconcile is not None and once is None:
            raise ValueError(f"page task {name!r}: reconcile= settles once actions; declare them with once=")
        self.name = name
        self.url = url
        self.goal = goal
        self.max_steps = max_steps
        self.once = once
        self._reconcile = reconcile

    def effect(self, action: WebAction, element: WebElement | None) -> WebEffect:
        """``"once"`` where the ``once`` predicate says so, else ``"read"``."""
        return "once" if self.once is not None and self.once(action, element) else "read"

    def reconcile(self, action: WebAction, effect: ToolEffect) -> Any:
        """The ``reconcile`` callable's answer (:data:`~tapekit.effects.UNKNOWN` without one)."""
        return UNKNOWN if self._reconcile is None else self._reconcile(action, effect)

    @property
    def declares_effects(self) -> bool:
        """Whether a ``once`` predicate was given."""
        return self.once is not None

    async def setup(self, page: Any, seed: int, timeout_s: float) -> str:
        """Open the URL (``seed`` is not used)."""
        await page.goto(self.url, timeout=timeout_s * 1000)
        return self.goal
