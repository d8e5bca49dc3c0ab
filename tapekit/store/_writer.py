"""The SQL stores' writer: a queue and a background thread with its own connection that commits
queued writes in batches (``batch_size`` writes, or what arrived within ``flush_interval_s``).

A batch the database refuses is committed again write by write (an import as a whole), so one
bad row never loses another nor stops the writer; the writes that fail on their own are reported
once, by the next ``flush`` or read, as :class:`~tapekit.store.StoreWriteError`.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any

from tapekit.store._writes import Write, WriteGroup, describe, flat
from tapekit.store.base import StoreWriteError, TapeStore


@dataclass(slots=True)
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class QueuedTapeStore(TapeStore):
    """A :class:`TapeStore` whose saves are queued and committed in batches by a writer thread
    with its own connection: ``_submit`` queues, ``flush`` waits for the writer, ``close``
    commits what is queued and stops it. A subclass supplies ``_writer_connect``,
    ``_writer_close``, ``_commit`` and ``_close_readers`` (and the reads), and calls
    ``_start_writer`` at the end of its ``__init__``."""

    def __init__(self, batch_size: int = 512, flush_interval_s: float = 0.05) -> None:
        super().__init__()
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
        if not isinstance(flush_interval_s, int | float) or flush_interval_s < 0:
            raise ValueError(f"flush_interval_s must be a number >= 0, not {flush_interval_s!r}")
        self.batch_size = batch_size
        self.flush_interval_s = float(flush_interval_s)
        self._queue: queue.Queue[Any] = queue.Queue()
        # set when the writer should stop waiting for a batch to fill: a flush or stop is queued,
        # or a whole batch is (the writer drains the queue without a wake-up per queued write)
        self._wake = threading.Event()
        self._error: BaseException | None = None
        self._failed_writes: list[str] = []  # writes the writer could not commit, not yet reported
        self._writer: threading.Thread | None = None

    @abstractmethod
    def _writer_connect(self) -> Any:
        """A connection for the writer thread (used only by that thread)."""

    @abstractmethod
    def _writer_close(self, conn: Any) -> None:
        """Close the writer thread's connection."""

    @abstractmethod
    def _commit(self, conn: Any, writes: list[Write]) -> None:
        """Commit ``writes`` (in order) in one transaction on the writer's connection."""

    @abstractmethod
    def _close_readers(self) -> None:
        """Close the connections used for reading."""

    def _salvage(self, conn: Any, writes: list[Write]) -> None:
        """Called with the writes of an item the database refused on its own: store what later
        writes rely on (the SQL stores: its prompt parts)."""

    def _start_writer(self) -> None:
        """Start the writer thread; backends call this at the end of ``__init__``."""
        name = f"tapekit-{type(self).__name__}-writer"
        self._writer = threading.Thread(target=self._write_loop, name=name, daemon=True)
        self._writer.start()

    def _submit(self, item: Write | WriteGroup) -> None:
        """Queue ``item`` for the writer thread."""
        self._check_open()
        self._raise_writer_error()
        self._queue.put(item)
        if self._queue.unfinished_tasks >= self.batch_size and not self._wake.is_set():
            self._wake.set()

    def _put_urgent(self, item: Any) -> None:
        """Queue a flush marker or the stop: the writer ends its batch at once."""
        self._queue.put(item)
        self._wake.set()

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the store's writer failed: {self._error!r}") from self._error
        if self._failed_writes:  # reported once; the writer goes on
            failed, self._failed_writes = self._failed_writes, []
            raise StoreWriteError(
                f"{len(failed)} queued write(s) to {self.location} failed and were not stored "
                "(the other writes were): " + "; ".join(failed)
            )

    def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        self._check_open()
        if self._queue.unfinished_tasks == 0:
            self._raise_writer_error()
            return
        marker = _Flush()
        self._check_open()
        self._raise_writer_error()
        self._put_urgent(marker)
        while not marker.done.wait(0.1):
            if self._writer is None or not self._writer.is_alive():
                break
        self._raise_writer_error()

    def _close(self) -> None:
        """Commit what is queued, stop the writer and close the reading connections."""
        if self._writer is not None and self._writer.is_alive():
            self._put_urgent(_STOP)
            self._writer.join()
        self._close_readers()

    def _write_loop(self) -> None:
        try:
            conn = self._writer_connect()
        except BaseException as e:  # surfaced on the next write or flush
            self._error = e
            return
        try:
            while True:
                item = self._queue.get()
                batch = [item]
                deadline = time.monotonic() + self.flush_interval_s
                # a flush or stop ends the batch at once: whoever waits should not wait longer
                while not (item is _STOP or isinstance(item, _Flush)) and len(batch) < self.batch_size:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        # wait for the batch to fill (``_submit`` wakes us), a flush, or the deadline,
                        # rather than waking for every write (which slowed the callers down)
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._wake.wait(remaining)
                        self._wake.clear()
                        continue
                    batch.append(item)
                writes = [b for b in batch if b is not _STOP and not isinstance(b, _Flush)]
                if writes:
                    self._commit_or_isolate(conn, writes)
                for b in batch:
                    if isinstance(b, _Flush):
                        b.done.set()
                    self._queue.task_done()
                if any(b is _STOP for b in batch):
                    return
        except BaseException as e:  # surfaced on the next write or flush
            self._error = e
        finally:
            self._writer_close(conn)

    def _commit_or_isolate(self, conn: Any, items: list[Write | WriteGroup]) -> None:
        """Commit ``items`` in one transaction; if that fails, commit them one by one (a group
        as a whole), so that one bad row never loses the others nor stops the writer: only the
        items that fail on their own are lost, and the next ``flush`` (or read) reports them."""
        try:
            self._commit(conn, flat(items))
            return
        except Exception as e:
            if len(items) == 1:
                self._failed_writes.append(f"{describe(items[0])}: {type(e).__name__}: {e}")
                self._salvage(conn, flat(items))
                return
        for item in items:
            try:
                self._commit(conn, flat([item]))
            except Exception as e:
                self._failed_writes.append(f"{describe(item)}: {type(e).__name__}: {e}")
                self._salvage(conn, flat([item]))

    def pending_writes(self) -> int:
        """How many queued writes the background writer has not committed yet (what a recorded
        session bounds, waiting for the writer when there are too many)."""
        return self._queue.unfinished_tasks
