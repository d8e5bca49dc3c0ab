"""The steps of a web session: BrowserGym's action vocabulary as typed tapekit actions, the
observation the browser environment answers with, and a parser for BrowserGym's call syntax.

Every action has :meth:`WebAction.call`, the action as BrowserGym writes it (``click('12')``,
``fill('7', "Ana")``), and :func:`parse_action` reads that text back, so an LLM agent can
answer in the call syntax and a tape can be replayed in stock BrowserGym. Kinds are prefixed
``web_`` to stay apart from other libraries' steps.
"""

from __future__ import annotations

import ast
import json
from typing import Any, ClassVar, Literal

from pydantic import Field

from tapekit.core import Action, Attachment, Observation, StepPresentation, Thought


def _lit(value: Any, quote: str = '"') -> str:
    """A Python literal as BrowserGym's call text writes it: strings double-quoted and
    JSON-escaped, or, with ``quote="'"``, single-quoted (backslash, quote and line breaks
    escaped)."""
    if isinstance(value, str):
        if quote == "'":
            escaped = value.replace("\\", "\\\\").replace("'", "\\'")
            return "'" + escaped.replace("\n", "\\n").replace("\r", "\\r") + "'"
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_lit(v, quote) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


class WebAction(Action):
    """An action the browser environment performs on the episode's page.

    Subclasses name BrowserGym's function in ``function`` and list its arguments, in order, in
    ``arguments``; :meth:`call` writes the action as BrowserGym's call text.
    """

    function: ClassVar[str] = ""
    arguments: ClassVar[tuple[str, ...]] = ()

    def call(self, quote: str = '"') -> str:
        """The action in BrowserGym's syntax, e.g. ``click("12")`` or ``fill("7", "Ana")``;
        ``quote="'"`` writes strings single-quoted (``fill('7', 'Ana')``)."""
        if quote not in ('"', "'"):
            raise ValueError(f"quote must be '\"' or \"'\", got {quote!r}")
        args = ", ".join(_lit(getattr(self, name), quote) for name in self.arguments)
        return f"{self.function}({args})"


class Click(WebAction):
    """Click the element with browser id ``bid`` (its center, with Playwright's checks)."""

    kind: Literal["web_click"] = "web_click"
    function: ClassVar[str] = "click"
    arguments: ClassVar[tuple[str, ...]] = ("bid",)
    bid: str


class Fill(WebAction):
    """Replace the text of the input, textarea or contenteditable element ``bid`` with ``text``."""

    kind: Literal["web_fill"] = "web_fill"
    function: ClassVar[str] = "fill"
    arguments: ClassVar[tuple[str, ...]] = ("bid", "text")
    bid: str
    text: str


class SelectOption(WebAction):
    """Select one or several options (by value or label) of the ``<select>`` element ``bid``."""

    kind: Literal["web_select_option"] = "web_select_option"
    function: ClassVar[str] = "select_option"
    arguments: ClassVar[tuple[str, ...]] = ("bid", "options")
    bid: str
    options: str | list[str]


class Press(WebAction):
    """Focus element ``bid`` and press a key combination (``Enter``, ``Control+a``, ``a``)."""

    kind: Literal["web_press"] = "web_press"
    function: ClassVar[str] = "press"
    arguments: ClassVar[tuple[str, ...]] = ("bid", "key_comb")
    bid: str
    key_comb: str


class Hover(WebAction):
    """Move the mouse over element ``bid``."""

    kind: Literal["web_hover"] = "web_hover"
    function: ClassVar[str] = "hover"
    arguments: ClassVar[tuple[str, ...]] = ("bid",)
    bid: str


class Scroll(WebAction):
    """Scroll by ``dx``, ``dy`` pixels (a mouse wheel event; positive is right and down)."""

    kind: Literal["web_scroll"] = "web_scroll"
    function: ClassVar[str] = "scroll"
    arguments: ClassVar[tuple[str, ...]] = ("dx", "dy")
    dx: float
    dy: float


class GoBack(WebAction):
    """Go back in the page's history."""

    kind: Literal["web_go_back"] = "web_go_back"
    function: ClassVar[str] = "go_back"


class Noop(WebAction):
    """Do nothing for ``wait_ms`` milliseconds (let an animation or a timer finish)."""

    kind: Literal["web_noop"] = "web_noop"
    function: ClassVar[str] = "noop"
    arguments: ClassVar[tuple[str, ...]] = ("wait_ms",)
    wait_ms: float = 1000


class SendMsgToUser(WebAction):
    """The agent's final answer: it ends the episode, which keeps the reward it has."""

    kind: Literal["web_send_msg_to_user"] = "web_send_msg_to_user"
    function: ClassVar[str] = "send_msg_to_user"
    arguments: ClassVar[tuple[str, ...]] = ("text",)
    text: str


class OpenTask(Action):
    """Start an episode of ``task`` with ``seed``: the environment opens a fresh page and answers
    with the first :class:`WebObservation`. ``max_steps`` overrides the task's step limit.

    A start tape holds this one action, so it is plain data: making it needs no browser.
    """

    kind: Literal["web_open_task"] = "web_open_task"
    task: str
    seed: int
    max_steps: int | None = None


class WebThought(Thought):
    """A one-line rationale the agent writes before its action."""

    kind: Literal["web_thought"] = "web_thought"
    text: str


