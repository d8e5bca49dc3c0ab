"""Reading tapes: the part of :class:`~tapekit.store.TapeStore` that gets a stored tape (whole,
a page of its steps, or its raw JSON), lists and counts tapes by :class:`~tapekit.store.TapeFilter`,
follows parents and children, and exports JSONL.

The contract: every read checks its arguments, then waits for this store's own saves
(``flush``), so a reader always sees them; a missing tape is a
:class:`~tapekit.store.TapeNotFoundError` (a ``KeyError``); listings are newest first (by
``created``, then id) and page with ``limit`` and ``offset``; step slices follow Python's slice
rules. It reads only through the backend's ``_select_*`` methods (see ``_backend.py``).
"""

from __future__ import annotations

import json
import threading
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, PlainValidator, TypeAdapter

from tapekit.core import Step, StepSequence, Tape
from tapekit.llm.base import LLMCall
from tapekit.store._backend import StoreBackend
from tapekit.store._types import TapeFilter, TapeInfo, TapeNotFoundError
from tapekit.store._writes import check_id, seed_digest

_FILTER_FIELDS = tuple(TapeFilter.__dataclass_fields__)


def _filter(where: TapeFilter | None, keywords: dict[str, Any], method: str) -> TapeFilter:
    """``where`` (default: every tape); the filter keywords of older versions still work, with a
    ``DeprecationWarning``."""
    if not keywords:
        if where is None:
            return TapeFilter()
        if not isinstance(where, TapeFilter):
            raise TypeError(
                f"{method}: where must be a TapeFilter or None, not {type(where).__name__} "
                f"(write {method}(TapeFilter(author=...)))"
            )
        return where
    unknown = sorted(set(keywords) - set(_FILTER_FIELDS))
    if unknown:
        raise TypeError(f"{method}() got unexpected keyword arguments {unknown}")
    if where is not None:
        raise TypeError(f"{method}: pass the filter as where=TapeFilter(...) only, not also as keywords")
    shown = ", ".join(f"{k}=..." for k in keywords)
    warnings.warn(
        f"{method}({shown}) is deprecated: pass where=TapeFilter({shown})",
        DeprecationWarning,
        stacklevel=3,
    )
    return TapeFilter(**keywords)


def _load_steps(texts: list[str]) -> list[Any]:
    # one parse of a JSON array is ~3x faster than one parse per step
    return json.loads(f"[{','.join(texts)}]") if texts else []


_ADAPTERS: dict[type[Tape[Any, Any]], TypeAdapter[list[Any]]] = {}
_ADAPTERS_LOCK = threading.Lock()


def _steps_adapter(tape_class: type[Tape[Any, Any]]) -> TypeAdapter[list[Any]]:
    """What validates a list of ``tape_class``'s steps as its ``steps`` field would (kept per
    class): a step class's own dispatch on ``kind`` (a bare ``Tape``), else the declared union."""
    adapter = _ADAPTERS.get(tape_class)
    if adapter is None:
        args = typing.get_args(tape_class.model_fields["steps"].annotation)
        item: Any = args[0] if args else Step
        if isinstance(item, typing.TypeVar):
            item = item.__bound__ or Step
        make = getattr(item, "__sequence_item_validator__", None) if isinstance(item, type) else None
        one: Any = Annotated[Any, PlainValidator(make())] if make is not None else item
        adapter = TypeAdapter(list[one], config=ConfigDict(title="stored steps"))
        with _ADAPTERS_LOCK:
            adapter = _ADAPTERS.setdefault(tape_class, adapter)
    return adapter


def _step_parser(tape_class: type[Tape[Any, Any]]) -> Callable[[list[str]], list[Step]]:
    """``parse(texts)``: the steps stored as ``texts``, validated as ``tape_class`` holds them."""
    adapter = _steps_adapter(tape_class)

    def parse(texts: list[str]) -> list[Step]:
        return adapter.validate_python(_load_steps(texts))

    return parse


