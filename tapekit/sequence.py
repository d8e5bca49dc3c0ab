"""The step sequence: an immutable, structure-sharing list of steps with memoised folds.

A tape's steps live in a :class:`StepSequence`. Appending to the newest sequence of a buffer
extends it in place and returns a longer view; appending to an older prefix (a fork) copies it.
No existing sequence ever changes, so tapes stay values while building a session of n steps
costs O(n), not O(n²). Folds over prefixes (tape views) are memoised on the shared buffer.

A sequence read from a store (:meth:`StepSequence.stored`) leaves each step in the store until
the step is first read, and then fetches and parses it with its neighbours in a batch; copies of
such a sequence (slices, forks, the tape views built from it) share what was read. A session
resumed from a long stored tape therefore reads only the steps it looks at (its last turns).
"""

from __future__ import annotations

import bisect
import threading
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import is_
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


class StoredItems:
    """The items of a sequence read from a store, each fetched and parsed when first read (see
    :meth:`StepSequence.stored`).

    A sequence holding unread items keeps, in an item's place, its row: its index in the stored
    sequence (an ``int``: a step never is one), and this object in its buffer's ``lazy``. Reading
    items fetches their rows' texts (``fetch(start, stop)``: the texts of rows ``start:stop``)
    and parses them (``parse(texts)``: their items, in order). Each row is parsed once and its
    item kept here, so every copy of the sequence (a slice, a fork, a tape view made from it)
    gets the same item objects. ``find(kinds)``, if given, returns the rows whose step kind is
    one of ``kinds`` without reading them (:meth:`StepSequence.stored_positions`), or None when
    the store cannot. :meth:`detach` fetches the rows still unread, so that reads no longer need
    the store.
    """

    __slots__ = ("__weakref__", "fetch", "find", "found", "items", "lock", "parse")

    def __init__(
        self,
        n: int,
        fetch: Callable[[int, int], Sequence[str]],
        parse: Callable[[list[str]], list[Any]],
        find: Callable[[frozenset[str]], Sequence[int] | None] | None = None,
    ) -> None:
        self.items: list[Any] = [None] * n  # row -> its item, once parsed
        self.fetch = fetch
        self.parse = parse
        self.find = find
        self.found: dict[frozenset[str], Sequence[int]] = {}
        self.lock = threading.RLock()

    def items_of(self, rows: list[int], needed: int | None = None) -> list[Any]:
        """The items of ``rows`` (sorted), fetched and parsed now (once) or kept from before.

        A row whose text does not parse is None in the result, and its error is raised if it is
        the row ``needed`` (None: every row is): one bad step spoils no other's read."""
        with self.lock:  # one parse per row, whichever thread reads it first
            items = self.items
            todo = [r for r in rows if items[r] is None]
            failed: dict[int, Exception] = {}
            while todo:
                # one fetch for rows close together; then the next run of them
                end = next((i for i in range(1, len(todo)) if todo[i] - todo[i - 1] > _BLOCK), len(todo))
                run, todo = todo[:end], todo[end:]
                texts = self.fetch(run[0], run[-1] + 1)
                if len(texts) != run[-1] + 1 - run[0]:
                    raise LookupError(f"the store gave {len(texts)} of rows {run[0]} to {run[-1]}")
                batch = [texts[r - run[0]] for r in run]
                try:
                    parsed = self.parse(batch)
                except Exception:  # find which: each on its own
                    parsed = []
                    for row, text in zip(run, batch, strict=True):
                        try:
                            parsed.extend(self.parse([text]))
                        except Exception as e:
                            parsed.append(None)
                            failed[row] = e
                for row, item in zip(run, parsed, strict=True):
                    items[row] = item
            for row, error in failed.items():
                if needed is None or row == needed:
                    raise error
            return [items[r] for r in rows]

    def positions(self, kinds: frozenset[str]) -> Sequence[int] | None:
        """The rows whose step kind is one of ``kinds``, sorted (None: unknown unread)."""
        with self.lock:
            found = self.found.get(kinds)
            if found is None:
                found = None if self.find is None else self.find(kinds)
                if found is None:  # the store cannot find them
                    self.find = None
                    return None
                self.found[kinds] = found
            return found

    def detach(self) -> None:
        """Fetch the texts of every row still unread, so that reading them needs the store no
        more (a store does this for the sequences it read, when it closes)."""
        with self.lock:
            items, texts = self.items, dict[int, str]()
            for a in range(0, len(items), _RUN):
                b = min(a + _RUN, len(items))
                if any(map(is_, items[a:b], repeat(None))):
                    texts.update(
                        (r, t) for r, t in zip(range(a, b), self.fetch(a, b), strict=True) if items[r] is None
                    )
            self.fetch = lambda start, stop: [texts.get(r, "") for r in range(start, stop)]
            self.find = None


