"""Helpers shared by the ``tapekit`` commands: loading an agent target, reading input files,
checking output paths and opening stores before any work, picking a stored tape. Only the
standard library and typer at import time.

The rule for bad input: every command checks all of it (files readable and UTF-8, output
folders present, ids distinct, the store reachable) before it creates or runs anything, and a
mistake is a :class:`CliError`, printed as ``error: ...`` with exit code 2. The helpers here
raise it, so each command reads a file with :func:`read_text`, checks an output path with
:func:`check_writable` and opens a store with :func:`open_cli_store`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tapekit.errors import TapekitError

if TYPE_CHECKING:
    from tapekit.agent import Agent
    from tapekit.core import Tape
    from tapekit.environment import Environment
    from tapekit.store import TapeStore


class CliError(TapekitError):
    """A mistake in the command's input: printed as ``error: ...`` with exit code 2."""


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` to stderr and return the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def read_text(path: Path, option: str = "") -> str:
    """The text of the UTF-8 file ``path``. A file that is missing, unreadable or not UTF-8 is a
    :class:`CliError` naming it (after ``option``, e.g. ``--tasks``, when given) and, for bad
    UTF-8, the line, column and byte."""
    where = f"{option} {path}" if option else str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {where}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise CliError(
            f"{where}, line {line}: not valid UTF-8 (byte {data[e.start]:#04x} at column {column}); "
            "save the file as UTF-8"
        ) from None


def check_writable(path: Path, option: str) -> None:
    """Fail now, before any work, when ``path`` (the value of ``option``, e.g. ``--out``) could
    not be written later: its folder is missing or read-only, or it is a folder. Nothing is
    created."""
    folder = path.parent
    if path.is_dir():
        raise CliError(f"{option} {path}: is a folder; give a file path")
    if not folder.is_dir():
        raise CliError(f"{option} {path}: the folder {folder} does not exist (make it first)")
    target = path if path.exists() else folder
    if not os.access(target, os.W_OK):
        raise CliError(f"{option} {path}: {target} is not writable")


def open_cli_store(db: str, *, existing: bool = False) -> TapeStore:
    """The store at ``db`` (an SQLite file or a ``postgresql://`` URL); one that cannot be opened
    (a missing folder, no server, no driver installed) is a :class:`CliError`. With
    ``existing`` (a command that only reads the store) a missing SQLite file is one too, rather
    than a new empty store."""
    from tapekit.store import open_store

    if existing and not db.startswith(("postgresql://", "postgres://")) and not Path(db).is_file():
        raise CliError(f"--db {db}: no such store (no file there)")
    try:
        return open_store(db)
    except (ValueError, ConnectionError, ImportError) as e:
        raise CliError(str(e) if db in str(e) else f"--db {db}: {e}") from None


def project_on_path() -> None:
    """Put the working folder first on ``sys.path`` (once), so that a ``module:attr`` target
    names the project's own modules as ``python -m`` would. Every command that loads user code
    calls this, and nothing else changes ``sys.path``."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def load_target(target: str) -> tuple[Agent, Environment | None]:
    """The agent (and environment, if the target gives one) that ``module:attr`` names: an
    Agent, an ``(agent, environment)`` pair, or a function returning either."""
    from tapekit._loading import load_object
    from tapekit.agent import Agent
    from tapekit.environment import Environment

    project_on_path()
    try:
        obj: Any = load_object(target)
    except ValueError as e:
        raise CliError(str(e)) from None
    if callable(obj) and not isinstance(obj, Agent):
        try:
            obj = obj()
        except Exception as e:
            raise CliError(f"calling {target!r} failed: {type(e).__name__}: {e}") from e
    environment = None
    if isinstance(obj, tuple) and len(obj) == 2:
        obj, environment = obj
    if not isinstance(obj, Agent) or not (environment is None or isinstance(environment, Environment)):
        raise CliError(f"{target!r} must give an Agent or (agent, environment), not {type(obj).__name__}")
    return obj, environment


def read_tape_file(path: Path) -> Tape[Any, Any]:
    """The tape in a JSON file (a tape object, or the first line of a JSONL file of tapes)."""
    from pydantic import ValidationError

    from tapekit.core import Tape

    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            data = json.loads(first)
        except json.JSONDecodeError as e:
            raise CliError(f"{path} is not a JSON tape: {e}") from None
    try:
        return Tape.model_validate(data)
    except ValidationError as e:
        raise CliError(f"{path} is not a valid tape: {e}") from None


def pick_tape(store: TapeStore, tape: str) -> str:
    """The id of a stored tape: ``latest`` (the newest), ``waiting`` (the newest waiting
    session), or an id (a unique prefix of at least 6 characters is enough)."""
    from tapekit.store import TapeFilter, TapeNotFoundError

    if tape in ("latest", "waiting"):
        ids = store.list_tapes(TapeFilter(tag="waiting" if tape == "waiting" else None), limit=1)
        if not ids:
            raise CliError(f"no {'waiting ' if tape == 'waiting' else ''}tape in {store.location}")
        return ids[0]
    try:
        store.get_tape_info(tape)
        return tape
    except TapeNotFoundError:
        pass
    if len(tape) >= 6:
        matches = [i for i in store.list_tapes() if i.startswith(tape)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise CliError(f"tape id prefix {tape!r} matches {len(matches)} tapes; give more of it")
    raise CliError(f"no tape {tape!r} in {store.location}")
