"""Spans while the agent runs: :class:`OtelTracer`, a callback for main-loop events.

The callback only stamps the event with the time and appends it to a deque (no lock, no
wake-up), so the loop does not wait on it; a worker thread wakes every ``schedule_delay_s``,
turns the events gathered since into spans (the same :class:`SpanBuilder` as the export of
stored tapes) and hands them to a ``BatchSpanProcessor``, which sends them in batches from its
own thread. Waking per batch rather than per event keeps the two threads from trading the GIL
on every step. A node run's span is sent when the run ends, a tool call's when its result
arrives, a subagent run's at its ``Respond``, and the tape's own span when the tracer closes.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self

from tapekit.core import Tape
from tapekit.otel._build import SpanBuilder, SpanRecord

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter


logger = logging.getLogger(__name__)


class OtelTracer:
    """Export a session as OpenTelemetry GenAI spans while it runs.

    Call it with every event of ``main_loop`` / ``async_main_loop`` (like a store's
    ``recorder``), then :meth:`close` it (or use it as a context manager). ``start`` is the tape
    the session starts from; its id is the conversation id and the trace id unless
    ``conversation_id`` is given. The tape span carries the session's tape as a store's
    recorder saves it (stored under the conversation id, continuing the start tape), so
    :func:`~tapekit.otel.tapes_from_otlp_json` of the trace gives the stored tape back.

    ``endpoint``/``headers`` configure the standard OTLP/HTTP exporter (default: the
    ``OTEL_EXPORTER_OTLP_*`` environment variables); ``exporter`` replaces it with any
    OpenTelemetry ``SpanExporter``. ``schedule_delay_s`` is how often the worker turns the
    events gathered so far into spans, and how long the batch processor waits to send them.
    """

    def __init__(
        self,
        start: Tape[Any, Any],
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        exporter: SpanExporter | None = None,
        conversation_id: str | None = None,
        service_name: str = "tapekit",
        schedule_delay_s: float = 1.0,
    ) -> None:
        from tapekit.otel._otlp import _otel

        _otel()
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(headers or {}))
        self.conversation_id = conversation_id or start.metadata.id
        self._start = start
        self._resource = Resource.create({"service.name": service_name})
        self._processor = BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_s * 1000)
        self._builder = SpanBuilder(self.conversation_id, self._send, time.time_ns())
        self._tape = start
        self._pending: collections.deque[tuple[int, Any]] = collections.deque()
        self._interval_s = schedule_delay_s
        self._stop = threading.Event()
        self._closed = False
        self._error: BaseException | None = None
        now = time.time_ns()
        for step in start.steps:
            self._builder.feed(step, now)
        self._thread = threading.Thread(target=self._work, name="tapekit-otel", daemon=True)
        self._thread.start()

    def __call__(self, event: Any) -> None:
        """Take one main-loop event (cheap: the work happens in a worker thread)."""
        if self._closed:
            raise RuntimeError("this OtelTracer is closed")
        self._pending.append((time.time_ns(), event))

    def close(self) -> None:
        """Send the remaining spans (the tape's own span last) and stop; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        self._processor.shutdown()
        if self._error is not None:
            raise RuntimeError(f"the OpenTelemetry tracer failed: {self._error}") from self._error

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the worker

    def _work(self) -> None:
        while True:
            closing = self._stop.wait(self._interval_s)
            while self._pending:
                t, event = self._pending.popleft()
                self._guarded(self._handle, event, t)
            if closing:
                self._guarded(self._finish, None, time.time_ns())
                return

    def _guarded(self, work: Any, event: Any, t: int) -> None:
        """Run ``work(event, t)``; a failure is logged and reported by :meth:`close`, never
        raised into the loop."""
        try:
            work(event, t)
        except Exception as e:
            logger.warning("OpenTelemetry tracer failed on %r: %s", event, e)
            self._error = self._error or e

    def _finish(self, _event: Any, t: int) -> None:
        self._builder.finish(self._stored_metadata(), self._tape.context, t)

    def _handle(self, event: Any, t: int) -> None:
        agent_event = getattr(event, "agent_event", None)
        if agent_event is not None and agent_event.llm_call is not None:
            self._builder.add_llm_call(agent_event.llm_call)
        if agent_event is not None and agent_event.step is not None:
            self._builder.feed(agent_event.step, t)
        tape = getattr(event, "tape", None)
        if tape is not None:
            self._tape = tape
            for step in list(tape.steps)[self._builder.n_steps :]:
                self._builder.feed(step, t)

    def _stored_metadata(self) -> Any:
        """The final tape's metadata as a store's recorder saves it under the conversation id."""
        start, tape = self._start, self._tape
        parent = start.metadata.parent_id if self.conversation_id == start.metadata.id else start.metadata.id
        return tape.metadata.model_copy(
            update={
                "id": self.conversation_id,
                "parent_id": parent,
                "n_added_steps": len(tape) - len(start),
            }
        )

    def _send(self, record: SpanRecord) -> None:
        from tapekit.otel._otlp import to_readable

        for span in to_readable([record], self.conversation_id, self._resource):
            self._processor.on_end(span)
