"""Readers for the files the reference TapeAgents package writes, and the import into a store.

- JSON tape files (``save_json_tape``): one tape per file;
- YAML tape streams (``stream_yaml_tapes``): one tape per ``---`` document (needs PyYAML);
- its SQLite database: the ``LLMCalls`` table (one row per logged LLM call) and the ``Tapes``
  table (tapes given to its tape observer);
- a JSON list of its training texts (parsed and checked; a tape store keeps no training texts).

Tapes keep their ids, metadata (``parent_id``, ``author``, ``author_tape_id``, ``error``,
``result``, and the fields of a ``TapeMetadata`` subclass under ``metadata.other["tapeagents"]``)
and context; steps keep their ids and prompt ids, and the LLM calls are stored under the same
prompt ids, so every imported step links to the prompt behind it.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python

from tapekit.core import LLMOutput, Prompt, Tape, TapeMetadata, ToolCallRequest
from tapekit.llm.base import LLMCall, TrainingText
from tapekit.migrate.steps import EXTRA, ReferenceFormatError, from_reference_steps, to_reference_steps
from tapekit.store.base import TapeNotFoundError, TapeStore

SQLITE_MAGIC = b"SQLite format 3\x00"
_TAPE_META = ("id", "parent_id", "author", "author_tape_id", "n_added_steps", "error", "result")
IMPORT_TAG = "tapeagents"


@dataclass
class ImportReport:
    """What :func:`import_reference` read and stored.

    ``tapes``: the ids of the tapes read, in the order first seen (a tape found in several
    files, e.g. a JSON file and the YAML stream, counts once), all of them in the store after
    the import; ``unchanged``: those of them that were already stored with the same content
    (nothing was written for them but the tags); ``step_kinds``: the reference kinds of the
    tapes' top-level steps, counted once per tape; ``llm_calls``: prompt ids of the stored LLM
    calls; ``training_texts``: training texts parsed (not stored); ``files``: the files read,
    with what each held.
    """

    tapes: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    step_kinds: Counter[str] = field(default_factory=Counter)
    llm_calls: list[str] = field(default_factory=list)
    training_texts: list[TrainingText] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line per file, then the totals: what the command line prints."""
        lines = [f"{path}: {what}" for path, what in self.files.items()]
        n_steps = sum(self.step_kinds.values())
        lines.append(
            f"{len(self.tapes)} tapes ({n_steps} steps, {len(self.step_kinds)} kinds), "
            f"{len(self.llm_calls)} LLM calls, {len(self.training_texts)} training texts"
        )
        if self.unchanged:
            lines.append(
                f"{len(self.unchanged)} of the {len(self.tapes)} tapes were already stored with the "
                "same content (not written again)"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- tapes


def reference_tape(data: Any, where: str = "tape") -> Tape[Any, Any]:
    """A tapekit tape for one reference tape (the dict its JSON or YAML holds).

    The context is kept as plain data (a nested tape stays a dict); ``where`` names the tape
    in errors. Metadata keys beyond the reference's own seven (the fields of a ``TapeMetadata``
    subclass, such as the GAIA agent's ``task`` and ``level``) are kept, in their order, in
    ``metadata.other["tapeagents"]``.
    """
    if not isinstance(data, dict) or "steps" not in data:
        raise ReferenceFormatError(f"{where}: not a TapeAgents tape (an object with 'metadata' and 'steps')")
    meta = data.get("metadata") or {}
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str) or not meta["id"]:
        raise ReferenceFormatError(f"{where}: the tape's metadata has no string 'id'")
    where = f"{where} (tape {meta['id']})"
    steps = from_reference_steps(data["steps"], where)
    extra = {k: v for k, v in meta.items() if k not in _TAPE_META}
    try:
        metadata = TapeMetadata(
            **{k: meta[k] for k in _TAPE_META if k in meta}, other={EXTRA: extra} if extra else {}
        )
    except ValueError as e:
        raise ReferenceFormatError(f"{where}: bad tape metadata: {e}") from e
    return Tape(metadata=metadata, context=data.get("context"), steps=steps)


