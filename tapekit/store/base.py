"""The tape store interface, :class:`TapeStore`: what every backend offers and what a backend
implements.

A store keeps tapes (their steps, metadata and tags) and the LLM calls behind the steps. Every
public method is written once, in the parts :class:`TapeStore` combines, each in its own module
with its contract: saving tapes and tags and importing JSONL (``_saving.py``), reading, listing
and exporting them (``_reading.py``), LLM calls and totals (``_calls.py``) and the tool-effect
journal (``_journal.py``), all over a small set of protected backend methods (``_backend.py``,
which lists them with the rules they follow: ordering, atomicity, thread safety). A backend
(:class:`~tapekit.store.SQLiteStore`, :class:`~tapekit.store.PostgresStore`,
:class:`~tapekit.store.MemoryStore`, or your own) subclasses :class:`TapeStore` and implements
those; :mod:`tapekit.testing.store_conformance` checks it. The values and errors a store speaks
in (:class:`TapeInfo`, :class:`TapeFilter`, :class:`Totals`, :class:`TapeNotFoundError`,
:class:`StoreWriteError`) are in ``_types.py`` and re-exported here.

Saves are serialised and checked on the caller's thread (``_writes.py``, ``_text.py``), so a
backend receives plain rows. The SQL backends queue them for a writer thread (``_writer.py``,
the shared SQL in ``_sql.py``); JSONL import and export is ``_jsonl.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tapekit.core import Tape
from tapekit.store._calls import LLMCalls
from tapekit.store._journal import EffectJournal
from tapekit.store._reading import TapeReading
from tapekit.store._saving import TapeSaving

# the values and errors, defined here before: still importable from here
from tapekit.store._types import StoreWriteError as StoreWriteError
from tapekit.store._types import TapeFilter as TapeFilter
from tapekit.store._types import TapeInfo as TapeInfo
from tapekit.store._types import TapeNotFoundError as TapeNotFoundError
from tapekit.store._types import Totals as Totals

if TYPE_CHECKING:
    from tapekit.events import MainLoopEvent


class TapeStore(TapeSaving, TapeReading, LLMCalls, EffectJournal):
    """Tapes, their steps and tags, and the LLM calls behind the steps: the interface every
    store implements, and the type to accept wherever a store is passed (``store: TapeStore |
    None``).

    Use :func:`tapekit.store.open_store` to open SQLite or PostgreSQL from a path or URL, or
    :class:`~tapekit.store.MemoryStore` for tests and short scripts. ``close()`` (or leaving a
    ``with`` block) commits what is queued and releases the store; ``flush()`` waits until
    every save made so far is committed. Every read first waits for this store's own saves, so
    a reader always sees them.

    Its methods come from its parts: saving tapes and tags and importing JSONL
    (``TapeSaving``), reading, listing and exporting tapes (``TapeReading``), LLM calls and
    totals (``LLMCalls``), the journal of ``once`` tool calls (``EffectJournal``), and the life
    cycle (``StoreBackend``).

    **Implementing a backend.** Subclass ``TapeStore``, call ``super().__init__()``, set
    ``location`` (a path or URL without password, for messages) and implement the protected
    methods of the backend contract: ``_submit``, ``flush``, ``_close``, ``_stored_length`` and
    the ``_select_*`` reads (optionally ``pending_writes``, ``address``, ``_stored_state`` and
    the journal's ``_select_effects``). ``StoreBackend`` (``tapekit/store/_backend.py``) lists
    them with the rules they keep: order, atomicity, thread safety.

    :mod:`tapekit.testing.store_conformance` is the suite a backend must pass: run it on yours.
    """

    # ------------------------------------------------------------------ recording a session

    def recorder(
        self, start: Tape[Any, Any], tape_id: str | None = None, *, tags: Iterable[str] = ()
    ) -> Callable[[MainLoopEvent], None]:
        """Deprecated: pass ``store=`` to ``main_loop``/``amain_loop`` instead, which persist the
        session through the same path (:class:`tapekit.recording.SessionRecorder`).

        A callback for main-loop events that persists the session under ``tape_id`` (default:
        the start tape's id) with ``tags`` while it runs: every step as soon as it is made,
        every LLM call when it completes, the tape's metadata after each turn."""
        from tapekit.recording import SessionRecorder

        warnings.warn(
            "store.recorder(start) is deprecated: use main_loop(agent, start, env, store=store)",
            DeprecationWarning,
            stacklevel=2,
        )
        session = SessionRecorder(self, start, tape_id, tags=tags)
        session.start()

        def record(event: MainLoopEvent) -> None:
            session.follow(event)
            if session.over_bound():
                self.flush()

        return record
