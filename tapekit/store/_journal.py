"""The tool-effect journal: the part of :class:`~tapekit.store.TapeStore` that keeps, for each
``once`` tool call, whether it started, finished or failed (see :mod:`tapekit.effects`).

The contract: a journal row is written, and committed with every save before it, before the
tool runs (``_record_effect`` flushes), so a resume never runs a ``once`` tool blindly; a call
started with no outcome is *in doubt* until the tool reconciles it or a person resolves it
(``resolve_tool_effect``). A backend keeps the journal by taking an
:class:`~tapekit.store._writes.EffectWrite` in ``_submit`` (an upsert by key) and implementing
``_select_effects``; one that does not leaves the default, and ``once`` tools refuse to run in
sessions stored there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from tapekit.effects import ToolEffect
from tapekit.store._backend import StoreBackend
from tapekit.store._text import check_text
from tapekit.store._writes import EffectWrite, check_id


class EffectJournal(StoreBackend):
    """The journal of ``once`` tool calls (see the module docstring)."""

    def _select_effects(self, key: str | None, tape_id: str | None) -> list[tuple[Any, ...]]:
        """The journal rows (see :class:`~tapekit.store._writes.EffectWrite`) of ``key``, else
        of ``tape_id``, else all, oldest first. A backend that keeps no journal leaves this as
        is, and ``once`` tools refuse to run in sessions stored there."""
        raise NotImplementedError(
            f"{type(self).__name__} keeps no journal of tool effects: a stored session cannot run "
            "tools with effect='once' in it (implement _select_effects and take EffectWrite)"
        )

    def _record_effect(
        self,
        key: str,
        tape_id: str,
        tool: str,
        arguments: dict[str, Any],
        state: str,
        result: Any = None,
        error: str | None = None,
    ) -> None:
        """Write a journal row and wait until it (and every save before it) is committed."""
        self._check_open()
        now = time.time()
        row = (
            key,
            tape_id,
            tool,
            json.dumps(arguments, ensure_ascii=False),
            state,
            None if result is None else json.dumps(result, ensure_ascii=False),
            error,
            now,
            now,
        )
        for value in row[:7]:
            if isinstance(value, str):
                check_text(value, f"the journal record of tool call {key!r}")
        self._submit(EffectWrite(key, row))
        self.flush()

    @staticmethod
    def _effect(row: Sequence[Any]) -> ToolEffect:
        key, tape_id, tool, arguments, state, result, error, created, updated = row
        return ToolEffect(
            key=key,
            tape_id=tape_id,
            tool=tool,
            arguments=json.loads(arguments),
            state=state,
            result=None if result is None else json.loads(result),
            error=error,
            created=created,
            updated=updated,
        )

    def tool_effect(self, key: str) -> ToolEffect | None:
        """The journal's record of the ``once`` tool call ``key`` (its ToolCall step's id), or
        None if it never started (see :mod:`tapekit.effects`)."""
        check_id(key, "key")
        self.flush()
        rows = self._select_effects(key, None)
        return self._effect(rows[0]) if rows else None

    def tool_effects(self, tape_id: str | None = None, *, in_doubt: bool = False) -> list[ToolEffect]:
        """The journal's ``once`` tool calls (of ``tape_id``, else of every tape), oldest
        first; with ``in_doubt``, only those started with no outcome: what a person must
        resolve (:meth:`resolve_tool_effect`) before their sessions can go on."""
        if tape_id is not None:
            check_id(tape_id)
        self.flush()
        effects = [self._effect(r) for r in self._select_effects(None, tape_id)]
        return [e for e in effects if e.in_doubt] if in_doubt else effects

    def resolve_tool_effect(
        self, key: str, *, result: Any = None, error: str | None = None, retry: bool = False
    ) -> ToolEffect:
        """Settle a ``once`` call left in doubt: it happened (``result``: what the tool would
        have returned), it failed (``error``), or it did not happen and may run again
        (``retry=True``). The next resume of its session goes on from that. Raises
        ``KeyError`` for a key the journal does not hold and ``ValueError`` for a call that
        already has an outcome or for more than one answer."""
        if sum([result is not None, error is not None, retry]) > 1:
            raise ValueError("resolve a tool call one way: result=, error= or retry=True")
        known = self.tool_effect(key)
        if known is None:
            raise KeyError(f"no tool call {key!r} in the journal of {self.location}")
        if not known.in_doubt:
            raise ValueError(f"tool call {key!r} is not in doubt: its state is {known.state!r}")
        if error is not None and (not isinstance(error, str) or not error):
            raise TypeError(f"error must be a non-empty string, not {error!r}")
        state = "retry" if retry else "failed" if error is not None else "done"
        self._record_effect(key, known.tape_id, known.tool, known.arguments, state, result, error)
        resolved = self.tool_effect(key)
        assert resolved is not None
        return resolved
