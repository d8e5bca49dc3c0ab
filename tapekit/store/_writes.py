"""What the store's writer thread commits: one record per queued write, built and checked on
the caller's thread (steps, context and result serialised, token ids packed, every text column
checked, see ``_text.py``), so that the writer only writes.

A queued record holds its rows as tuples of plain values, not the tape's steps nor the
``LLMCall``: the models are freed as soon as the caller drops them, so a backlog of queued writes
does not keep thousands of objects alive for the garbage collector to scan over and over (on
``bench/store.py`` that scanning took 10-17 % of the time).
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tapekit.core import Step, TapeMetadata
from tapekit.llm.base import LLMCall
from tapekit.sequence import StepSequence
from tapekit.store._prompts import Part, PromptEncoder, prompt_json
from tapekit.store._text import check_text, model_json
from tapekit.store._tokens import decode_tokens, encode_tokens_apart


@dataclass(slots=True)
class TapeWrite:
    """A tape's new steps ``steps`` (from index ``start``) and its metadata, to upsert (what a
    save or an import asks for; :func:`serialised` turns it into the :class:`TapeRows` queued)."""

    tape_id: str
    meta: TapeMetadata
    context: Any
    steps: list[Step]
    start: int
    n_steps: int
    tags: tuple[str, ...]
    created: float
    updated: float
    exact_created: bool = False  # imports keep their creation time even if the tape exists


@dataclass(slots=True)
class TapeRows:
    """A :class:`TapeWrite` as a backend commits it: ``tape`` is the tape's row, ``(id,
    parent_id, author, author_tape_id, n_added_steps, error, result, context, other, n_steps)``
    (``result`` and ``context`` as JSON, ``other`` as JSON or None when empty; ``created``,
    ``updated`` and ``digest`` follow it in the SQL table, see ``TAPE_COLUMNS`` in ``_sql.py``),
    ``steps`` the new steps' rows, ``(tape_id, idx, step_id, kind, agent, node, prompt_id,
    data)`` with ``data`` the step's JSON; ``digest`` the digest of all ``n_steps`` stored
    steps once these are (see :func:`steps_digest`; set by the store before it submits the
    write, None for a backend to leave what it has)."""

    tape_id: str
    tape: tuple[Any, ...]
    steps: list[tuple[Any, ...]]
    start: int
    n_steps: int
    tags: tuple[str, ...]
    created: float
    updated: float
    exact_created: bool
    digest: str | None = None


@dataclass(slots=True)
class CallWrite:
    """A completed LLM call as its ``llm_calls`` row, ``(prompt_id, model, prompt, output,
    prompt_tokens, output_tokens, cost, latency_s, timestamp, token_meta, token_data)`` (prompt
    in its reference form and ``parts`` the ``prompt_parts`` rows it needs that were not queued
    before, see ``_prompts.py``; output as JSON; token ids in their stored form, see
    ``_tokens.py``), to upsert by prompt id; :func:`call_from_row` reads it back."""

    prompt_id: str
    row: tuple[Any, ...]
    parts: list[Part]


@dataclass(slots=True)
class TagWrite:
    """Tags to add to (or remove from) a tape."""

    tape_id: str
    tags: tuple[str, ...]
    remove: bool


@dataclass(slots=True)
class EffectWrite:
    """A ``once`` tool call's journal row (see :mod:`tapekit.effects`), ``(key, tape_id, tool,
    arguments, state, result, error, created, updated)`` with ``arguments`` and ``result`` as
    JSON, to upsert by key (the first write's ``created`` is kept)."""

    key: str
    row: tuple[Any, ...]


Write = TapeRows | CallWrite | TagWrite | EffectWrite


def check_id(tape_id: object, what: str = "tape_id") -> str:
    """``tape_id`` if it is a non-empty string the store can hold, else a clear error."""
    if not isinstance(tape_id, str) or not tape_id:
        raise TypeError(f"{what} must be a non-empty string, not {tape_id!r}")
    check_text(tape_id, f"the {what.replace('_', ' ')} {tape_id!r}")
    return tape_id


def check_tags(tags: object) -> tuple[str, ...]:
    """``tags`` as a tuple of distinct non-empty strings, else a clear ``TypeError``."""
    if isinstance(tags, str):
        raise TypeError(f"tags must be a list of strings, not the string {tags!r} (write [{tags!r}])")
    try:
        out: tuple[object, ...] = tuple(tags)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"tags must be a list of strings, not {type(tags).__name__}") from None
    checked: list[str] = []
    for tag in out:
        if not isinstance(tag, str) or not tag:
            raise TypeError(f"every tag must be a non-empty string, not {tag!r}")
        checked.append(tag)
    return tuple(dict.fromkeys(checked))


