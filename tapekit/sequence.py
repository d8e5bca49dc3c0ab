"""The step sequence: an immutable, structure-sharing list of steps with memoised folds.

A tape's steps live in a :class:`StepSequence`. Appending to the newest sequence of a buffer
extends it in place and returns a longer view; appending to an older prefix (a fork) copies it.
No existing sequence ever changes, so tapes stay values while building a session of n steps
costs O(n), not O(n²). Folds over prefixes (tape views) are memoised on the shared buffer.
"""

from __future__ import annotations

import bisect
import threading
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

S = TypeVar("S")
_T = TypeVar("_T")


_default_item: Any = Any
"""The item type of a bare ``StepSequence`` in a pydantic model (:mod:`tapekit.core` sets its
``Step``: this module does not import the steps it holds)."""


def set_default_item(item: type) -> None:
    """Make ``item`` the item type of a bare ``StepSequence`` field (called once by
    :mod:`tapekit.core`). An item class with a ``__sequence_item_validator__()`` classmethod
    returning a validator function validates each item with it; other item types are
    validated by pydantic as ``list[item]``."""
    global _default_item
    _default_item = item


class _Buffer(Generic[S]):
    """A list shared by every sequence that is a prefix of it, plus memoised folds over it."""

    __slots__ = ("folds", "items", "lock")

    def __init__(self, items: list[S]) -> None:
        self.items = items
        self.lock = threading.Lock()
        self.folds: dict[Any, _FoldCache[Any]] = {}


class _FoldCache(Generic[_T]):
    """Fold states keyed by prefix length, sorted, so any prefix resumes from the nearest one."""

    __slots__ = ("lengths", "states")

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.states: list[_T] = []

    def nearest(self, n: int) -> tuple[int, _T] | None:
        i = bisect.bisect_right(self.lengths, n)
        if i == 0:
            return None
        return self.lengths[i - 1], self.states[i - 1]

    def put(self, n: int, state: _T) -> None:
        i = bisect.bisect_left(self.lengths, n)
        if i < len(self.lengths) and self.lengths[i] == n:
            return
        self.lengths.insert(i, n)
        self.states.insert(i, state)

    def prefix(self, n: int) -> _FoldCache[_T]:
        out: _FoldCache[_T] = _FoldCache()
        i = bisect.bisect_right(self.lengths, n)
        out.lengths, out.states = self.lengths[:i], self.states[:i]
        return out


