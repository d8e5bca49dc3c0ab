"""Saving tapes: the part of :class:`~tapekit.store.TapeStore` that writes a tape's steps,
metadata and tags, checks that a save under a stored id extends the stored tape, and imports
JSONL.

The contract: ``save_tape`` writes only the steps after those saved (by this store object,
queued saves included, else as committed) and refuses a tape that does not begin with them,
naming the first step that differs; the check costs the digest of the new steps, since the step
objects of the 64 tapes saved last are kept hashed (:class:`~tapekit.store._writes.KnownSteps`).
Tags are only ever added by a save and changed by ``add_tags`` / ``remove_tags``. An import is
read and checked whole, then submitted as one ``WriteGroup`` (all or nothing). Everything is
checked and serialised here, on the caller's thread; the backend receives plain rows
(``_submit``, see ``_backend.py``).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tapekit.core import Step, Tape
from tapekit.store._backend import StoreBackend
from tapekit.store._prompts import PromptEncoder
from tapekit.store._types import TapeNotFoundError
from tapekit.store._writes import (
    KnownSteps,
    TagWrite,
    TapeWrite,
    WriteGroup,
    chain_digest,
    check_id,
    check_tags,
    serialised,
    steps_digest,
)

_KNOWN_TAPES = 64  # tapes whose hashed step objects a store keeps (see TapeSaving._known)


class TapeSaving(StoreBackend):
    """Saving tapes and tags, and importing JSONL (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        # per tape saved by this object (queued saves included): (steps, their stored digest,
        # the digest of the tape given at that length, which differs only when its steps are
        # the stored ones serialised otherwise; see _check_extends)
        self._saved: dict[str, tuple[int, str, str]] = {}
        # the step objects of the tapes saved last, hashed (see steps_digest), newest last
        self._known_steps: OrderedDict[str, KnownSteps] = OrderedDict()

    def save_tape(self, tape: Tape[Any, Any], tape_id: str | None = None, *, tags: Iterable[str] = ()) -> str:
        """Save ``tape`` under ``tape_id`` (default: its own id) with ``tags`` added (a save
        never removes tags) and return that id.

        Saving again under the same id, once the tape has grown, writes only the new steps and
        the metadata: that is how a running session is persisted step by step. Steps already
        stored are never rewritten; saving a tape that does not begin with the stored steps
        under the same id (fewer steps, or other steps: another tape, a step changed, a step
        with another id) raises ``ValueError`` naming the tape and the first step that differs
        (save it under its own id instead). Saving the stored tape again changes only its
        metadata. The check costs the digest of the new steps (see :func:`steps_digest`)."""
        if not isinstance(tape, Tape):
            raise TypeError(f"save_tape needs a Tape, not {type(tape).__name__}")
        tape_id = check_id(tape_id if tape_id is not None else tape.metadata.id)
        checked_tags = check_tags(tags)
        self._check_open()
        steps = tape.steps
        start, stored, given = self._saved_state(tape_id)
        self._refuse_shorter(tape_id, start, len(steps))
        now = time.time()
        # indexing, not slicing: a slice of a step sequence is a new sequence with its own buffer
        new_steps = list(steps) if start == 0 else [steps[i] for i in range(start, len(steps))]
        write = TapeWrite(
            tape_id,
            tape.metadata,
            tape.context,
            new_steps,
            start,
            len(tape),
            checked_tags,
            now,
            now,
        )
        rows = serialised(write)
        datas = [row[7] for row in rows.steps]
        # the digest of the whole tape given, memoised on its step buffer for its next save; the
        # fold passes on the way the digest of the steps before the new ones, which are checked
        where, known = f"tape {tape_id!r}", self._known(tape_id)
        at_start: list[str] = []
        full = steps_digest(steps, len(steps), where, datas, start, known, at_start)
        mine = stored
        if start:
            if start == len(steps):
                mine = full
            else:
                mine = at_start[0] if at_start else steps_digest(steps, start, where, known=known)
            self._refuse_other(tape_id, steps, start, (stored, given), mine)
        rows.digest = full if mine == stored else chain_digest(stored, datas)
        self._submit(rows)
        self._saved[tape_id] = (len(tape), rows.digest, full)
        return tape_id

    def add_tags(self, tape_id: str, tags: Iterable[str]) -> None:
        """Add ``tags`` to the stored tape ``tape_id`` (tags it has already are kept once)."""
        self._tag(tape_id, tags, remove=False)

    def remove_tags(self, tape_id: str, tags: Iterable[str]) -> None:
        """Remove ``tags`` from the stored tape ``tape_id`` (tags it lacks are ignored)."""
        self._tag(tape_id, tags, remove=True)

    def _tag(self, tape_id: str, tags: Iterable[str], remove: bool) -> None:
        check_id(tape_id)
        checked = check_tags(tags)
        self._check_open()
        if tape_id not in self._saved and self._stored_length(tape_id) is None:
            raise TapeNotFoundError(tape_id, self.location)
        if checked:
            self._submit(TagWrite(tape_id, checked, remove))

    def import_jsonl(self, path: str | Path) -> list[str]:
        """Store the tapes and LLM calls of a file written by
        :meth:`~tapekit.store.TapeStore.export_jsonl`, with their ids, metadata, tags and creation
        times; importing the same file again changes nothing. Returns the ids of the tapes in the
        file.

        The whole file is read and checked first and then committed in one transaction: a file
        with a bad line (not UTF-8, not JSON, not a valid tape) stores nothing, and the
        ``ValueError`` names the file and line."""
        from tapekit.store._jsonl import read_import

        self._check_open()
        found = read_import(path, self._check_extends, PromptEncoder())
        if found.writes:
            self._submit(WriteGroup(found.writes))
        self.flush()
        self._saved.update(found.saved)
        return found.tape_ids

    # ------------------------------------------------------------------ checking a save

    def _saved_state(self, tape_id: str) -> tuple[int, str, str]:
        """``(start, stored, given)``: how many steps of ``tape_id`` are saved (by this object,
        queued ones included, else as committed; 0 for none), their digest as stored, and the
        digest of those steps as last given to this object (the same, but where the stored JSON
        of the same steps differs from theirs now)."""
        saved = self._saved.get(tape_id)
        if saved is not None:
            return saved
        state = self._stored_state(tape_id)
        if state is None:
            return 0, "", ""
        n, digest = state
        if digest is None and n:  # kept by no backend, or a row from before digests
            self.flush()
            digest = chain_digest("", self._select_steps(tape_id, 0, n))
        return n, digest or "", digest or ""

    def _check_extends(self, tape_id: str, steps: Sequence[Step]) -> tuple[int, str, str]:
        """:meth:`_saved_state`, once ``steps`` is checked to begin with the saved steps (its
        third item is then the digest of ``steps[:start]``): a ``ValueError`` names the tape
        and the first step that differs otherwise. Hashes only the steps not hashed before (see
        :func:`steps_digest`)."""
        start, stored, given = self._saved_state(tape_id)
        self._refuse_shorter(tape_id, start, len(steps))
        if not start:
            return 0, stored, given
        mine = steps_digest(steps, start, f"tape {tape_id!r}", known=self._known(tape_id))
        self._refuse_other(tape_id, steps, start, (stored, given), mine)
        return start, stored, mine

    @staticmethod
    def _refuse_shorter(tape_id: str, start: int, n: int) -> None:
        if n < start:
            raise ValueError(
                f"tape {tape_id} has {start} stored steps; the tape given has only {n} "
                "(save a different tape under its own id)"
            )

    def _refuse_other(
        self, tape_id: str, steps: Sequence[Step], start: int, saved: tuple[str, str], mine: str
    ) -> None:
        """Raise ``ValueError`` unless ``steps[:start]``, whose digest is ``mine``, are the
        ``start`` saved steps, whose digests are ``saved`` (as stored, as given): by digest, or
        else step by step against the stored JSON (which names the first step that differs)."""
        if mine in saved:
            return
        index = self._first_difference(tape_id, steps, start)
        if index is None:
            return  # the stored steps, serialised otherwise now (e.g. a set's order): the same tape
        known = self._known_steps.get(tape_id)
        if known is not None:  # forget what the refused tape's fold added past the saved steps
            del known.steps[start:], known.digests[start:]
        differs = (
            f"its step {index} differs from the stored step {index}"
            if index >= 0
            else "its steps differ from the stored ones"
        )
        raise ValueError(
            f"tape {tape_id} has {start} stored steps and the tape given does not begin with them: "
            f"{differs} (saving under a stored id must extend the stored tape; save a different "
            "tape under its own id, e.g. tape.with_new_steps(...), which points at the original)"
        )

    def _known(self, tape_id: str) -> KnownSteps:
        """The steps of ``tape_id`` this store hashed (kept for the 64 tapes saved last)."""
        known = self._known_steps.get(tape_id)
        if known is None:
            known = self._known_steps[tape_id] = KnownSteps()
            if len(self._known_steps) > _KNOWN_TAPES:
                self._known_steps.popitem(last=False)
        else:
            self._known_steps.move_to_end(tape_id)
        return known

    def _first_difference(self, tape_id: str, steps: Sequence[Step], n: int) -> int | None:
        """The first of the ``n`` stored steps of ``tape_id`` that ``steps`` does not hold,
        compared as JSON and else as the step class reads the stored JSON (None: they are the
        same steps; -1: the stored steps could not be read to tell which)."""
        try:
            self.flush()
            stored = self._select_steps(tape_id, 0, n)
        except Exception:
            return -1
        if len(stored) != n:
            return -1
        for i, data in enumerate(stored):
            step = steps[i]
            if data == step.model_dump_json():
                continue
            try:
                same = json.loads(data) == json.loads(step.model_dump_json()) or (
                    type(step).model_validate_json(data) == step
                )
            except Exception:
                same = False
            if not same:
                return i
        return None