@dataclass(slots=True)
class WriteGroup:
    """Writes committed together or not at all (an import)."""

    writes: list[Write]


def flat(items: list[Write | WriteGroup]) -> list[Write]:
    """The writes of ``items``, groups expanded."""
    return [w for item in items for w in (item.writes if isinstance(item, WriteGroup) else [item])]


def call_write(call: LLMCall, prompts: PromptEncoder) -> CallWrite:
    """The write of ``call``, serialised and checked here (a ``ValueError`` names what the
    database could not store); its prompt as ``prompts`` (the store's encoder) encodes it, which
    then counts its parts as queued: queue the write, or call ``prompts.forget()``."""
    what = f"the LLM call {call.prompt.id!r}"
    check_text(call.prompt.id, f"{what}: its prompt id")
    check_text(call.model, f"{what}: its model name")
    output = model_json(call.output, f"{what}: its output")
    token_meta = token_data = None
    try:
        # the prompt ids become prompt parts (shared with the conversation's other calls)
        finish = None if call.tokens is None else encode_tokens_apart(call.tokens)
        prompt_ids = None if call.tokens is None else call.tokens.prompt_ids
        # last: nothing fails after it (it counts its parts as queued)
        prompt, parts, ids_node = prompts.encode(call.prompt, f"{what}: its prompt", prompt_ids)
    except ValueError as e:
        if "its token ids" not in str(e):
            raise
        raise ValueError(f"{what} cannot be stored: {e}") from None
    if finish is not None:
        token_meta, token_data = finish(ids_node)
    row = (
        call.prompt.id,
        call.model,
        prompt,
        output,
        call.prompt_tokens,
        call.output_tokens,
        call.cost,
        call.latency_s,
        call.timestamp,
        token_meta,
        token_data,
    )
    return CallWrite(call.prompt.id, row, parts)


def call_from_row(row: Sequence[Any], parts: Mapping[str, tuple[str | None, str]]) -> LLMCall:
    """The :class:`LLMCall` stored as ``row`` (the row of a :class:`CallWrite`); ``parts``
    (``{hash: (prev, body)}``) holds the prompt parts it refers to (none for a row of the old
    form, which holds the whole prompt)."""
    _, model, prompt, output, pt, ot, cost, latency, ts, token_meta, token_data = row
    call = LLMCall.model_validate(
        {
            "prompt": json.loads(prompt_json(prompt, parts)),
            "output": json.loads(output),
            "model": model,
            "prompt_tokens": pt,
            "output_tokens": ot,
            "cost": cost,
            "latency_s": latency,
            "timestamp": ts,
        }
    )
    call.tokens = decode_tokens(token_meta, token_data, parts)
    return call


def describe(w: Write | WriteGroup) -> str:
    """A queued write, for error messages."""
    if isinstance(w, TapeRows):
        return f"tape {w.tape_id!r} (steps {w.start} to {w.n_steps - 1} and metadata)"
    if isinstance(w, CallWrite):
        return f"LLM call {w.prompt_id!r}"
    if isinstance(w, WriteGroup):
        return f"an import of {len(w.writes)} rows (none of them stored)"
    if isinstance(w, EffectWrite):
        return f"the journal record of tool call {w.key!r}"
    return f"tags of tape {w.tape_id!r}"


def serialised(w: TapeWrite) -> TapeRows:
    """The rows of ``w``: its steps, context and result serialised, every text column checked. A
    value the database cannot store is refused here, on the caller's thread, naming the tape,
    step and field."""
    tape_id = w.tape_id
    where = f"tape {tape_id!r}"
    check_id(tape_id)
    meta = w.meta
    for name in ("parent_id", "author", "author_tape_id", "error"):
        check_text(getattr(meta, name), f"{where}: its metadata.{name}")
    for tag in w.tags:
        check_text(tag, f"{where}: its tag {tag!r}")
    rows = []
    for i, step in enumerate(w.steps, w.start):
        m = step.metadata
        for name in ("id", "agent", "node", "prompt_id"):
            check_text(getattr(m, name), f"{where}: step {i} ({step.kind}): its metadata.{name}")
        data = model_json(step, f"{where}: step {i} ({step.kind}, id {m.id})")
        rows.append((tape_id, i, m.id, step.kind, m.agent, m.node, m.prompt_id, data))
    try:
        # most tapes have neither: skip the JSON encoder for them
        context = "null" if w.context is None else context_json(w.context)
        result = "null" if meta.result is None else json.dumps(meta.result, default=str)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: its context or result cannot be stored as JSON: {e}") from e
    try:
        other = json.dumps(meta.other) if meta.other else None  # NULL: most tapes have none
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: its metadata.other cannot be stored as JSON: {e}") from e
    tape = (
        tape_id,
        meta.parent_id,
        meta.author,
        meta.author_tape_id,
        meta.n_added_steps,
        meta.error,
        result,
        context,
        other,
        w.n_steps,
    )
    return TapeRows(tape_id, tape, rows, w.start, w.n_steps, w.tags, w.created, w.updated, w.exact_created)


