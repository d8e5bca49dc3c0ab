"""The JSONL form of a store's tapes and LLM calls: writing an export, reading an import.

The file starts with a header line (``{"format": "tapekit-store", "version": 1}``), then one
object per line: ``{"type": "tape", "info", "context", "steps"}`` or ``{"type": "llm_call",
"call"}``. An import reads and checks the whole file before it stores anything, so that
:meth:`TapeStore.import_jsonl <tapekit.store.TapeStore.import_jsonl>` can commit it in one
transaction: a file with a bad line stores nothing, and the error names the file and line.

Nothing here touches a store: :meth:`~tapekit.store.TapeStore.export_jsonl` hands
:func:`write_jsonl` what it read, and :func:`read_import` turns a file into the writes the
store commits, asking the store only which steps of a tape it holds already.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from tapekit.core import Step, Tape
from tapekit.llm.base import LLMCall
from tapekit.store._prompts import PromptEncoder
from tapekit.store._types import TapeInfo
from tapekit.store._writes import (
    TapeRows,
    TapeWrite,
    Write,
    call_write,
    chain_digest,
    check_id,
    check_tags,
    serialised,
    steps_digest,
)

JSONL_FORMAT = "tapekit-store"
JSONL_VERSION = 1


def read_jsonl_lines(path: str | Path) -> Iterator[tuple[int, str, Any]]:
    """``(line number, text, parsed JSON)`` for each non-blank line of ``path``; a line that is not
    UTF-8 or not JSON (nested too deeply, an integer too long, ...) is a ``ValueError`` naming the
    file and line."""
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad = f"byte {raw[e.start]:#04x} at column {e.start + 1}"
                raise ValueError(f"{path}, line {number}: not valid UTF-8 ({bad})") from None
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except RecursionError:
                raise ValueError(f"{path}, line {number}: the JSON is nested too deeply to read") from None
            except ValueError as e:  # JSONDecodeError, and int() of a number with too many digits
                raise ValueError(f"{path}, line {number}: not valid JSON: {e}") from None
            yield number, line, item


class ExportedTape(NamedTuple):
    """One tape as an export writes it: its info, and its context and steps as stored JSON."""

    info: TapeInfo
    context: str | None
    steps: list[str]


def write_jsonl(path: str | Path, tapes: Iterable[ExportedTape], calls: Iterable[LLMCall]) -> int:
    """Write the header, then ``tapes``, then ``calls`` to ``path`` (``calls`` is iterated
    after the last tape); returns how many tapes were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"format": JSONL_FORMAT, "version": JSONL_VERSION}) + "\n")
        for info, context, steps in tapes:
            out.write(
                f'{{"type":"tape","info":{info.model_dump_json()},"context":{context or "null"},'
                f'"steps":[{",".join(steps)}]}}\n'
            )
            n += 1
        for call in calls:
            out.write(f'{{"type":"llm_call","call":{call.model_dump_json()}}}\n')
    return n


#: ``(steps, their stored digest, the digest of the steps given)``, as ``TapeStore._saved`` keeps
Saved = tuple[int, str, str]


@dataclass
class Import:
    """What a file imports: the writes to commit together, what is saved of each tape once they
    are committed (see :data:`Saved`), and the ids of the file's tapes in file order."""

    writes: list[Write] = field(default_factory=list)
    saved: dict[str, Saved] = field(default_factory=dict)
    tape_ids: list[str] = field(default_factory=list)


def read_import(
    path: str | Path, stored: Callable[[str, Sequence[Step]], Saved], prompts: PromptEncoder
) -> Import:
    """Read and check every line of the export ``path``: the writes that store it in a store
    where ``stored(tape_id, steps)`` says how many steps of each tape are stored already and
    their digests, having checked that ``steps`` begins with them (only the steps beyond those
    are written), the LLM calls' prompts encoded by ``prompts`` (a fresh encoder: the import is
    committed as a whole or not at all). A bad line, or a tape whose steps differ from the
    stored ones, is a ``ValueError`` naming the file and line."""
    found = Import()
    header_seen = False
    for number, _, item in read_jsonl_lines(path):
        try:
            if not isinstance(item, dict):
                raise ValueError(f"expected a JSON object, not {type(item).__name__}")
            if not header_seen:
                _check_header(item)
                header_seen = True
                continue
            kind = item.get("type")
            if kind == "tape":
                write = _tape_write(item, found.saved, stored)
                found.writes.append(write)
                found.tape_ids.append(write.tape_id)
            elif kind == "llm_call":
                found.writes.append(call_write(LLMCall.model_validate(item["call"]), prompts))
            else:
                raise ValueError(f"unknown line type {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, ValidationError) as e:
            message = "nested too deeply to read" if isinstance(e, RecursionError) else str(e)
            raise ValueError(f"{path}, line {number}: {message}") from e
    return found


def _check_header(item: dict[str, Any]) -> None:
    if item.get("format") != JSONL_FORMAT:
        raise ValueError(f"not a tapekit store export (first line {json.dumps(item)[:80]!r})")
    if item.get("version") != JSONL_VERSION:
        raise ValueError(f"export version {item.get('version')!r} is not supported")


def _tape_write(
    item: dict[str, Any], saved: dict[str, Saved], stored: Callable[[str, Sequence[Step]], Saved]
) -> TapeRows:
    """The write that imports one tape line: its steps beyond those stored (or earlier in the
    file), its metadata."""
    info = TapeInfo.model_validate(item["info"])
    check_id(info.id)
    steps: Sequence[Step] = Tape.model_validate({"steps": item["steps"]}).steps
    if len(steps) != info.n_steps:
        raise ValueError(f"tape {info.id} says n_steps={info.n_steps} but has {len(steps)} steps")
    earlier = saved.get(info.id)
    if earlier is None:
        start, digest, _ = stored(info.id, steps)
    else:  # the tape came earlier in the file
        start, digest, given = earlier
        if start > len(steps):
            raise ValueError(
                f"tape {info.id} has {start} steps earlier in the file; this line only {len(steps)}"
            )
        if start and steps_digest(steps, start, f"tape {info.id!r}") not in (digest, given):
            raise ValueError(
                f"tape {info.id}: its first {start} steps differ from the ones earlier in the file"
            )
    write = TapeWrite(
        info.id,
        info.to_metadata(),
        item.get("context"),
        [steps[i] for i in range(start, len(steps))],
        start,
        len(steps),
        check_tags(info.tags),
        info.created,
        info.updated,
        exact_created=True,
    )
    rows = serialised(write)
    rows.digest = chain_digest(digest, (row[7] for row in rows.steps))
    saved[info.id] = (len(steps), rows.digest, rows.digest)
    return rows