def to_reference_tape(tape: Tape[Any, Any]) -> dict[str, Any]:
    """The reference's JSON data for a tape made by :func:`reference_tape` (the inverse): the
    seven keys of the reference's ``TapeMetadata``, then the subclass fields kept in
    ``metadata.other["tapeagents"]`` (other keys of ``metadata.other`` have no place there)."""
    meta = tape.metadata.model_dump(mode="json")
    extra = meta["other"].get(EXTRA)
    context: Any = tape.context
    return {
        "metadata": {**{k: meta[k] for k in _TAPE_META}, **(extra if isinstance(extra, dict) else {})},
        "context": context.model_dump(mode="json") if hasattr(context, "model_dump") else context,
        "steps": to_reference_steps(tape.steps),
    }


# --------------------------------------------------------------------------- comparing tapes

_ABSENT = object()  # a key one side lacks


@dataclass(frozen=True)
class _Length:
    """The length of a list, where two lists differ only in length."""

    n: int


def _first_difference(
    a: Any, b: Any, path: tuple[str | int, ...] = ()
) -> tuple[tuple[str | int, ...], Any, Any] | None:
    """Where two JSON values first differ: ``(path, value in a, value in b)``, or None if equal.

    Keys missing on one side are ``_ABSENT``; lists of different lengths whose common part is
    equal differ at their own path, with the two lengths (:class:`_Length`) as values.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            found = _first_difference(a.get(key, _ABSENT), b.get(key, _ABSENT), (*path, key))
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = _first_difference(x, y, (*path, i))
            if found is not None:
                return found
        return None if len(a) == len(b) else (path, _Length(len(a)), _Length(len(b)))
    return None if a == b else (path, a, b)


def _show(value: Any) -> str:
    """A value in a difference message: its JSON, cut to 80 characters."""
    if value is _ABSENT:
        return "absent"
    if isinstance(value, _Length):
        return f"{value.n} items"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _path_text(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the tape"


def _describe_difference(a: dict[str, Any], b: dict[str, Any], a_name: str, b_name: str) -> str | None:
    """What first differs between two reference tapes (as :func:`to_reference_tape` gives them),
    in words: which step (index, id and kind) or metadata field, and its value on each side
    (``a_name`` and ``b_name`` name the sides); None if they are equal."""
    found = _first_difference(a, b)
    if found is None:
        return None
    path, x, y = found
    where = _path_text(path)
    if len(path) >= 2 and path[0] == "steps" and isinstance(path[1], int):
        index = path[1]
        steps = b["steps"] if index < len(b["steps"]) else a["steps"]
        step = steps[index] if isinstance(steps[index], dict) else {}
        step_id = (step.get("metadata") or {}).get("id")
        rest = _path_text(path[2:]) if len(path) > 2 else "the whole step"
        where = f"step {index} (id {step_id!r}, kind {step.get('kind')!r}): {rest}"
    elif path == ("steps",):
        where, x, y = "the number of steps", getattr(x, "n", x), getattr(y, "n", y)
    return f"{where} is {_show(x)} in {a_name} but {_show(y)} in {b_name}"


def _yaml_documents(path: Path) -> Iterator[Any]:
    try:
        import yaml
    except ImportError:
        raise ReferenceFormatError(
            f"{path}: reading YAML tapes needs PyYAML (pip install 'tapekit[migrate]')"
        ) from None
    try:
        with path.open(encoding="utf-8") as f:
            yield from yaml.safe_load_all(f)
    except yaml.YAMLError as e:
        raise ReferenceFormatError(f"{path}: not valid YAML: {e}") from e


# --------------------------------------------------------------------------- SQLite


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    return conn


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _timestamp(text: Any) -> float:
    try:
        return datetime.datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return 0.0


def _llm_call(row: sqlite3.Row, where: str) -> LLMCall:
    """One ``LLMCalls`` row as a tapekit LLM call under the same prompt id."""
    try:
        prompt = json.loads(row["prompt"])
        output = json.loads(row["output"])
        info = json.loads(row["llm_info"] or "{}")
    except (TypeError, json.JSONDecodeError) as e:
        raise ReferenceFormatError(f"{where}: a JSON column does not parse: {e}") from e
    if not isinstance(prompt, dict) or not isinstance(output, dict):
        raise ReferenceFormatError(f"{where}: prompt and output must be JSON objects")
    calls = []
    for call in output.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments", "{}")
        calls.append(
            ToolCallRequest(
                id=str(call.get("id") or ""),
                name=str(function.get("name", "")),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    response_format = prompt.get("response_format")
    return LLMCall(
        prompt=Prompt(
            id=row["prompt_id"],
            messages=prompt.get("messages") or [],
            tools=prompt.get("tools"),
            response_schema=response_format if isinstance(response_format, dict) else None,
        ),
        output=LLMOutput(
            role=output.get("role") or "assistant", content=output.get("content"), tool_calls=calls or None
        ),
        model=str(info.get("model_name", "")) if isinstance(info, dict) else "",
        prompt_tokens=max(int(row["prompt_length_tokens"] or 0), 0),  # -1: not counted (reuse)
        output_tokens=max(int(row["output_length_tokens"] or 0), 0),
        cost=float(row["cost"] or 0.0),
        timestamp=_timestamp(row["timestamp"]),
    )


def read_llm_calls(path: str | Path) -> list[LLMCall]:
    """The LLM calls in the ``LLMCalls`` table of a reference SQLite database, oldest first."""
    path = Path(path)
    with _connect(path) as conn:
        if "LLMCalls" not in _tables(conn):
            return []
        rows = conn.execute("SELECT * FROM LLMCalls ORDER BY timestamp, rowid").fetchall()
    return [_llm_call(row, f"{path}, LLMCalls row {row['prompt_id']}") for row in rows]


def _sqlite_tapes(path: Path) -> list[Tape[Any, Any]]:
    with _connect(path) as conn:
        if "Tapes" not in _tables(conn):
            return []
        rows = conn.execute("SELECT * FROM Tapes ORDER BY timestamp, rowid").fetchall()
    tapes = []
    for row in rows:
        where = f"{path}, Tapes row {row['tape_id']}"
        try:
            data = {
                "metadata": json.loads(row["metadata"]),
                "context": json.loads(row["context"]) if row["context"] is not None else None,
                "steps": json.loads(row["steps"]),
            }
        except (TypeError, json.JSONDecodeError) as e:
            raise ReferenceFormatError(f"{where}: a JSON column does not parse: {e}") from e
        tape = reference_tape(data, where)
        if tape.metadata.id != row["tape_id"] or len(tape.steps) < int(row["length"] or 0):
            raise ReferenceFormatError(f"{where}: tape_id or length does not match the row's tape")
        tapes.append(tape)
    return tapes


# --------------------------------------------------------------------------- training texts


def read_training_texts(path: str | Path) -> list[TrainingText]:
    """The reference's training texts dumped as a JSON list of objects (``text``,
    ``n_predicted`` characters of output at its end, ...), checked and as tapekit
    :class:`~tapekit.llm.base.TrainingText` (prompt ids are not in the file, so left empty)."""
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    return _training_texts(data, str(path))


def _training_texts(data: Any, where: str) -> list[TrainingText]:
    if not isinstance(data, list):
        raise ReferenceFormatError(f"{where}: training texts must be a JSON list")
    out = []
    for i, item in enumerate(data):
        text, n = (item.get("text"), item.get("n_predicted")) if isinstance(item, dict) else (None, None)
        if not isinstance(text, str) or not isinstance(n, int) or not 0 < n <= len(text):
            raise ReferenceFormatError(
                f"{where}, item {i}: a training text needs 'text' and 0 < 'n_predicted' <= len(text)"
            )
        out.append(TrainingText(text=text, n_predicted=n))
    return out


# --------------------------------------------------------------------------- dispatch and import


@dataclass
class _FileContents:
    tapes: list[Tape[Any, Any]] = field(default_factory=list)
    llm_calls: list[LLMCall] = field(default_factory=list)
    training_texts: list[TrainingText] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        for n, what in (
            (len(self.tapes), "tapes"),
            (len(self.llm_calls), "LLM calls"),
            (len(self.training_texts), "training texts"),
        ):
            if n:
                parts.append(f"{n} {what}")
        return ", ".join(parts) or "nothing to import"


def read_reference_file(path: str | Path) -> _FileContents:
    """Everything one reference file holds, by its format (SQLite by its header, ``.yaml``/``.yml``
    as a YAML stream, anything else as JSON: a tape, or a list of training texts)."""
    path = Path(path)
    if not path.is_file():
        raise ReferenceFormatError(f"{path}: no such file")
    with path.open("rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head == SQLITE_MAGIC:
        return _FileContents(tapes=_sqlite_tapes(path), llm_calls=read_llm_calls(path))
    if path.suffix.lower() in (".yaml", ".yml"):
        # a date or time the reference dumped as a YAML timestamp reads back as the string that
        # its JSON writer makes of it, so the YAML and JSON copies of a tape agree
        docs = [to_jsonable_python(d) for d in _yaml_documents(path) if d is not None]
        return _FileContents(tapes=[reference_tape(d, f"{path}, document {i}") for i, d in enumerate(docs)])
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReferenceFormatError(f"{path}: not JSON, YAML or SQLite ({e})") from e
    if isinstance(data, list):
        return _FileContents(training_texts=_training_texts(data, str(path)))
    return _FileContents(tapes=[reference_tape(data, str(path))])


def _files(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            out.extend(
                f
                for f in sorted(path.rglob("*"))
                if f.is_file() and f.suffix.lower() in (".json", ".yaml", ".yml", ".sqlite", ".db")
            )
        else:
            out.append(path)
    return out


def import_reference(
    paths: Iterable[str | Path], store: TapeStore, *, tags: Iterable[str] = (IMPORT_TAG,)
) -> ImportReport:
    """Read reference TapeAgents files (directories are searched for ``.json``, ``.yaml``,
    ``.yml``, ``.sqlite`` and ``.db`` files) and store their tapes (tagged ``tags``) and LLM
    calls in ``store``.

    Every file is read and checked before anything is stored. A tape that appears in several
    files (the same tape as JSON, in the YAML stream and in the SQLite ``Tapes`` table) is
    stored once. A tape already stored under its id with the same content is not written again
    (it only gets ``tags``; see ``ImportReport.unchanged``), so importing again changes nothing.
    If two copies of a tape differ, or a tape differs from the one stored under its id, a
    :class:`ReferenceFormatError` names the tape, the files and the first difference (the step,
    its id and kind, and the field), and nothing is stored: the store never keeps an old tape
    while the import reports the new one.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    tags = tuple(tags)
    report = ImportReport()
    read: dict[str, tuple[Tape[Any, Any], dict[str, Any], str]] = {}  # id: tape, its data, its file
    calls: list[LLMCall] = []
    for path in _files(paths):
        contents = read_reference_file(path)
        report.files[str(path)] = contents.describe()
        for tape in contents.tapes:
            tape_id, data = tape.metadata.id, to_reference_tape(tape)
            if tape_id in read:
                source = read[tape_id][2]
                diff = _describe_difference(read[tape_id][1], data, source, str(path))
                if diff is not None:
                    raise ReferenceFormatError(
                        f"tape {tape_id} differs between {source} and {path}: {diff} (nothing was imported)"
                    )
                continue
            read[tape_id] = (tape, data, str(path))
        calls.extend(contents.llm_calls)
        report.training_texts.extend(contents.training_texts)
    new: list[Tape[Any, Any]] = []
    conflicts: list[str] = []
    for tape_id, (tape, data, source) in read.items():
        stored, problem = _compare_stored(store, tape_id, data, source)
        if problem is not None:
            conflicts.append(problem)
        elif stored:
            report.unchanged.append(tape_id)
        else:
            new.append(tape)
        report.tapes.append(tape_id)
        report.step_kinds.update(s["kind"] for s in data["steps"])
    if conflicts:
        more = [f"... and {len(conflicts) - 10} more"] if len(conflicts) > 10 else []
        raise ReferenceFormatError(
            f"already stored in {store.location} with other content: {len(conflicts)} "
            f"{'tape' if len(conflicts) == 1 else 'tapes'}; nothing was imported (import changed "
            "tapes into another store, or give them new tape ids)\n"
            + "\n".join(["  " + c for c in conflicts[:10]] + more)
        )
    for tape in new:
        store.save_tape(tape, tags=tags)
    for tape_id in report.unchanged:
        if tags:
            store.add_tags(tape_id, tags)
    for call in calls:
        store.save_llm_call(call)
        report.llm_calls.append(call.prompt.id)
    store.flush()
    return report


def _compare_stored(
    store: TapeStore, tape_id: str, data: dict[str, Any], source: str
) -> tuple[bool, str | None]:
    """Whether a tape is stored under ``tape_id``, and if so how it differs from ``data`` (read
    from ``source``), in words (None: it does not differ)."""
    try:
        stored = store.get_tape(tape_id)
    except TapeNotFoundError:
        return False, None
    except ValueError as e:  # a stored tape with steps that no loaded class reads
        return True, f"tape {tape_id} from {source}: the tape stored under this id cannot be read: {e}"
    diff = _describe_difference(to_reference_tape(stored), data, "the store", source)
    return True, None if diff is None else f"tape {tape_id} from {source}: {diff}"
