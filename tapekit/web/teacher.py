"""Programmatic teachers for MiniWob++: policies that read only what a student reads.

A policy sees the goal, the current :class:`~tapekit.web.steps.WebObservation` (its compact
accessibility tree) and the web actions already taken in the episode; it never looks at the
page's hidden state or the task's answer. It picks its task from the goal's wording (and, where
two tasks word goals alike, from the tree), not from the task's name, and answers with one action
and a one-line rationale. When it cannot find what it needs it gives up with
:class:`~tapekit.web.steps.SendMsgToUser`, which ends the episode: a failure on the tape, not a
guess.

:func:`teacher_agent` wraps the policies in a tapekit agent (one node, no LLM) whose tapes are
made of the same steps a student's are: demonstrations for SFT and few-shot prompts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tapekit.agent import Agent, Node
from tapekit.core import SetNextNode, Step, StopStep, Tape
from tapekit.errors import TapekitError
from tapekit.llm.base import LLMStream
from tapekit.web.axtree import AXLine, parse_axtree
from tapekit.web.steps import (
    Click,
    Fill,
    OpenTask,
    SelectOption,
    SendMsgToUser,
    WebAction,
    WebObservation,
    WebThought,
)

Decision = tuple[WebAction, str]
"""An action and its one-line rationale."""

Policy = Callable[[str, list[AXLine], Sequence[WebAction]], Decision]


class _GiveUp(TapekitError):
    """The policy cannot find what it needs on the page."""


# --------------------------------------------------------------------------- tree helpers


def _find(
    lines: list[AXLine], *, role: str | Sequence[str] | None = None, name: str | None = None
) -> list[AXLine]:
    roles = (role,) if isinstance(role, str) else role
    return [
        line
        for line in lines
        if line.bid and (roles is None or line.role in roles) and (name is None or line.name == name)
    ]


def _one(lines: list[AXLine], what: str, **query: Any) -> AXLine:
    found = _find(lines, **query)
    if not found and isinstance(query.get("name"), str):  # the goal's case may differ
        wanted = query.pop("name").casefold()
        found = [line for line in _find(lines, **query) if line.name.casefold() == wanted]
    if not found:
        raise _GiveUp(f"no {what} on the page")
    return found[0]


def _quoted(goal: str) -> list[str]:
    return re.findall(r'"([^"]*)"', goal)


def _filled(history: Sequence[WebAction], bid: str, text: str) -> bool:
    return any(isinstance(a, Fill) and a.bid == bid and a.text == text for a in history)


def _submit(lines: list[AXLine], label: str = "Submit") -> Decision:
    button = _one(lines, f"{label} button", role="button", name=label)
    return Click(bid=button.bid), f'everything is entered; click "{button.name}" [{button.bid}]'


def _textboxes(lines: list[AXLine]) -> list[AXLine]:
    return _find(lines, role=("textbox", "searchbox"))


def _text_before(lines: list[AXLine], target: AXLine) -> str:
    """The nearest text line above ``target`` (a field's label)."""
    index = lines.index(target)
    for line in reversed(lines[:index]):
        if line.role == "text" or line.role == "LabelText":
            return line.name
    return ""


# --------------------------------------------------------------------------- the policies


def click_button(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Click on the "Ok" button.': the button with that label."""
    (label,) = _quoted(goal)[:1] or [""]
    button = _one(lines, f'"{label}" button', role="button", name=label)
    return Click(bid=button.bid), f'the goal names the button "{label}": [{button.bid}]'


def click_link(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Click on the link "nam".': the link (or clickable text) with that text."""
    (text,) = _quoted(goal)[:1] or [""]
    link = _one(lines, f'link "{text}"', role=("link", "generic"), name=text)
    return Click(bid=link.bid), f'the link "{text}" is [{link.bid}]'


def click_dialog(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Close the dialog box by clicking the "x".': the dialog's Close button."""
    button = _one(lines, "close button", role="button", name="Close")
    return Click(bid=button.bid), f'the dialog closes with its "Close" button [{button.bid}]'


def click_tab(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Click on Tab #2.': the tab's link."""
    match = re.search(r"(Tab #\d+)", goal)
    if match is None:
        raise _GiveUp("no tab named in the goal")
    target = _find(lines, role="link", name=match.group(1)) or _find(lines, role="tab", name=match.group(1))
    if not target:
        raise _GiveUp(f"no {match.group(1)} on the page")
    return Click(bid=target[0].bid), f"{match.group(1)} is [{target[0].bid}]"


def focus_text(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Focus into the textbox.': click the text field."""
    box = _one(lines, "text field", role=("textbox", "searchbox"))
    return Click(bid=box.bid), f"clicking the text field [{box.bid}] focuses it"


def enter_text(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Enter "X" into the text field and press Submit.': fill, then submit."""
    (text,) = _quoted(goal)[:1] or [""]
    box = _one(lines, "text field", role=("textbox", "searchbox"))
    if box.value != text and not _filled(history, box.bid, text):
        return Fill(bid=box.bid, text=text), f'type "{text}" into the text field [{box.bid}]'
    return _submit(lines)


def fill_fields(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """enter-password ('Enter the password "X" into both text fields and press submit.') and
    login-user ('Enter the username "u" and the password "p" into the text fields and press
    login.'): each field gets its text, then the button."""
    boxes = _textboxes(lines)
    if not boxes:
        raise _GiveUp("no text fields on the page")
    if "username" in goal:
        match = re.search(r'username "([^"]*)" and the password "([^"]*)"', goal)
        if match is None:
            raise _GiveUp("the goal gives no username and password")
        user, password = match.groups()
        wanted = []
        for box in boxes:
            label = (box.name or _text_before(lines, box)).casefold()
            wanted.append(user if "user" in label else password)
        button = "Login"
    else:
        (password,) = _quoted(goal)[:1] or [""]
        wanted = [password] * len(boxes)
        button = "Submit"
    for box, text in zip(boxes, wanted, strict=True):
        if not _filled(history, box.bid, text) and box.value != text:
            label = box.name or _text_before(lines, box) or "field"
            return Fill(bid=box.bid, text=text), f'the {label} field [{box.bid}] gets "{text}"'
    return _submit(lines, button)


def select_boxes(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """click-checkboxes ('Select a, b and click Submit.', 'Select nothing ...') and click-option
    (radio buttons): make exactly the named boxes checked, then submit."""
    match = re.match(r"Select (.*) and click Submit\.?$", goal)
    if match is None:
        raise _GiveUp("the goal lists no boxes")
    names = [] if match.group(1) == "nothing" else [n.strip() for n in match.group(1).split(",")]
    boxes = _find(lines, role=("checkbox", "radio"))
    if not boxes:
        raise _GiveUp("no check boxes on the page")
    for box in boxes:
        checked = bool(box.props.get("checked"))
        if checked != (box.name in names):
            verb = "check" if not checked else "uncheck"
            return Click(bid=box.bid), f'{verb} "{box.name}" [{box.bid}]'
    missing = [n for n in names if not _find(boxes, name=n)]
    if missing:
        raise _GiveUp(f"no box named {', '.join(missing)}")
    return _submit(lines)


def choose_list(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Select X from the list and click Submit.': choose the option, then submit."""
    match = re.match(r"Select (.*) from the list and click Submit\.?$", goal)
    if match is None:
        raise _GiveUp("the goal names no item")
    item = match.group(1)
    box = _one(lines, "list", role=("combobox", "listbox"))
    if box.value != item:
        if not _find(lines, role="option", name=item):
            raise _GiveUp(f"{item!r} is not in the list")
        return SelectOption(bid=box.bid, options=item), f'select "{item}" in the list [{box.bid}]'
    return _submit(lines)


def use_autocomplete(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Enter an item that starts with "Gua" (and ends with "la").': type the start, pick the
    first suggestion that fits, submit."""
    quoted = _quoted(goal)
    if not quoted:
        raise _GiveUp("the goal gives no start")
    start, end = quoted[0], (quoted[1] if "ends with" in goal and len(quoted) > 1 else "")
    box = _one(lines, "text field", role=("textbox", "searchbox", "combobox"))
    value = box.value or ""
    picked = any(isinstance(a, Click) for a in history)  # a suggestion was chosen
    if value.startswith(start) and value.endswith(end) and (picked or len(value) > len(start)):
        return _submit(lines)
    options = [
        line
        for line in lines
        if line.bid
        and line.role in ("option", "menuitem", "listitem", "generic")
        and line.name.startswith(start)
        and line.name.endswith(end)
    ]
    if options:
        return Click(
            bid=options[0].bid
        ), f'the suggestion "{options[0].name}" fits; pick it [{options[0].bid}]'
    if _filled(history, box.bid, start):
        raise _GiveUp(f"no suggestion starts with {start!r} and ends with {end!r}")
    return Fill(bid=box.bid, text=start), f'type "{start}" into [{box.bid}] to get suggestions'


def navigate_tree(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'... click on the folder or file named "X".': click it if shown, else open the next
    closed folder."""
    (name,) = _quoted(goal)[-1:] or [""]
    for line in lines:
        if line.bid and line.name == name and line.role in ("generic", "listitem", "treeitem", "link"):
            # a folder's own label rather than its list item (which also holds its children)
            labels = [c for c in lines if c.parent == lines.index(line) and c.bid and c.name == name]
            target = labels[0] if labels else line
            return Click(bid=target.bid), f'"{name}" is [{target.bid}]'
    clicked = {a.bid for a in history if isinstance(a, Click)}
    for line in lines:
        css = str(line.props.get("class", ""))
        if line.bid and "expandable-hitarea" in css and line.bid not in clicked:
            folder = next((c.name for c in lines if c.parent == line.parent and c.name), "a folder")
            return Click(bid=line.bid), f'"{name}" is not shown; open the folder "{folder}" [{line.bid}]'
    raise _GiveUp(f'"{name}" is nowhere in the tree')


def email_inbox(goal: str, lines: list[AXLine], history: Sequence[WebAction]) -> Decision:
    """'Find the email by X and ...' star it, trash it, reply with a text or forward it."""
    match = re.match(r"Find the email by (.+?) and (.*)$", goal)
    if match is None:
        raise _GiveUp("the goal names no sender")
    sender, rest = match.groups()
    if "star" in rest or "trash" in rest:
        icon = "star" if "star" in rest else "trash"
        rows = [
            line
            for line in lines
            if line.bid and line.role == "generic" and line.name.startswith(sender + " ")
        ]
        if rows:
            row = lines.index(rows[0])
            icons = [c for c in lines if c.parent == row and c.props.get("class", "").startswith(icon)]
            if icons:
                return Click(bid=icons[0].bid), f"the {icon} icon of {sender}'s email is [{icons[0].bid}]"
        raise _GiveUp(f"no email by {sender}")
    reply = re.search(r'reply to them with the text "(.*)"', rest)
    forward = re.search(r"forward that email to (.+?)\.?$", rest)
    if reply is None and forward is None:
        raise _GiveUp("the goal asks for nothing known")
    textboxes = _textboxes(lines)
    if reply is not None:
        text = reply.group(1)
        if textboxes:  # the reply form is open
            box = textboxes[-1]
            if not _filled(history, box.bid, text):
                return Fill(bid=box.bid, text=text), f'write "{text}" in the reply [{box.bid}]'
            send = _by_hint(lines, "send-reply")
            return Click(bid=send.bid), f"send the reply [{send.bid}]"
        opener = _find(lines, role="generic", name="Reply")
    else:
        assert forward is not None
        recipient = forward.group(1)
        if textboxes:  # the forward form is open: the first field is the recipient
            box = textboxes[0]
            if not _filled(history, box.bid, recipient):
                return Fill(bid=box.bid, text=recipient), f'address the forward to "{recipient}" [{box.bid}]'
            send = _by_hint(lines, "send-forward")
            return Click(bid=send.bid), f"send the forward [{send.bid}]"
        opener = _find(lines, role="generic", name="Forward")
    if opener:
        return Click(bid=opener[0].bid), f'the email is open; click "{opener[0].name}" [{opener[0].bid}]'
    rows = [
        line for line in lines if line.bid and line.role == "generic" and line.name.startswith(sender + " ")
    ]
    if rows:
        return Click(bid=rows[0].bid), f"open {sender}'s email [{rows[0].bid}]"
    raise _GiveUp(f"no email by {sender}")


def _by_hint(lines: list[AXLine], hint: str) -> AXLine:
    for line in lines:
        if line.bid and (line.props.get("class") == hint or line.props.get("id") == hint):
            return line
    raise _GiveUp(f"no {hint} button on the page")


POLICIES: list[tuple[re.Pattern[str], Policy]] = [
    (re.compile(r'^Click on the "[^"]*" button'), click_button),
    (re.compile(r"^Click on the link "), click_link),
    (re.compile(r"^Close the dialog box"), click_dialog),
    (re.compile(r"^Click on Tab #\d+\.?$"), click_tab),
    (re.compile(r"^Focus into the textbox"), focus_text),
    (re.compile(r'^Enter "[^"]*" into the text field and press Submit'), enter_text),
    (re.compile(r"^Enter the (password|username) "), fill_fields),
    (re.compile(r"^Select .* from the list and click Submit"), choose_list),
    (re.compile(r"^Select .* and click Submit"), select_boxes),
    (re.compile(r"^Enter an item that starts with "), use_autocomplete),
    (re.compile(r"^Navigate through the file tree"), navigate_tree),
    (
        re.compile(
            r"^Find the email by .+ and (click the (star|trash) icon|reply to them|forward that email)"
        ),
        email_inbox,
    ),
]
"""Goal patterns and the policy for each: 12 policies covering 14 MiniWob++ tasks (enter-password
and login-user share one, click-checkboxes and click-option another)."""


def policy_for(goal: str) -> Policy | None:
    """The policy whose goal pattern ``goal`` matches (None: no teacher for it)."""
    return next((policy for pattern, policy in POLICIES if pattern.search(goal)), None)


def teach(observation: WebObservation, history: Sequence[WebAction] = ()) -> Decision:
    """The teacher's action for ``observation`` (and the episode's actions so far that worked),
    with its rationale. Gives up with :class:`SendMsgToUser` when no policy fits or the page lacks what
    the policy needs."""
    policy = policy_for(observation.goal)
    if policy is None:
        return SendMsgToUser(text="I have no policy for this goal"), "no teacher policy matches the goal"
    try:
        return policy(observation.goal, parse_axtree(observation.axtree), history)
    except _GiveUp as e:
        return SendMsgToUser(text=f"I cannot do this: {e}"), str(e)


def _episode(tape: Tape[Any, Any]) -> tuple[WebObservation | None, list[WebAction]]:
    """The last observation of the tape's current episode and the web actions taken in it that
    worked (an action whose observation reports an error is left out: it may not have happened)."""
    history: list[WebAction] = []
    pending: list[WebAction] = []
    last: WebObservation | None = None
    for step in tape.steps:
        if isinstance(step, OpenTask):
            history, pending, last = [], [], None
        elif isinstance(step, WebAction):
            pending.append(step)
        elif isinstance(step, WebObservation):
            last = step
            if pending and not step.last_action_error:
                history.append(pending[0])
            pending = pending[1:]
    return last, history


class TeacherNode(Node):
    """The teacher as a node: reads the tape's last observation and the episode's actions,
    writes a :class:`WebThought` rationale (unless ``rationale`` is False) and one action, or a
    :class:`StopStep` once the episode is done. It calls no LLM."""

    rationale: bool = True

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Step]:
        """The next action (after ``SetNextNode`` to itself, so the agent loops on this node)."""
        observation, history = _episode(tape)
        if observation is None:
            yield StopStep(reason="no web observation on the tape: start from an OpenTask")
            return
        if observation.done:
            outcome = "solved" if observation.reward > 0 else "failed"
            yield StopStep(reason=f"episode over ({outcome}, reward {observation.reward:g})")
            return
        action, why = teach(observation, history)
        if self.rationale:
            yield WebThought(text=why)
        yield SetNextNode(next_node=self.name)
        yield action


def teacher_agent(name: str = "teacher", rationale: bool = True) -> Agent:
    """An agent that runs the programmatic teacher (no LLM): use it with a
    :class:`~tapekit.web.WebEnvironment` in ``main_loop`` or ``evaluate``."""
    return Agent.create(name, nodes=[TeacherNode(name="teach", rationale=rationale)])