class StepSequence(Sequence[S]):
    """An immutable sequence of steps that appends in amortised O(1).

    Every sequence is a prefix ``items[:n]`` of a shared buffer. Appending to a sequence that
    ends where its buffer ends extends the buffer in place and returns a longer view; appending
    to an older prefix (a fork) copies it first. Either way no existing sequence changes.
    Slices with step 1 return sequences sharing the buffer. Folds over prefixes can be memoised
    on the buffer (:meth:`fold`), which is how tape views stay incremental.
    """

    __slots__ = ("_buf", "_n")

    def __init__(self, items: Iterable[S] = ()) -> None:
        self._buf: _Buffer[S] = _Buffer(list(items))
        self._n = len(self._buf.items)

    @classmethod
    def _view(cls, buf: _Buffer[S], n: int) -> StepSequence[S]:
        seq = cls.__new__(cls)
        seq._buf, seq._n = buf, n
        return seq

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> S: ...
    @overload
    def __getitem__(self, index: slice) -> StepSequence[S]: ...
    def __getitem__(self, index: int | slice) -> S | StepSequence[S]:
        if isinstance(index, slice):
            start, stop, stride = index.indices(self._n)
            if stride == 1 and start == 0:
                return StepSequence._view(self._buf, max(stop, 0))
            return StepSequence(self._buf.items[start:stop:stride] if stop > start else [])
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(f"step index {index} out of range for {self._n} steps")
        return self._buf.items[index]

    def __iter__(self) -> Iterator[S]:
        items = self._buf.items
        for i in range(self._n):
            yield items[i]

    def to_list(self) -> list[S]:
        """A new list of these items (one slice of the shared buffer: no per-item Python work)."""
        return self._buf.items[: self._n]

    def extend_list(self, out: list[Any]) -> None:
        """Append these items to ``out`` with ``list.extend`` (one C-level copy, whatever the
        type of ``out``: a list subclass's own ``extend`` is not called)."""
        items = self._buf.items
        list.extend(out, items if len(items) == self._n else items[: self._n])

    def __reversed__(self) -> Iterator[S]:
        items = self._buf.items
        for i in range(self._n - 1, -1, -1):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepSequence):
            if self._buf is other._buf:
                return self._n == other._n
            return self._n == other._n and all(a == b for a, b in zip(self, other, strict=True))
        if isinstance(other, list | tuple):
            return self._n == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StepSequence({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the plain list of steps (the shared buffer, its lock and memoised folds are
        process-local), so tapes can travel to worker processes (multiprocessing, Ray)."""
        return (StepSequence, (list(self),))

    def appended(self, new: Iterable[S]) -> StepSequence[S]:
        """A sequence with ``new`` after these steps; this sequence is left unchanged."""
        new = list(new)
        buf = self._buf
        with buf.lock:
            if len(buf.items) == self._n:
                buf.items.extend(new)
                return StepSequence._view(buf, self._n + len(new))
            end = self._n + len(new)
            if end <= len(buf.items) and all(
                a is b for a, b in zip(buf.items[self._n : end], new, strict=True)
            ):  # the buffer already holds exactly these steps (a fork branch being joined)
                return StepSequence._view(buf, end)
        # a fork: copy the prefix, and keep the memoised folds that still apply to it
        fork: _Buffer[S] = _Buffer(buf.items[: self._n] + new)
        fork.folds = {key: cache.prefix(self._n) for key, cache in buf.folds.items()}
        return StepSequence._view(fork, len(fork.items))

    def fold(self, key: Any, initial: Callable[[], _T], step_fn: Callable[[_T, S, int], _T]) -> _T:
        """Fold ``step_fn(state, step, index)`` over the sequence, memoised per prefix.

        ``key`` names the fold (same key, same functions). The result for this prefix is
        cached on the shared buffer, so folding a longer sequence later only folds the new
        steps. ``step_fn`` must be pure and must not mutate ``state``.
        """
        buf = self._buf
        with buf.lock:  # the cache is shared by every thread holding a prefix of this buffer
            cache = buf.folds.get(key)
            if cache is None:
                cache = buf.folds[key] = _FoldCache()
            hit = cache.nearest(self._n)
        start, state = hit if hit is not None else (0, initial())
        if start == self._n:
            return state
        items = buf.items
        for i in range(start, self._n):
            state = step_fn(state, items[i], i)
        with buf.lock:
            cache.put(self._n, state)
        return state

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        args = typing.get_args(source)
        item: Any = args[0] if args else _default_item
        if isinstance(item, TypeVar):
            item = item.__bound__ or _default_item
        make = getattr(item, "__sequence_item_validator__", None) if isinstance(item, type) else None
        if make is not None:  # the item class validates its own items (steps dispatch on kind)
            list_schema: core_schema.CoreSchema = core_schema.list_schema(
                core_schema.no_info_plain_validator_function(make())
            )
        else:
            list_schema = handler.generate_schema(list[item])  # a (discriminated) union

        def to_sequence(value: Any) -> StepSequence[Any]:
            return value if isinstance(value, StepSequence) else StepSequence(value)

        def serialize(value: StepSequence[Any], info: core_schema.SerializationInfo) -> list[Any]:
            return [
                s.model_dump(mode=info.mode, by_alias=info.by_alias, exclude_none=info.exclude_none)
                for s in value
            ]

        from_list = core_schema.no_info_after_validator_function(to_sequence, list_schema)
        return core_schema.json_or_python_schema(
            json_schema=from_list,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(StepSequence), from_list]),
            serialization=core_schema.plain_serializer_function_ser_schema(
                serialize, info_arg=True, when_used="always"
            ),
        )
