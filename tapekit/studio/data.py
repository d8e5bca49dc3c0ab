"""What the Studio's pages show, computed from a tape store: step rows, step details with the
LLM call and the view stack, tape diffs and batch matching. Plain data, no HTML (the templates
escape everything they print)."""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, ValidationError

from tapekit._diff import first_divergence, signatures
from tapekit.agent import Agent, AgentError
from tapekit.core import Call, Respond, Step, StepMetadata, Tape, step_kinds
from tapekit.llm.base import LLMCall
from tapekit.rendering import step_author, step_category
from tapekit.store import TapeInfo, TapeStore
from tapekit.views import TapeView, TapeViewStack

__all__ = [
    "BatchMatch",
    "DiffRow",
    "StepRow",
    "TapeCache",
    "UnknownStep",
    "ViewInfo",
    "batch_pairs",
    "diff_rows",
    "lenient_step",
    "lenient_steps",
    "lenient_tape",
    "restore_screenshot",
    "root_agent_name",
    "screenshot_note",
    "screenshot_png",
    "shown_fields",
    "start_key",
    "step_author",
    "step_row",
    "step_summary",
    "view_infos",
    "web_fields",
]

SUMMARY_WIDTH = 240


SCREENSHOT_KINDS = frozenset({"web_observation"})
"""Step kinds whose ``screenshot`` field is a base64 PNG (``tapekit.web``'s observations)."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_SCREENSHOT_BYTES = 20_000_000


def screenshot_png(step: Step) -> bytes | None:
    """The PNG bytes of a web observation's ``screenshot``; None when the step has none or it is
    not valid base64 of a PNG (the Studio then shows no image rather than failing).

    Works on :class:`UnknownStep` too (the step class not imported: the field is a raw extra).
    """
    if step.kind not in SCREENSHOT_KINDS:
        return None
    value = getattr(step, "screenshot", None)
    if not isinstance(value, str) or not value or len(value) > MAX_SCREENSHOT_BYTES * 4 // 3 + 4:
        return None
    try:
        png = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return png if png.startswith(PNG_SIGNATURE) else None


def screenshot_note(step: Step) -> str | None:
    """What the step's JSON shows instead of its base64 ``screenshot`` (None: nothing to elide)."""
    return _note(step, screenshot_png(step))


def _note(step: Step, png: bytes | None) -> str | None:
    """:func:`screenshot_note` for a step whose :func:`screenshot_png` is ``png``."""
    if step.kind not in SCREENSHOT_KINDS:
        return None
    value = getattr(step, "screenshot", None)
    if not isinstance(value, str) or not value:
        return None
    if png is None:
        return f"<screenshot: {len(value)} characters, not a base64 PNG>"
    size = f"{len(png)} B" if len(png) < 1024 else f"{round(len(png) / 1024)} KB"
    return f"<screenshot: {size} PNG>"


def shown_fields(step: Step) -> dict[str, Any]:
    """The step's content (:meth:`Step.llm_dict`) as the Studio prints it: a web observation's
    screenshot replaced by :func:`screenshot_note` (the image itself is served on its own URL)."""
    fields = step.llm_dict()
    note = screenshot_note(step)
    if note is not None:
        fields["screenshot"] = note
    return fields


def restore_screenshot(new: Step, old: Step) -> Step:
    """``new`` (an edit of ``old`` from the step JSON box) with ``old``'s screenshot back when the
    edit left the screenshot's note as it was shown; any other value is the user's."""
    note = screenshot_note(old)
    if note is None or new.kind != old.kind or getattr(new, "screenshot", None) != note:
        return new
    return new.model_copy(update={"screenshot": getattr(old, "screenshot", None)})


WEB_FIELDS = ("url", "title", "goal", "reward", "done", "truncated", "step", "last_action_error")


def web_fields(step: Step) -> dict[str, Any] | None:
    """A web observation's fields for its own panel section (None for other steps): the page's
    URL and title, the goal, reward and episode state, the action's error, the accessibility
    tree, the task and the task's info; whether there is a viewable screenshot."""
    if step.kind not in SCREENSHOT_KINDS:
        return None
    data = step.llm_dict()
    out = {name: data.get(name) for name in WEB_FIELDS}
    out["axtree"] = data.get("axtree") or ""
    out["task"] = f"{data.get('task', '?')} (seed {data.get('seed', '?')})"
    out["info"] = data.get("info") or {}
    png = screenshot_png(step)  # decoded once for the note and the image
    out["screenshot"] = _note(step, png)
    out["has_png"] = png is not None
    return out


