"""What a store can hold: text checks and serialisation done on the caller's thread.

Every row is serialised (and its plain text columns checked) by ``save_tape`` and
``save_llm_call`` before it is queued, so a value the database cannot hold is refused there,
with an error that names the tape, the step and the field, and never reaches the writer thread.

The store keeps valid Unicode text only: a lone surrogate (``"\\ud83d"``, which ``json.loads``
accepts and ``surrogateescape`` decoding produces) cannot be encoded as UTF-8, so neither SQLite
nor PostgreSQL can store it; PostgreSQL also refuses the NUL character in a text column. JSON
fields (a step's data, an LLM call's prompt and output) escape NUL, so only lone surrogates are
refused there. Text an LLM made never reaches this refusal: tapekit escapes its lone surrogates
where the output enters (:func:`tapekit.llm.base.escape_lone_surrogates` owns that rule), so
what is refused here is text from the caller's own code.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def text_problem(value: str, allow_nul: bool = False) -> str | None:
    """Why ``value`` cannot be stored (None: it can)."""
    if value.isascii():  # O(1) in CPython, and most ids and names are ASCII: no lone surrogate
        return None if allow_nul or "\x00" not in value else _nul(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds a lone surrogate {value[e.start]!r} at position {e.start}, which is not valid Unicode"
    if not allow_nul and "\x00" in value:
        return _nul(value)
    return None


def _nul(value: str) -> str:
    return f"holds a NUL character at position {value.index(chr(0))}, which PostgreSQL cannot store"


def _find(value: Any, path: str) -> tuple[str, str] | None:
    """The first string inside ``value`` that cannot be stored: its path and the problem."""
    if isinstance(value, str):
        problem = text_problem(value, allow_nul=True)
        return (path or "the value", problem) if problem else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and (problem := text_problem(key, allow_nul=True)):
                return f"{path}.{key!r}" if path else repr(key), f"a key that {problem}"
            found = _find(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _find(item, f"{path}[{i}]")
            if found:
                return found
    return None


def model_json(model: BaseModel, what: str) -> str:
    """``model`` as JSON, or a ``ValueError`` naming ``what`` and the field that cannot be stored."""
    try:
        return model.model_dump_json()
    except ValueError as e:  # PydanticSerializationError is a ValueError
        found = _find(model.model_dump(), "")
        if found is None:
            raise ValueError(f"{what} cannot be stored: {e}") from e
        field, problem = found
        raise ValueError(
            f"{what} cannot be stored: its field {field} {problem} (the store keeps valid Unicode text "
            "only: replace or drop it before saving)"
        ) from None


def check_text(value: str | None, what: str) -> None:
    """Refuse a plain text column value the databases cannot store, naming ``what`` it is."""
    if value is not None and (problem := text_problem(value)):
        raise ValueError(f"{what} cannot be stored: it {problem}")
