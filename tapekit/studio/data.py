"""What the Studio's pages show, computed from a tape store: step rows, step details with the
LLM call and the view stack, tape diffs and batch matching. Plain data, no HTML (the templates
escape everything they print).

The Studio knows no step kind by name: what a step shows (its gist, its own panel section, its
attachments, the notes that stand in for bulky fields of its JSON) is the step's
presentation (:meth:`tapekit.core.Step.present`).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, ValidationError

from tapekit._diff import first_divergence, signatures
from tapekit.agent import Agent, AgentError
from tapekit.core import (
    MAX_ATTACHMENT_BYTES,
    Attachment,
    Step,
    StepMetadata,
    StepPresentation,
    Tape,
    find_step_class,
    media_type_matches,
)
from tapekit.llm.base import LLMCall
from tapekit.rendering import presentation, shorten, step_author, step_category
from tapekit.store import TapeInfo, TapeStore
from tapekit.views import TapeView, TapeViewStack

SUMMARY_WIDTH = 240
SHORT_TEXT = 80
"""A field's text up to this long, on one line, shows as a labelled value; longer, as a block."""
INLINE_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Attachments shown as images in the panel (and served inline); no SVG (it may hold script)."""
INLINE_TYPES = INLINE_IMAGES | {"text/plain"}
"""Attachments served as themselves; any other type is served as a download of bytes."""
ATTACHMENT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def step_summary(step: Step, width: int = SUMMARY_WIDTH) -> str:
    """A one-line gist of a step's content (its presentation's summary; the full JSON is on the
    step's page)."""
    return shorten(presentation(step).summary, width)


def shown_fields(step: Step, shown: StepPresentation | None = None) -> dict[str, Any]:
    """The step's content (:meth:`Step.llm_dict`) as the Studio prints it: bulky fields replaced
    by the notes of its presentation (``shown``, if already made)."""
    fields = step.llm_dict()
    notes = (shown or presentation(step)).notes
    fields.update({name: note for name, note in notes.items() if name in fields})
    return fields


def restore_noted(new: Step, old: Step) -> Step:
    """``new`` (an edit of ``old`` from the step JSON box) with ``old``'s values back for the
    fields whose note the edit left as it was shown; any other value is the user's."""
    if new.kind != old.kind:
        return new
    notes = presentation(old).notes
    kept = {name: getattr(old, name) for name, note in notes.items() if getattr(new, name, None) == note}
    return new.model_copy(update=kept) if kept else new


def attachment_bytes(attachment: Attachment) -> bytes | None:
    """The bytes the Studio may serve for ``attachment``: None unless there are some, no more
    than :data:`MAX_ATTACHMENT_BYTES`, and they begin as files of their media type do."""
    data = attachment.data()
    if data is None or len(data) > MAX_ATTACHMENT_BYTES:
        return None
    return data if media_type_matches(data, attachment.media_type) else None


@dataclass(frozen=True, slots=True)
class ShownAttachment:
    """An attachment in a step's panel: its name, the file name it is served under, whether it
    can be served (``ok``) and shown as an image, and its size and format (or why not)."""

    name: str
    filename: str
    media_type: str
    ok: bool
    image: bool
    about: str


@dataclass(frozen=True, slots=True)
class Panel:
    """A step's own section of its panel, from its presentation: a heading, an error banner,
    labelled values, text blocks, JSON values and attachments."""

    title: str
    error: str
    values: list[tuple[str, Any]]
    texts: list[tuple[str, str]]
    data: list[tuple[str, Any]]
    attachments: list[ShownAttachment]


def panel(shown: StepPresentation) -> Panel | None:
    """The panel section for a presentation (None: it has no fields, attachments or error).
    A field shows by its value's type: a list or dict as JSON, a long or multi-line text as a
    block, anything else as a labelled value."""
    if not (shown.fields or shown.attachments or shown.error):
        return None
    values, texts, data = [], [], []
    for name, value in shown.fields.items():
        if isinstance(value, dict | list | tuple):
            data.append((name, value))
        elif isinstance(value, str) and (len(value) > SHORT_TEXT or "\n" in value):
            texts.append((name, value))
        else:
            values.append((name, "—" if value is None else value))
    files = [
        ShownAttachment(
            name=name,
            filename=f"{name}.{a.extension}",
            media_type=a.media_type,
            ok=attachment_bytes(a) is not None,
            image=a.media_type in INLINE_IMAGES,
            about=a.describe(),
        )
        for name, a in shown.attachments.items()
        if ATTACHMENT_NAME.fullmatch(name)
    ]
    return Panel(shown.title or "Details", shown.error, values, texts, data, files)


class UnknownStep(Step):
    """A stored step whose ``kind`` no loaded step class declares (or that its class no longer
    accepts): the Studio shows its kind and raw fields instead of failing the page. Start the
    Studio with ``--import MODULE`` (or ``--agent``) to load the real classes.

    It is presented by the class of its kind when one is found (:func:`find_step_class`: a
    loaded class, or one from the module registered for the kind), built without validation
    from the stored fields; that keeps, e.g., the attachments of a step stored in an older
    format. Its summary is its raw fields, the presentation's notes in place of bulky ones.
    """

    model_config = ConfigDict(extra="allow")

    kind: str

    def present(self) -> StepPresentation:
        """The presentation of its kind's class, if any (else the default), with its raw
        fields as the summary, marked as not loaded or not valid."""
        content = {k: v for k, v in self.llm_dict().items() if k != "kind"}
        cls = find_step_class(self.kind)
        shown = None
        if cls is not None:
            try:
                built = cls.model_construct(metadata=self.metadata, kind=self.kind, **content)
                shown = built.present()
            except Exception:
                shown = None
        shown = shown or StepPresentation(summary="")
        content.update({k: note for k, note in shown.notes.items() if k in content})
        why = (
            f"(its fields do not validate as {cls.__name__}) "
            if cls is not None
            else "(step class not loaded: start the Studio with --import MODULE) "
        )
        return StepPresentation(
            summary=why + json.dumps(content, ensure_ascii=False, default=str),
            title=shown.title,
            fields=shown.fields,
            attachments=shown.attachments,
            notes=shown.notes,
            error=shown.error,
        )


def lenient_step(data: Any) -> Step:
    """``data`` (a stored step's JSON object) as its step class (importing the module
    registered for its kind if need be: :func:`tapekit.core.find_step_class`), or as an
    :class:`UnknownStep`."""
    cls = find_step_class(str(data.get("kind"))) if isinstance(data, dict) else None
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
    attachments: tuple[str, ...] = ()


def step_row(
    step: Step,
    index: int,
    run_start: bool = False,
    call: LLMCall | None = None,
    shown: StepPresentation | None = None,
) -> StepRow:
    """The row for ``step`` at ``index``; ``call`` (the LLM call of its node run) adds tokens.
    The row names the step's attachments that can be served. ``shown``: the step's
    presentation, if already made."""
    tokens = f"{call.prompt_tokens}+{call.output_tokens} tok" if call is not None else ""
    shown = shown or presentation(step)
    return StepRow(
        index=index,
        category="unknown" if isinstance(step, UnknownStep) else step_category(step),
        author=step_author(step),
        kind=step.kind,
        summary=shorten(shown.summary, SUMMARY_WIDTH),
        prompt_id=step.metadata.prompt_id,
        run_start=run_start,
        tokens=tokens,
        attachments=tuple(
            name
            for name, a in shown.attachments.items()
            if ATTACHMENT_NAME.fullmatch(name) and attachment_bytes(a) is not None
        ),
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
