"""The store's values and errors: :class:`TapeInfo` (a stored tape without its steps),
:class:`TapeFilter` (which tapes a listing selects), :class:`Totals`, and the two errors a store
raises of its own, :class:`TapeNotFoundError` and :class:`StoreWriteError`.

Every part of :class:`~tapekit.store.TapeStore` and every backend speaks in these; they are
re-exported by :mod:`tapekit.store` (and ``tapekit.store.base``, where they were defined before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from tapekit.core import TapeMetadata
from tapekit.errors import TapekitError


class StoreWriteError(TapekitError, RuntimeError):
    """Queued writes the database refused (each named); the store's other writes were committed
    and the store keeps working. Raised once, by the next ``flush`` or read."""


class Totals(dict[str, dict[str, float]]):
    """Token and cost totals by group: ``{group: {"calls", "prompt_tokens", "output_tokens",
    "cost"}}``."""


class TapeNotFoundError(TapekitError, KeyError):
    """No tape with that id is stored (a ``KeyError``, so ``except KeyError`` keeps working)."""

    def __init__(self, tape_id: str, where: str = "the store") -> None:
        super().__init__(tape_id)
        self.tape_id = tape_id
        self.where = where

    def __str__(self) -> str:
        return f"no tape {self.tape_id!r} in {self.where}"


class TapeInfo(BaseModel):
    """A stored tape's metadata, tags and size, without its steps: what lists and pickers show.

    ``created`` is when the tape was first saved and ``updated`` when it last changed (unix
    seconds); ``n_steps`` how many steps are stored; ``other`` the tape's ``metadata.other``.
    :attr:`metadata` is the tape's whole :class:`~tapekit.core.TapeMetadata`.
    """

    id: str
    parent_id: str | None = None
    author: str | None = None
    author_tape_id: str | None = None
    n_steps: int = 0
    n_added_steps: int = 0
    error: str | None = None
    result: Any = None
    other: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    created: float = 0.0
    updated: float = 0.0

    @property
    def metadata(self) -> TapeMetadata:
        """The stored tape's :class:`~tapekit.core.TapeMetadata` (every field, ``other``
        included), as ``store.get_tape(id).metadata`` would give it, without loading steps."""
        return self.to_metadata()

    def to_metadata(self) -> TapeMetadata:
        """The stored tape's :class:`~tapekit.core.TapeMetadata` (a new object each call)."""
        return TapeMetadata(
            id=self.id,
            parent_id=self.parent_id,
            author=self.author,
            author_tape_id=self.author_tape_id,
            n_added_steps=self.n_added_steps,
            error=self.error,
            result=self.result,
            other=self.other,
        )


@dataclass(frozen=True)
class TapeFilter:
    """Which tapes :meth:`TapeStore.list_tapes`, :meth:`~TapeStore.list_tape_infos` and
    :meth:`~TapeStore.count_tapes` select: every field given must hold; a field left ``None``
    does not filter, so ``TapeFilter()`` matches every tape.

    - ``author``: the tape's ``metadata.author`` is this.
    - ``agent``: at least one step was made by this agent (its full name, e.g.
      ``analyst/search_agent``).
    - ``has_error``: failed (``True``: ``metadata.error`` is set) or clean (``False``) tapes.
    - ``tag``: the tape has this tag.
    - ``since``, ``until``: ``since <= created < until`` (unix seconds).
    - ``parent_id``: direct continuations of this tape.
    """

    author: str | None = None
    agent: str | None = None
    has_error: bool | None = None
    tag: str | None = None
    since: float | None = None
    until: float | None = None
    parent_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("author", "agent", "tag", "parent_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string or None, not {type(value).__name__}")
        if self.has_error is not None and not isinstance(self.has_error, bool):
            raise TypeError(f"has_error must be True, False or None, not {self.has_error!r}")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise TypeError(f"{name} must be unix seconds (a number) or None, not {value!r}")