def step_summary(step: Step, width: int = SUMMARY_WIDTH) -> str:
    """A one-line gist of a step's content (the full JSON is on the step's page)."""
    if isinstance(step, Call):
        text = f"calls {step.agent_name}: {step.content}"
    elif isinstance(step, Respond):
        text = f"responds: {step.content}"
    elif step.kind in SCREENSHOT_KINDS and not isinstance(step, UnknownStep):
        text = _web_summary(step)
    elif isinstance(step, UnknownStep):
        fields = {k: v for k, v in shown_fields(step).items() if k != "kind"}
        text = "(step class not loaded: start the Studio with --import MODULE) " + json.dumps(
            fields, ensure_ascii=False, default=str
        )
    else:
        fields = shown_fields(step)
        fields.pop("kind", None)
        fields = {k: v for k, v in fields.items() if v not in (None, "", [], {})}
        if len(fields) == 1:
            text = _text(next(iter(fields.values())))
        else:
            text = " · ".join(f"{k}: {_text(v)}" for k, v in fields.items())
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _web_summary(step: Step) -> str:
    """A web observation's gist: the page, the episode's state, the action's error, the goal
    (the accessibility tree and the screenshot are in the step's panel)."""
    web = web_fields(step) or {}
    parts = [f"step {web['step']}: {web['url'] or web['title'] or '(no page)'}"]
    if web["done"] or web["reward"]:
        parts.append(f"reward {web['reward']:g}")
    if web["truncated"]:
        parts.append("truncated")
    elif web["done"]:
        parts.append("done")
    if web["last_action_error"]:
        parts.append(f"error: {web['last_action_error']}")
    if web["goal"]:
        parts.append(f"goal: {web['goal']}")
    return " · ".join(parts)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


class UnknownStep(Step):
    """A stored step whose ``kind`` no loaded step class declares (or that its class no longer
    accepts): the Studio shows its kind and raw fields instead of failing the page. Start the
    Studio with ``--import MODULE`` (or ``--agent``) to load the real classes."""

    model_config = ConfigDict(extra="allow")

    kind: str


def lenient_step(data: Any) -> Step:
    """``data`` (a stored step's JSON object) as its step class, or as an :class:`UnknownStep`."""
    cls = step_kinds().get(str(data.get("kind"))) if isinstance(data, dict) else None
    if cls is not None:
        try:
            return cls.model_validate(data)
        except ValidationError:
            pass
    if not isinstance(data, dict):
        data = {"kind": "?", "value": data}
    fields = {k: v for k, v in data.items() if k not in ("metadata", "kind")}
    try:
        meta = StepMetadata.model_validate(data.get("metadata") or {})
    except ValidationError:
        meta = StepMetadata()
    return UnknownStep(metadata=meta, kind=str(data.get("kind", "?")), **fields)


def lenient_steps(store: TapeStore, tape_id: str, start: int, stop: int) -> list[Step]:
    """Steps ``start:stop`` of a stored tape, those of unknown kinds as :class:`UnknownStep`."""
    return [lenient_step(data) for data in store.get_raw_steps(tape_id, start, stop)]


def lenient_tape(store: TapeStore, info: TapeInfo) -> Tape[Any, Any]:
    """The stored tape ``info.id``, steps of unknown kinds as :class:`UnknownStep`."""
    steps = lenient_steps(store, info.id, 0, info.n_steps)
    return Tape(metadata=info.metadata, context=store.get_raw_context(info.id), steps=steps)


@dataclass(frozen=True, slots=True)
class StepRow:
    """One line of a step list: index, category (the colour), author, kind, gist, LLM usage."""

    index: int
    category: str
    author: str
    kind: str
    summary: str
    prompt_id: str
    run_start: bool
    tokens: str = ""
    screenshot: bool = False


def step_row(step: Step, index: int, run_start: bool = False, call: LLMCall | None = None) -> StepRow:
    """The row for ``step`` at ``index``; ``call`` (the LLM call of its node run) adds tokens."""
    tokens = f"{call.prompt_tokens}+{call.output_tokens} tok" if call is not None else ""
    return StepRow(
        index=index,
        category="unknown" if isinstance(step, UnknownStep) else step_category(step),
        author=step_author(step),
        kind=step.kind,
        summary=step_summary(step),
        prompt_id=step.metadata.prompt_id,
        run_start=run_start,
        tokens=tokens,
        screenshot=screenshot_png(step) is not None,
    )


def root_agent_name(steps: Sequence[Step]) -> str | None:
    """The root agent of the team that made the steps (from the first agent-made step)."""
    for step in steps:
        if step.metadata.agent:
            return step.metadata.agent.split("/")[0]
    return None


@dataclass(frozen=True, slots=True)
class ViewInfo:
    """One frame of the tape view stack, as the step page shows it."""

    agent_name: str
    last_node: str | None
    next_node: str | None
    run_open: bool
    n_steps: int
    steps: list[StepRow] = field(default_factory=list)