class _Buffer(Generic[S]):
    """A list shared by every sequence that is a prefix of it, plus memoised folds over it.

    ``lazy`` is set while the list may hold unread items (their rows, see :class:`StoredItems`);
    ``known`` is how many of its first items are rows ``0:known`` of ``stored`` (or were, before
    they were read), so a fold can find the rows of some kinds without reading them.
    """

    __slots__ = ("folds", "items", "known", "lazy", "lock", "stored")

    def __init__(self, items: list[S], lazy: StoredItems | None = None) -> None:
        self.items = items
        self.lock = threading.Lock()
        self.folds: dict[Any, _FoldCache[Any]] = {}
        self.lazy = lazy
        self.stored: StoredItems | None = None
        self.known = 0

    def read(self, start: int, stop: int, needed: int | None = None) -> None:
        """Fetch and parse the unread items among ``items[start:stop]`` (in batches of
        ``_RUN``) and put them in their places; once none is left, the buffer is no longer lazy.
        A step that does not parse raises if it is at ``needed`` (None: anywhere here), and is
        left unread otherwise."""
        lazy = self.lazy
        if lazy is None:
            return
        items: list[Any] = self.items
        for a in range(start, stop, _RUN):
            b = min(a + _RUN, stop)
            at = list(compress(range(a, b), map(is_, map(type, items[a:b]), repeat(int))))
            if at:
                need = None  # the row whose failure raises (None: any row's)
                if needed is not None:
                    need = items[needed] if a <= needed < b and type(items[needed]) is int else -1
                for i, item in zip(at, lazy.items_of([items[i] for i in at], need), strict=True):
                    if item is not None:
                        items[i] = item
        if start == 0 and needed is None:
            with self.lock:  # appends that bring unread items set `lazy` under this lock too
                if stop >= len(items) and self.lazy is lazy:
                    self.lazy = None

    def read_at(self, index: int) -> S:
        """The item at ``index``, read (with the unread items of its block) if need be."""
        block = index - index % _BLOCK
        self.read(block, min(block + _BLOCK, len(self.items)), index)
        return self.items[index]