def context_json(context: Any) -> str:
    """How a tape's context is stored: JSON of its ``model_dump(mode="json")`` or of itself."""
    return json.dumps(context.model_dump(mode="json") if hasattr(context, "model_dump") else context)


# the name of the digest fold on a tape's shared step buffer (see steps_digest)
_DIGEST_FOLD = ("tapekit.store", "steps digest")


def chain_digest(digest: str, datas: Iterable[str]) -> str:
    """``digest`` (of the steps before) chained on over the steps stored as ``datas`` (their
    JSON): each step's digest is the SHA-256 (hex) of the one before, a newline and its JSON;
    no steps have the digest ``""``."""
    for data in datas:
        digest = hashlib.sha256(f"{digest}\n{data}".encode()).hexdigest()
    return digest


class KnownSteps:
    """The step objects of one tape as a store hashed them (weak references: the store keeps no
    step alive) and the digest after each (see :func:`steps_digest`): a tape given as another
    step buffer (rebuilt from a list, say) that holds the same objects skips serialising them."""

    __slots__ = ("digests", "steps")

    def __init__(self) -> None:
        self.steps: list[weakref.ref[Step]] = []
        self.digests: list[str] = []


def steps_digest(
    steps: Sequence[Step],
    n: int,
    where: str,
    datas: Sequence[str] = (),
    start: int = 0,
    known: KnownSteps | None = None,
    at_start: list[str] | None = None,
) -> str:
    """The digest of ``steps[:n]`` (:func:`chain_digest` over their JSON as a save stores it):
    what the store keeps with a tape, to check that a later save under its id begins with the
    stored steps without reading them.

    It is a fold memoised on the tape's shared step buffer (:meth:`StepSequence.fold`), so a
    tape that grows by appending (a running session) hashes each step once, whichever of its
    versions is saved; ``datas[i - start]`` is step ``i``'s JSON where the caller has it already
    (the new steps of a save). ``known`` (the steps hashed before, extended here) spares the
    serialisation of the steps a tape given as another buffer shares with them, object for
    object. ``at_start`` gets the digest of ``steps[:start]`` when the fold passes it on its
    way (it does not when it resumes past ``start``). ``where`` names the tape in the error for
    a step that cannot be serialised. A step changed in place after it was hashed keeps its old
    digest (steps are values: change a copy)."""
    sequence = steps if isinstance(steps, StepSequence) else StepSequence(steps)

    def step_fn(digest: str, step: Step, i: int) -> str:
        if i == start and at_start is not None:
            at_start.append(digest)
        if (
            known is not None
            and i < len(known.steps)
            and known.steps[i]() is step
            and digest == (known.digests[i - 1] if i else "")
        ):
            return known.digests[i]
        j = i - start
        data = datas[j] if 0 <= j < len(datas) else model_json(step, f"{where}: step {i} ({step.kind})")
        out = hashlib.sha256(f"{digest}\n{data}".encode()).hexdigest()
        if known is not None and i == len(known.steps):
            known.steps.append(weakref.ref(step))
            known.digests.append(out)
        return out

    return (sequence if n == len(sequence) else sequence[:n]).fold(_DIGEST_FOLD, str, step_fn)


def seed_digest(steps: StepSequence[Step], digest: str) -> None:
    """Record ``digest`` as the digest of all of ``steps`` (see :func:`steps_digest`): what a
    store knows of a tape it read, whose steps are those it stored under that digest. A save of
    the tape (or of one that grows from it) then hashes only the steps added since."""
    steps.seed_fold(_DIGEST_FOLD, digest)