def view_infos(
    tape: Tape[Any, Any], root_name: str, agent: Agent | None = None, last: int = 8
) -> list[ViewInfo]:
    """The view stack after ``tape``'s steps, root first: each view's agent, nodes and last
    steps (memoised on the tape, like the agent's own views).

    With the team's root ``agent`` the next node is the one the agent would select; without it
    only a ``SetNextNode`` on the tape tells.
    """
    stack = TapeViewStack.compute(tape, root_name)
    index_of = {id(s): i for i, s in enumerate(tape.steps)}
    out = []
    for view in stack.views:
        rows = [step_row(s, index_of.get(id(s), -1)) for s in list(view.steps)[-last:]]
        out.append(
            ViewInfo(
                agent_name=view.agent_name,
                last_node=view.last_node,
                next_node=_next_node(view, agent),
                run_open=view.run_open,
                n_steps=len(view.steps),
                steps=rows,
            )
        )
    return out


def _next_node(view: TapeView, agent: Agent | None) -> str | None:
    if view.run_open:  # resuming here finishes the open run first
        return f"{view.last_node} (finishing its run)"
    if agent is not None:
        try:
            return agent.find_agent(view.agent_name).select_node(view).name
        except AgentError as e:
            return f"none ({e})"
    return None if view.next_node is None else str(view.next_node)


# --------------------------------------------------------------------------- diffs


@dataclass(frozen=True, slots=True)
class DiffRow:
    """Position ``index`` in two tapes side by side; ``same`` when the steps match."""

    index: int
    a: StepRow | None
    b: StepRow | None
    same: bool


def diff_rows(
    a: Sequence[Step],
    b: Sequence[Step],
    start: int,
    stop: int,
    signatures_a: list[dict[str, Any]] | None = None,
    signatures_b: list[dict[str, Any]] | None = None,
) -> tuple[list[DiffRow], int | None]:
    """Rows ``start:stop`` of the side-by-side diff and the first divergent index (None: equal).

    Steps are compared as replay compares them (content, agent, node and node-run grouping; ids
    and timestamps aside); pass the tapes' ``signatures`` if you have them already.
    """
    sa = signatures_a if signatures_a is not None else signatures(a)
    sb = signatures_b if signatures_b is not None else signatures(b)
    first = first_divergence(sa, sb)
    rows = []
    for i in range(start, min(stop, max(len(a), len(b)))):
        ra = step_row(a[i], i) if i < len(a) else None
        rb = step_row(b[i], i) if i < len(b) else None
        same = i < len(sa) and i < len(sb) and sa[i] == sb[i]
        rows.append(DiffRow(index=i, a=ra, b=rb, same=same))
    return rows, first


@dataclass(frozen=True, slots=True)
class BatchMatch:
    """Two tapes from two batches that started the same way, or one left without a partner."""

    a: Any | None
    b: Any | None
    matched_by: str
    first_divergence: int | None = None
    identical: bool = False


def start_key(steps: Sequence[Step]) -> str:
    """The steps before the first agent-made step (the task), as a comparable text."""
    head = []
    for step in steps:
        if step.metadata.agent:
            break
        head.append(step.llm_dict())
    return json.dumps(head, sort_keys=True, ensure_ascii=False)


def batch_pairs(
    a: Sequence[tuple[Any, Sequence[Step]]], b: Sequence[tuple[Any, Sequence[Step]]]
) -> list[BatchMatch]:
    """Pair the tapes of batch ``a`` with those of batch ``b`` that started the same way.

    Each item is ``(info, first_steps)`` where ``info`` has ``id`` and ``parent_id``. A pair
    shares its parent tape, or else the same steps before the first agent step; each tape is
    used once, in batch order. Unpaired tapes are listed at the end.
    """
    left = list(range(len(b)))
    out: list[BatchMatch] = []
    unpaired_a = []
    for info_a, steps_a in a:
        match = None
        if info_a.parent_id:
            match = next((j for j in left if b[j][0].parent_id == info_a.parent_id), None)
            how = "same parent"
        if match is None:
            key = start_key(steps_a)
            match = next((j for j in left if start_key(b[j][1]) == key), None)
            how = "same first steps"
        if match is None:
            unpaired_a.append(info_a)
            continue
        left.remove(match)
        out.append(BatchMatch(a=info_a, b=b[match][0], matched_by=how))
    out += [BatchMatch(a=info, b=None, matched_by="no partner") for info in unpaired_a]
    out += [BatchMatch(a=None, b=b[j][0], matched_by="no partner") for j in left]
    return out


# --------------------------------------------------------------------------- a small tape cache


class TapeCache:
    """The last few whole tapes loaded (and what was derived from them, such as their diff
    signatures), keyed by tape id and length: a stored tape only ever grows.

    Step pages need every step before the one shown (to fold the view stack); keeping the tape
    makes clicking through a long tape cost one load, and its memoised views fold only once.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        """The cached value (a tape, or something derived from one), if any."""
        with self._lock:
            tape = self._items.get(key)
            if tape is not None:
                self._items.move_to_end(key)
            return tape

    def put(self, key: Any, value: Any) -> None:
        """Remember ``value``; the least recently used entry goes when the cache is full."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
