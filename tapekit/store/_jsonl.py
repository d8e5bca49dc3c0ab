"""A store's tapes and LLM calls as JSONL: export, and a transactional import.

The file starts with a header line (``{"format": "tapekit-store", "version": 1}``), then one
object per line: ``{"type": "tape", "info", "context", "steps"}`` or ``{"type": "llm_call",
"call"}``. An import reads and checks the whole file before it stores anything, and commits it
in one transaction: a file with a bad line stores nothing, and the error names the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tapekit.core import Step, Tape
from tapekit.llm.base import LLMCall

if TYPE_CHECKING:
    from tapekit.store._writes import TapeRows, Write
    from tapekit.store.base import TapeStore

__all__ = ["JSONL_FORMAT", "JSONL_VERSION", "export_jsonl", "import_jsonl", "read_jsonl_lines"]

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


def export_jsonl(store: TapeStore, path: str | Path, tape_ids: Iterable[str] | None, llm_calls: bool) -> int:
    """Write ``store``'s tapes (all, or ``tape_ids``) and the LLM calls behind them to ``path``
    (see :meth:`TapeStore.export_jsonl`); returns how many tapes were written."""
    from tapekit.store._writes import check_id
    from tapekit.store.base import TapeFilter, TapeNotFoundError

    store.flush()
    if tape_ids is None:
        ids = store._select_ids(TapeFilter(), None, 0)
        ids.reverse()  # oldest first: parents before their children
    else:
        if isinstance(tape_ids, str):
            raise TypeError("tape_ids must be a list of ids, not a string")
        ids = [check_id(t) for t in tape_ids]
    prompt_ids: dict[str, None] = {}
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"format": JSONL_FORMAT, "version": JSONL_VERSION}) + "\n")
        for tape_id in ids:
            infos = store._select_infos(TapeFilter(), None, 0, ids=[tape_id])
            if not infos:
                raise TapeNotFoundError(tape_id, store.location)
            info = infos[0]
            context = store._select_context(tape_id) or "null"
            steps = ",".join(store._select_steps(tape_id, 0, info.n_steps))
            out.write(
                f'{{"type":"tape","info":{info.model_dump_json()},"context":{context},"steps":[{steps}]}}\n'
            )
            if llm_calls and tape_ids is not None:
                prompt_ids.update(dict.fromkeys(store._select_prompt_ids(tape_id)))
        if llm_calls:
            calls = store._select_llm_calls(None if tape_ids is None else list(prompt_ids))
            for call in calls:
                out.write(f'{{"type":"llm_call","call":{call.model_dump_json()}}}\n')
    return len(ids)


def import_jsonl(store: TapeStore, path: str | Path) -> list[str]:
    """Store the tapes and LLM calls of ``path`` in ``store`` in one transaction (see
    :meth:`TapeStore.import_jsonl`); returns the ids of the tapes in the file."""
    from tapekit.store._writes import WriteGroup, call_write

    store._check_open()
    writes: list[Write] = []
    lengths: dict[str, int] = {}  # the stored length of each tape once this import is committed
    imported: list[str] = []
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
                write = _tape_write(store, item, lengths)
                writes.append(write)
                imported.append(write.tape_id)
            elif kind == "llm_call":
                writes.append(call_write(LLMCall.model_validate(item["call"])))
            else:
                raise ValueError(f"unknown line type {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, ValidationError) as e:
            message = "nested too deeply to read" if isinstance(e, RecursionError) else str(e)
            raise ValueError(f"{path}, line {number}: {message}") from e
    if writes:
        store._put(WriteGroup(writes))
    store.flush()
    store._known_lengths.update(lengths)
    return imported


def _check_header(item: dict[str, Any]) -> None:
    if item.get("format") != JSONL_FORMAT:
        raise ValueError(f"not a tapekit store export (first line {json.dumps(item)[:80]!r})")
    if item.get("version") != JSONL_VERSION:
        raise ValueError(f"export version {item.get('version')!r} is not supported")


def _tape_write(store: TapeStore, item: dict[str, Any], lengths: dict[str, int]) -> TapeRows:
    """The write that imports one tape line: its steps beyond those stored, its metadata."""
    from tapekit.store._writes import TapeWrite, check_id, check_tags, serialised
    from tapekit.store.base import TapeInfo

    info = TapeInfo.model_validate(item["info"])
    check_id(info.id)
    steps: list[Step] = list(Tape.model_validate({"steps": item["steps"]}).steps)
    if len(steps) != info.n_steps:
        raise ValueError(f"tape {info.id} says n_steps={info.n_steps} but has {len(steps)} steps")
    start = lengths.get(info.id, store._known_lengths.get(info.id))
    if start is None:  # as in save_tape: not written by this store, so committed is all there is
        start = store._stored_length(info.id) or 0
    if start > len(steps):
        raise ValueError(f"tape {info.id} has {start} stored steps; the file has only {len(steps)}")
    write = TapeWrite(
        info.id,
        info.to_metadata(),
        item.get("context"),
        steps[start:],
        start,
        len(steps),
        check_tags(info.tags),
        info.created,
        info.updated,
        exact_created=True,
    )
    lengths[info.id] = len(steps)
    return serialised(write)