_BLOCK = 64  # unread items read together when one of them is read by index
_RUN = 1024  # the most unread items read in one batch


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

    @classmethod
    def stored(
        cls,
        n: int,
        fetch: Callable[[int, int], Sequence[str]],
        parse: Callable[[list[str]], list[S]],
        find: Callable[[frozenset[str]], Sequence[int] | None] | None = None,
    ) -> StepSequence[S]:
        """The sequence of the ``n`` items a store holds, each fetched and parsed when it is
        first read: reading any item, by index, iteration or a fold, reads the unread items
        near it, and a copy of the sequence (slice, fork, appended) shares what was read.

        ``fetch(start, stop)`` returns the stored texts of items ``start:stop``; ``parse(texts)``
        their items, in order (a store validates them into step classes), and raises where a
        text does not parse; ``find(kinds)``, if given, the indices of the items whose step kind
        is one of ``kinds``, sorted, without reading them: the tape view stack uses it to pass
        over the steps that cannot change it (see :meth:`stored_positions`). The store keeps
        the sequence's :attr:`stored_items`, to :meth:`StoredItems.detach` it when it closes."""
        if not n:
            return cls()
        lazy = StoredItems(n, fetch, parse, find)
        buf: _Buffer[S] = _Buffer(list(range(n)), lazy)  # type: ignore[arg-type]  # unread: rows
        buf.stored, buf.known = lazy, n
        return cls._view(buf, n)

    @property
    def stored_items(self) -> StoredItems | None:
        """The store's items this sequence was read from (see :meth:`stored`), or None."""
        return self._buf.stored

    def stored_positions(self, kinds: frozenset[str], start: int, stop: int) -> list[int] | None:
        """The indices in ``start:stop`` of the items whose step kind is one of ``kinds``, when
        the sequence can tell without reading the items (it was read from a store that finds
        them, see :meth:`stored`), else None."""
        buf = self._buf
        if buf.stored is None or not 0 <= start <= stop <= min(self._n, buf.known):
            return None
        rows = buf.stored.positions(kinds)
        if rows is None:
            return None
        return list(rows[bisect.bisect_left(rows, start) : bisect.bisect_left(rows, stop)])

    def items_at(self, indices: Sequence[int]) -> list[S]:
        """The items at ``indices`` (of ``0:len``), reading only those of them still unread
        (not their neighbours, as reading one by index does)."""
        buf = self._buf
        items: list[Any] = buf.items
        if not all(0 <= i < self._n for i in indices):
            raise IndexError(f"step indices out of range for {self._n} steps")
        lazy = buf.lazy
        if lazy is not None:
            at = sorted({i for i in indices if type(items[i]) is int})
            if at:
                for i, item in zip(at, lazy.items_of([items[i] for i in at]), strict=True):
                    items[i] = item
        return [items[i] for i in indices]

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
            buf = self._buf
            items = buf.items[start:stop:stride] if stop > start else []
            return StepSequence._view(_Buffer(items, buf.lazy), len(items))
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(f"step index {index} out of range for {self._n} steps")
        buf = self._buf
        item = buf.items[index]
        if buf.lazy is not None and type(item) is int:
            return buf.read_at(index)
        return item

    def __iter__(self) -> Iterator[S]:
        buf = self._buf
        items = buf.items
        if buf.lazy is None:
            for i in range(self._n):
                yield items[i]
            return
        for start in range(0, self._n, _RUN):
            stop = min(start + _RUN, self._n)
            buf.read(start, stop)
            for i in range(start, stop):
                yield items[i]

    def to_list(self) -> list[S]:
        """A new list of these items (one slice of the shared buffer: no per-item Python work)."""
        self._buf.read(0, self._n)
        return self._buf.items[: self._n]

    def extend_list(self, out: list[Any]) -> None:
        """Append these items to ``out`` with ``list.extend`` (one C-level copy, whatever the
        type of ``out``: a list subclass's own ``extend`` is not called)."""
        self._buf.read(0, self._n)
        items = self._buf.items
        list.extend(out, items if len(items) == self._n else items[: self._n])

    def __reversed__(self) -> Iterator[S]:
        buf = self._buf
        items = buf.items
        for i in range(self._n - 1, -1, -1):
            item = items[i]
            yield buf.read_at(i) if buf.lazy is not None and type(item) is int else item

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
        with buf.lock:  # the common case inline: it runs several times per step
            if len(buf.items) == self._n:
                buf.items.extend(new)
                return StepSequence._view(buf, self._n + len(new))
        return self._appended(new, None)

    def appended_from(self, other: StepSequence[S], start: int, stop: int) -> StepSequence[S]:
        """``self.appended(other[start:stop])``, without reading the items of ``other`` that are
        still unread (they stay unread in the result, and are parsed once whichever sequence
        reads them first)."""
        src = other._buf
        lazy = src.lazy
        if lazy is not None and self._buf.lazy not in (None, lazy):
            src.read(start, stop)  # unread items of two stores in one buffer: read these first
            lazy = None
        return self._appended(src.items[start:stop], lazy)

    def _appended(self, new: list[S], lazy: StoredItems | None) -> StepSequence[S]:
        """:meth:`appended`, where ``new`` may hold unread items of ``lazy``."""
        buf = self._buf
        with buf.lock:
            if len(buf.items) == self._n:
                buf.items.extend(new)
                if lazy is not None:
                    buf.lazy = lazy
                return StepSequence._view(buf, self._n + len(new))
            end = self._n + len(new)
            if end <= len(buf.items) and all(
                a is b for a, b in zip(buf.items[self._n : end], new, strict=True)
            ):  # the buffer already holds exactly these steps (a fork branch being joined)
                return StepSequence._view(buf, end)
            prefix, prefix_lazy = buf.items[: self._n], buf.lazy
        if lazy is not None and prefix_lazy not in (None, lazy):
            read = _Buffer(prefix, prefix_lazy)  # unread items of two stores: read the prefix's
            read.read(0, len(prefix))
            prefix, prefix_lazy = read.items, None
        # a fork: copy the prefix, and keep the memoised folds that still apply to it
        fork: _Buffer[S] = _Buffer(prefix + new, lazy or prefix_lazy)
        if buf.stored is not None:
            fork.stored, fork.known = buf.stored, min(buf.known, self._n)
        fork.folds = {key: cache.prefix(self._n) for key, cache in buf.folds.items()}
        return StepSequence._view(fork, len(fork.items))

    def fold(
        self,
        key: Any,
        initial: Callable[[], _T],
        step_fn: Callable[[_T, S, int], _T],
        leap: Callable[[_T, StepSequence[S], int, int], _T] | None = None,
    ) -> _T:
        """Fold ``step_fn(state, step, index)`` over the sequence, memoised per prefix.

        ``key`` names the fold (same key, same functions). The result for this prefix is
        cached on the shared buffer, so folding a longer sequence later only folds the new
        steps. ``step_fn`` must be pure and must not mutate ``state``.

        ``leap(state, sequence, start, stop)``, if given, must return what folding items
        ``start:stop`` into ``state`` would; it is used over the items read from a store
        (:meth:`stored`, whose kinds :meth:`stored_positions` finds unread), so that a fold that
        only needs a few of them (the tape view stack) does not read a long stored tape.
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
        if leap is not None and start < min(buf.known, self._n):
            stop = min(buf.known, self._n)
            state = leap(state, self, start, stop)
            start = stop
            if start < self._n:
                with buf.lock:
                    cache.put(start, state)
        if start < self._n:
            buf.read(start, self._n)
            items = buf.items
            for i in range(start, self._n):
                state = step_fn(state, items[i], i)
        with buf.lock:
            cache.put(self._n, state)
        return state

    def seed_fold(self, key: Any, state: Any) -> None:
        """Record ``state`` as what the fold ``key`` gives over this whole sequence, as if
        :meth:`fold` had computed it: for a state known without folding (a store's digest of
        the steps it stored). Folding a longer sequence of this buffer then starts from it."""
        buf = self._buf
        with buf.lock:
            cache = buf.folds.get(key)
            if cache is None:
                cache = buf.folds[key] = _FoldCache()
            cache.put(self._n, state)

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
