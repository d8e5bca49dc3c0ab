"""The store's writer: a queue and a background thread with its own connection that commits
queued writes in batches (``batch_size`` writes, or what arrived within ``flush_interval_s``).

A batch the database refuses is committed again write by write (an import as a whole), so one
bad row never loses another nor stops the writer; the writes that fail on their own are reported
once, by the next ``flush`` or read, as :class:`StoreWriteError`.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Self

from tapekit.errors import TapekitError
from tapekit.store._writes import Write, WriteGroup, describe, flat

__all__ = ["QueuedWriter", "StoreWriteError"]


class StoreWriteError(TapekitError, RuntimeError):
    """Queued writes the database refused (each named); the store's other writes were committed
    and the store keeps working. Raised once, by the next ``flush`` or read."""


@dataclass(slots=True)
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class QueuedWriter:
    """The queue, the writer thread and their life cycle (a base of :class:`TapeStore`). A
    subclass supplies ``_writer_connect``, ``_writer_close``, ``_commit`` and ``_close_readers``,
    and calls ``_start_writer`` at the end of its ``__init__``."""

    #: where the data lives, for messages (a path or a DSN without password)
    location: str = "the store"

    def __init__(self, batch_size: int = 512, flush_interval_s: float = 0.05) -> None:
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
        self._closed = False
        self._writer: threading.Thread | None = None

    def _writer_connect(self) -> Any:
        raise NotImplementedError

    def _writer_close(self, conn: Any) -> None:
        raise NotImplementedError

    def _commit(self, conn: Any, writes: list[Write]) -> None:
        raise NotImplementedError

    def _close_readers(self) -> None:
        raise NotImplementedError

    def _start_writer(self) -> None:
        """Start the writer thread; backends call this at the end of ``__init__``."""
        name = f"tapekit-{type(self).__name__}-writer"
        self._writer = threading.Thread(target=self._write_loop, name=name, daemon=True)
        self._writer.start()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} on {self.location} is closed")

    def _put(self, item: Any) -> None:
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

    def close(self) -> None:
        """Commit what is queued and stop the writer (closing twice is harmless)."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None and self._writer.is_alive():
            self._put_urgent(_STOP)
            self._writer.join()
        self._close_readers()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                        # wait for the batch to fill (``_put`` wakes us), a flush, or the deadline,
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
                return
        for item in items:
            try:
                self._commit(conn, flat([item]))
            except Exception as e:
                self._failed_writes.append(f"{describe(item)}: {type(e).__name__}: {e}")

    def pending_writes(self) -> int:
        """How many queued writes the background writer has not committed yet (what a recorded
        session bounds, waiting for the writer when there are too many)."""
        return self._queue.unfinished_tasks