def _check_page(limit: int | None, offset: int) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, not {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, not {offset!r}")


def _check_slice(start: int, stop: int | None) -> None:
    for name, value in (("start", start), ("stop", stop)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an integer or None, not {value!r}")


class TapeReading(StoreBackend):
    """Reading, listing and exporting tapes (see the module docstring)."""

    def get_tape(self, tape_id: str, tape_class: type[Tape[Any, Any]] = Tape) -> Tape[Any, Any]:
        """The stored tape ``tape_id`` as ``tape_class`` (:class:`TapeNotFoundError` if none).

        Each step is fetched and parsed into its class when it is first read
        (:meth:`StepSequence.stored`), so resuming a long session reads only the steps it looks
        at (its last turns), and a step that does not validate (a kind no loaded class declares,
        a class changed since) raises pydantic's ``ValidationError`` where it is read:
        ``list(tape)`` reads them all. Closing the store first fetches the steps still unread
        of the tapes it returned, so a tape outlives its store."""
        info = self.get_tape_info(tape_id)
        context = self._select_context(tape_id)
        n = info.n_steps

        def fetch(start: int, stop: int) -> Sequence[str]:
            return self._select_steps(tape_id, start, stop)

        def find(kinds: frozenset[str]) -> Sequence[int] | None:
            return self._select_step_positions(tape_id, n, kinds)

        steps: StepSequence[Step] = StepSequence.stored(n, fetch, _step_parser(tape_class), find)
        if steps.stored_items is not None:
            self._lazy_reads.add(steps.stored_items)  # detached (read off the store) when it closes
        state = self._stored_state(tape_id)
        if state is not None and state[0] == len(steps) and state[1]:
            seed_digest(steps, state[1])  # a save of this tape need not hash its stored steps
        return tape_class.model_validate(
            {
                "metadata": info.to_metadata(),
                "context": json.loads(context) if context else None,
                "steps": steps,
            }
        )

    def get_steps(
        self, tape_id: str, start: int = 0, stop: int | None = None, tape_class: type[Tape[Any, Any]] = Tape
    ) -> list[Step]:
        """Steps ``start:stop`` of the stored tape ``tape_id`` (Python slice rules, negative
        indices included), without loading the rest: how a viewer pages a long tape."""
        steps = self.get_raw_steps(tape_id, start, stop)
        return list(tape_class.model_validate({"steps": steps}).steps) if steps else []

    def get_raw_steps(self, tape_id: str, start: int = 0, stop: int | None = None) -> list[Any]:
        """Steps ``start:stop`` of the stored tape ``tape_id`` as the JSON objects stored,
        not validated into step classes: for tools that show tapes whose step classes are not
        imported (the Studio). Slice rules as :meth:`get_steps`."""
        _check_slice(start, stop)
        info = self.get_tape_info(tape_id)
        window = range(info.n_steps)[slice(start, stop)]
        if not window:
            return []
        return _load_steps(self._select_steps(tape_id, window.start, window.stop))

    def get_raw_context(self, tape_id: str) -> Any:
        """The stored tape ``tape_id``'s context as the JSON value stored (None for none), not
        validated into its class."""
        self.get_tape_info(tape_id)
        context = self._select_context(tape_id)
        return json.loads(context) if context else None

    def get_tape_info(self, tape_id: str) -> TapeInfo:
        """Metadata, tags and size of the stored tape ``tape_id``, without its steps."""
        check_id(tape_id)
        self.flush()
        infos = self._select_infos(TapeFilter(), None, 0, ids=[tape_id])
        if not infos:
            raise TapeNotFoundError(tape_id, self.location)
        return infos[0]

    def list_tapes(
        self, where: TapeFilter | None = None, *, limit: int | None = None, offset: int = 0, **filters: Any
    ) -> list[str]:
        """Ids of the stored tapes matching ``where`` (default: all), newest first, ``limit``
        of them after skipping ``offset``.

        The keyword filters of earlier versions (``list_tapes(tag="x")``) still work and warn:
        write ``list_tapes(TapeFilter(tag="x"))``."""
        selected = _filter(where, filters, "list_tapes")
        _check_page(limit, offset)
        self.flush()
        return self._select_ids(selected, limit, offset)

    def list_tape_infos(
        self, where: TapeFilter | None = None, *, limit: int | None = None, offset: int = 0, **filters: Any
    ) -> list[TapeInfo]:
        """Like :meth:`list_tapes`, but each tape's :class:`TapeInfo` (no steps are loaded)."""
        selected = _filter(where, filters, "list_tape_infos")
        _check_page(limit, offset)
        self.flush()
        return self._select_infos(selected, limit, offset)

    def count_tapes(self, where: TapeFilter | None = None, **filters: Any) -> int:
        """How many stored tapes match ``where`` (default: all)."""
        selected = _filter(where, filters, "count_tapes")
        self.flush()
        return self._select_count(selected)

    def ancestry(self, tape_id: str) -> list[TapeInfo]:
        """The tapes ``tape_id`` continues: its parent, the parent's parent, … (nearest first),
        stopping at the first parent id that is not stored."""
        info = self.get_tape_info(tape_id)
        chain: list[TapeInfo] = []
        seen = {tape_id}
        while info.parent_id is not None and info.parent_id not in seen:
            found = self._select_infos(TapeFilter(), None, 0, ids=[info.parent_id])
            if not found:
                break
            info = found[0]
            seen.add(info.id)
            chain.append(info)
        return chain

    def descendants(self, tape_id: str) -> list[TapeInfo]:
        """Every stored tape whose chain of parents reaches ``tape_id``, breadth-first
        (children, then grandchildren, …; each level newest first)."""
        self.get_tape_info(tape_id)
        out: list[TapeInfo] = []
        seen = {tape_id}
        level = [tape_id]
        while level:
            children = []
            for info in self._select_children(level):
                if info.id not in seen:
                    seen.add(info.id)
                    children.append(info)
            out.extend(children)
            level = [c.id for c in children]
        return out

    def export_jsonl(
        self, path: str | Path, tape_ids: Iterable[str] | None = None, *, llm_calls: bool = True
    ) -> int:
        """Write tapes (all, or ``tape_ids``) with their metadata and tags, and with
        ``llm_calls`` the LLM calls behind their steps (all stored calls when exporting all
        tapes), to ``path``: one JSON object per line. Returns how many tapes were written."""
        from tapekit.store._jsonl import ExportedTape, write_jsonl

        if isinstance(tape_ids, str):
            raise TypeError("tape_ids must be a list of ids, not a string")
        ids = None if tape_ids is None else [check_id(t) for t in tape_ids]
        self.flush()
        if ids is None:
            ids = self._select_ids(TapeFilter(), None, 0)
            ids.reverse()  # oldest first: parents before their children
        prompt_ids: dict[str, None] = {}

        def tapes() -> Iterator[ExportedTape]:
            for tape_id in ids:
                infos = self._select_infos(TapeFilter(), None, 0, ids=[tape_id])
                if not infos:
                    raise TapeNotFoundError(tape_id, self.location)
                info = infos[0]
                if llm_calls and tape_ids is not None:
                    prompt_ids.update(dict.fromkeys(self._select_prompt_ids(tape_id)))
                yield ExportedTape(
                    info, self._select_context(tape_id), self._select_steps(tape_id, 0, info.n_steps)
                )

        def calls() -> Iterator[LLMCall]:  # runs after tapes(): the prompt ids are known then
            if llm_calls:
                yield from self._select_llm_calls(None if tape_ids is None else list(prompt_ids))

        return write_jsonl(path, tapes(), calls())