class WebObservation(Observation):
    """What the browser shows after an action (or after :class:`OpenTask`).

    ``axtree`` is the compact accessibility tree (see :mod:`tapekit.web.axtree`): one line per
    node, ``[bid] role "name" properties``, with the bids actions refer to. ``last_action_error``
    says why the action just answered failed ('' when it did not); ``reward`` and ``done`` come
    from the task; ``truncated`` is set when the episode ended without the task ending it (step
    limit, final answer, a page that hung). ``step`` counts the episode's actions so far.
    ``screenshot`` is a base64 PNG, only when the environment was asked to take them. Timings
    are kept in ``metadata.other`` (``browser_s``), out of prompts and diffs.
    """

    kind: Literal["web_observation"] = "web_observation"
    task: str
    seed: int
    episode_id: str
    goal: str
    axtree: str = ""
    url: str = ""
    title: str = ""
    last_action_error: str = ""
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    step: int = 0
    info: dict[str, Any] = Field(default_factory=dict)
    screenshot: str | None = None

    def present(self) -> StepPresentation:
        """The page as people see it: the gist (the episode's step, the page, the reward and
        state, the action's error, the goal), the panel's fields (URL, title, task, step,
        reward, state, goal, accessibility tree, task info), the action's error as a banner,
        and the screenshot as a PNG attachment, shown in the step's JSON as a note such as
        ``"<screenshot: 41 KB PNG>"``.

        Every field is read with a default, so an observation stored in an older format (the
        Studio builds it without validation) still shows its page and its screenshot.
        """
        get = self.__dict__.get  # set fields only: a step built by model_construct may lack some
        step, url, title, goal = get("step", 0), get("url", ""), get("title", ""), get("goal", "")
        reward, done, truncated = get("reward", 0.0), get("done", False), get("truncated", False)
        error, axtree, info = get("last_action_error", ""), get("axtree", ""), get("info") or {}
        parts = [f"step {step}: {url or title or '(no page)'}"]
        if done or reward:
            parts.append(f"reward {reward:g}")
        if truncated:
            parts.append("truncated")
        elif done:
            parts.append("done")
        if error:
            parts.append(f"error: {error}")
        if goal:
            parts.append(f"goal: {goal}")
        fields: dict[str, Any] = {"url": url or "—"}
        if title:
            fields["title"] = title
        fields["task"] = f"{get('task', '?')} (seed {get('seed', '?')})"
        fields["step"] = step
        fields["reward"] = reward
        fields["episode"] = "truncated" if truncated else "done" if done else "going on"
        if goal:
            fields["goal"] = goal
        fields["accessibility tree"] = axtree or "(empty)"
        if info:
            fields["task info"] = info
        attachments, notes = {}, {}
        shot = get("screenshot")
        if isinstance(shot, str) and shot:
            png = Attachment.from_base64("image/png", shot)
            attachments["screenshot"] = png
            valid = png.data() is not None
            notes["screenshot"] = (
                f"<screenshot: {png.describe()}>"
                if valid
                else f"<screenshot: {len(shot)} characters, not a base64 PNG>"
            )
        return StepPresentation(
            summary=" · ".join(parts),
            title="Page",
            fields=fields,
            attachments=attachments,
            notes=notes,
            error=f"last action failed: {error}" if error else "",
        )


ACTION_CLASSES: dict[str, type[WebAction]] = {
    "click": Click,
    "fill": Fill,
    "select_option": SelectOption,
    "press": Press,
    "hover": Hover,
    "scroll": Scroll,
    "go_back": GoBack,
    "noop": Noop,
    "send_msg_to_user": SendMsgToUser,
}
"""BrowserGym's function names and the action classes they parse to."""


# BrowserGym's own keyword names, accepted as aliases
_ALIASES = {"value": "text", "delta_x": "dx", "delta_y": "dy"}


def parse_action(text: str) -> WebAction:
    """One action from BrowserGym's call syntax: ``click('12')``, ``fill("4", "Ana")``,
    ``select_option('9', ["red", "blue"])``, ``scroll(0, 200)``, ``send_msg_to_user("done")``.

    Arguments must be literals; BrowserGym's keyword names (``value``, ``delta_x``) are
    accepted. Raises ``ValueError`` saying what is wrong (not a call, unknown function,
    missing, extra or repeated arguments: ``click('1', bid='2')`` is an error, not a click on
    ``'2'``), for an agent to show the model.
    """
    source = text.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an action call: {source[:80]!r} ({e.msg})") from None
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ValueError(f"not an action call: {source[:80]!r}; write e.g. click('12')")
    name = call.func.id
    cls = ACTION_CLASSES.get(name)
    if cls is None:
        raise ValueError(f"unknown action {name!r}; known: {', '.join(ACTION_CLASSES)}")
    params = cls.arguments
    if len(call.args) > len(params):
        raise ValueError(f"{name} takes {len(params)} arguments ({', '.join(params)}), got {len(call.args)}")
    # which argument each value is for: the positions, then the keywords (never one twice)
    given: list[tuple[str, ast.expr]] = list(zip(params, call.args, strict=False))
    for keyword in call.keywords:
        key = _ALIASES.get(keyword.arg or "", keyword.arg or "")
        if key not in params:
            raise ValueError(f"{name} has no argument {keyword.arg!r}; it takes {', '.join(params)}")
        if any(key == seen for seen, _ in given):  # click('1', bid='2'): which one?
            spelled = keyword.arg if keyword.arg == key else f"{keyword.arg} (= {key})"
            raise ValueError(f"{name} got argument {spelled!r} twice")
        given.append((key, keyword.value))
    values: dict[str, Any] = {}
    try:
        for key, node in given:
            values[key] = ast.literal_eval(node)
    except (ValueError, SyntaxError) as e:
        raise ValueError(f"{name}: arguments must be literals ({e})") from None
    for key in ("bid",):
        if key in values and isinstance(values[key], int):
            values[key] = str(values[key])
    try:
        return cls(**values)
    except Exception as e:  # pydantic's ValidationError: missing or mistyped arguments
        raise ValueError(
            f"{name}: {e}".splitlines()[0] + f" (takes {', '.join(params) or 'nothing'})"
        ) from None
