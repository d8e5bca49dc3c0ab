"""Readers for the files the reference TapeAgents package writes, and the import into a store.

- JSON tape files (``save_json_tape``): one tape per file;
- YAML tape streams (``stream_yaml_tapes``): one tape per ``---`` document (needs PyYAML);
- its SQLite database: the ``LLMCalls`` table (one row per logged LLM call) and the ``Tapes``
  table (tapes given to its tape observer);
- a JSON list of its training texts (parsed and checked; a tape store keeps no training texts).

Tapes keep their ids, metadata (``parent_id``, ``author``, ``author_tape_id``, ``error``,
``result``) and context; steps keep their ids and prompt ids, and the LLM calls are stored under
the same prompt ids, so every imported step links to the prompt behind it.
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

from tapekit.core import LLMOutput, Prompt, Tape, TapeMetadata, ToolCallRequest
from tapekit.llm.base import LLMCall, TrainingText
from tapekit.migrate.steps import ReferenceFormatError, from_reference_steps, to_reference_steps
from tapekit.store.base import TapeStore

__all__ = [
    "ImportReport",
    "import_reference",
    "read_llm_calls",
    "read_reference_file",
    "read_training_texts",
    "reference_tape",
    "to_reference_tape",
]

SQLITE_MAGIC = b"SQLite format 3\x00"
_TAPE_META = ("id", "parent_id", "author", "author_tape_id", "n_added_steps", "error", "result")
IMPORT_TAG = "tapeagents"


@dataclass
class ImportReport:
    """What :func:`import_reference` read and stored.

    ``tapes``: the stored tape ids, in the order first seen (a tape found in several files,
    e.g. a JSON file and the YAML stream, is stored once); ``step_kinds``: the reference kinds
    of those tapes' top-level steps, counted once per tape; ``llm_calls``: prompt ids of the
    stored LLM calls; ``training_texts``: training texts parsed (not stored); ``files``: the
    files read, with what each held.
    """

    tapes: list[str] = field(default_factory=list)
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
        return "\n".join(lines)


# --------------------------------------------------------------------------- tapes


def reference_tape(data: Any, where: str = "tape") -> Tape[Any, Any]:
    """A tapekit tape for one reference tape (the dict its JSON or YAML holds).

    The context is kept as plain data (a nested tape stays a dict); ``where`` names the tape
    in errors.
    """
    if not isinstance(data, dict) or "steps" not in data:
        raise ReferenceFormatError(f"{where}: not a TapeAgents tape (an object with 'metadata' and 'steps')")
    meta = data.get("metadata") or {}
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str) or not meta["id"]:
        raise ReferenceFormatError(f"{where}: the tape's metadata has no string 'id'")
    unknown = sorted(set(meta) - set(_TAPE_META))
    if unknown:
        raise ReferenceFormatError(f"{where}: unexpected tape metadata keys {unknown}")
    where = f"{where} (tape {meta['id']})"
    steps = from_reference_steps(data["steps"], where)
    try:
        metadata = TapeMetadata(**{k: meta[k] for k in _TAPE_META if k in meta})
    except ValueError as e:
        raise ReferenceFormatError(f"{where}: bad tape metadata: {e}") from e
    return Tape(metadata=metadata, context=data.get("context"), steps=steps)


def to_reference_tape(tape: Tape[Any, Any]) -> dict[str, Any]:
    """The reference's JSON data for a tape made by :func:`reference_tape` (the inverse)."""
    meta = tape.metadata.model_dump(mode="json")
    context: Any = tape.context
    return {
        "metadata": {k: meta[k] for k in _TAPE_META},
        "context": context.model_dump(mode="json") if hasattr(context, "model_dump") else context,
        "steps": to_reference_steps(tape.steps),
    }


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
        docs = [d for d in _yaml_documents(path) if d is not None]
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


def _same(a: Tape[Any, Any], b: Tape[Any, Any]) -> bool:
    return to_reference_tape(a) == to_reference_tape(b)


def import_reference(
    paths: Iterable[str | Path], store: TapeStore, *, tags: Iterable[str] = (IMPORT_TAG,)
) -> ImportReport:
    """Read reference TapeAgents files (directories are searched for ``.json``, ``.yaml``,
    ``.yml``, ``.sqlite`` and ``.db`` files) and store their tapes (tagged ``tags``) and LLM
    calls in ``store``.

    A tape that appears in several files (the same tape as JSON, in the YAML stream and in the
    SQLite ``Tapes`` table) is stored once; if two copies differ, or differ from a tape already
    stored under that id, a :class:`ReferenceFormatError` names both. Importing again changes
    nothing.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    tags = tuple(tags)
    report = ImportReport()
    seen: dict[str, tuple[Tape[Any, Any], str]] = {}
    for path in _files(paths):
        contents = read_reference_file(path)
        report.files[str(path)] = contents.describe()
        for tape in contents.tapes:
            tape_id = tape.metadata.id
            if tape_id in seen:
                first, source = seen[tape_id]
                if not _same(first, tape):
                    raise ReferenceFormatError(f"tape {tape_id} differs between {source} and {path}")
                continue
            _check_stored(store, tape)
            seen[tape_id] = (tape, str(path))
            store.save_tape(tape, tags=tags)
            report.tapes.append(tape_id)
            report.step_kinds.update(s["kind"] for s in to_reference_steps(tape.steps))
        for call in contents.llm_calls:
            store.save_llm_call(call)
            report.llm_calls.append(call.prompt.id)
        report.training_texts.extend(contents.training_texts)
    store.flush()
    return report


def _check_stored(store: TapeStore, tape: Tape[Any, Any]) -> None:
    """A tape already stored under this id must have the same steps (re-import is a no-op)."""
    from tapekit.store.base import TapeNotFoundError

    try:
        stored = store.get_tape(tape.metadata.id)
    except TapeNotFoundError:
        return
    if [s.metadata.id for s in stored.steps] != [s.metadata.id for s in tape.steps]:
        raise ReferenceFormatError(
            f"tape {tape.metadata.id} is already stored in {store.location} with other steps"
        )
