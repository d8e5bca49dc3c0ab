"""Span records to OpenTelemetry spans, OTLP JSON both ways, and the export of stored tapes."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapekit.core import Tape, TapeMetadata
from tapekit.llm.base import LLMCall
from tapekit.otel._build import STEP_EVENT, SpanBuilder, SpanRecord, span_id, trace_id

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter

    from tapekit.store.base import TapeStore


SEMCONV_VERSION = "1.41.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
_NS = 1_000_000_000


def _otel() -> Any:
    """The SDK's trace module, or an ImportError that says which extra to install."""
    try:
        import google.protobuf  # type: ignore[import-untyped]  # noqa: F401  (OTLP encoding, JSON)
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
        import opentelemetry.sdk.trace as sdk_trace
    except ImportError as e:
        raise ImportError(
            f"the OpenTelemetry export needs the otel extra (pip install 'tapekit[otel]'): {e}"
        ) from None
    return sdk_trace


# ---------------------------------------------------------------------------- building spans


def step_times(tape: Tape[Any, Any], llm_calls: Mapping[str, LLMCall], base_ns: int) -> list[int]:
    """When each step was made, as well as a stored tape tells: the steps of a node run with an
    LLM call at the call's end; other steps at the time of the step before them (the first ones
    at the first known time, or ``base_ns`` when no step has one)."""
    known: list[int | None] = []
    for step in tape.steps:
        call = llm_calls.get(step.metadata.prompt_id) if step.metadata.prompt_id else None
        known.append(int(call.timestamp * _NS) if call is not None else None)
    last = next((t for t in known if t is not None), base_ns)
    times = []
    for t in known:
        last = t if t is not None else last
        times.append(last)
    return times


def tape_span_records(
    tape: Tape[Any, Any],
    llm_calls: Iterable[LLMCall] | Mapping[str, LLMCall] = (),
    *,
    conversation_id: str | None = None,
    base_time: float | None = None,
) -> list[SpanRecord]:
    """The span records of a finished tape (children before their parents, the tape's last).

    ``llm_calls`` are the calls behind its steps (by prompt id, or a list); ``conversation_id``
    defaults to the tape's id; ``base_time`` (unix seconds) dates steps that no LLM call dates.
    """
    calls = dict(llm_calls) if isinstance(llm_calls, Mapping) else {c.prompt.id: c for c in llm_calls}
    base_ns = int((base_time if base_time is not None else time.time()) * _NS)
    times = step_times(tape, calls, base_ns)
    records: list[SpanRecord] = []
    builder = SpanBuilder(conversation_id or tape.metadata.id, records.append, times[0] if times else base_ns)
    for call in calls.values():
        builder.add_llm_call(call)
    for step, t in zip(tape.steps, times, strict=True):
        builder.feed(step, t)
    builder.finish(tape.metadata, tape.context)
    return records


def to_readable(
    records: Sequence[SpanRecord], conversation_id: str, resource: Resource | None = None
) -> list[ReadableSpan]:
    """SDK spans (ready for any ``SpanExporter``) made from span records."""
    sdk_trace = _otel()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    from tapekit._version import __version__

    resource = resource or Resource.create({"service.name": "tapekit"})
    scope = InstrumentationScope("tapekit", __version__, SCHEMA_URL)
    tid = trace_id(conversation_id)
    flags = TraceFlags(TraceFlags.SAMPLED)
    spans = []
    for r in records:
        context = SpanContext(tid, span_id(conversation_id, r.key), is_remote=False, trace_flags=flags)
        parent = None
        if r.parent_key is not None:
            parent = SpanContext(
                tid, span_id(conversation_id, r.parent_key), is_remote=False, trace_flags=flags
            )
        events = [sdk_trace.Event(name, attributes, t) for name, t, attributes in r.events]
        status = Status(StatusCode.ERROR, r.error) if r.error is not None else Status(StatusCode.UNSET)
        spans.append(
            sdk_trace.ReadableSpan(
                r.name,
                context=context,
                parent=parent,
                resource=resource,
                attributes={k: tuple(v) if isinstance(v, list) else v for k, v in r.attributes.items()},
                events=events,
                kind=SpanKind.CLIENT if r.kind == "client" else SpanKind.INTERNAL,
                status=status,
                start_time=r.start_ns,
                end_time=max(r.end_ns, r.start_ns),
                instrumentation_scope=scope,
            )
        )
    return spans


def tape_spans(
    tape: Tape[Any, Any],
    llm_calls: Iterable[LLMCall] | Mapping[str, LLMCall] = (),
    *,
    conversation_id: str | None = None,
    base_time: float | None = None,
    service_name: str = "tapekit",
) -> list[ReadableSpan]:
    """The OpenTelemetry spans of a finished tape (see :func:`tape_span_records`)."""
    from opentelemetry.sdk.resources import Resource

    conversation = conversation_id or tape.metadata.id
    records = tape_span_records(tape, llm_calls, conversation_id=conversation, base_time=base_time)
    return to_readable(records, conversation, Resource.create({"service.name": service_name}))


# ---------------------------------------------------------------------------- OTLP JSON


def _hex_ids(message: dict[str, Any]) -> dict[str, Any]:
    """OTLP JSON writes trace and span ids in hex, where protobuf's JSON mapping has base64."""
    for resource_spans in message.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64decode(span[key]).hex()
    return message


def otlp_json_from_protobuf(data: bytes) -> dict[str, Any]:
    """An OTLP/HTTP protobuf body (``ExportTraceServiceRequest``) as OTLP JSON."""
    _otel()
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(data)
    return _hex_ids(MessageToDict(request))


def tapes_to_otlp_json(
    tapes: Iterable[Tape[Any, Any]],
    llm_calls: Iterable[LLMCall] | Mapping[str, LLMCall] = (),
    *,
    service_name: str = "tapekit",
) -> dict[str, Any]:
    """The tapes as one OTLP JSON ``ExportTraceServiceRequest`` (one trace per tape), encoded by
    OpenTelemetry's own OTLP encoder."""
    _otel()
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    calls = dict(llm_calls) if isinstance(llm_calls, Mapping) else {c.prompt.id: c for c in llm_calls}
    spans = [s for tape in tapes for s in tape_spans(tape, calls, service_name=service_name)]
    return _hex_ids(MessageToDict(encode_spans(spans)))


def _value(any_value: Mapping[str, Any]) -> Any:
    """The Python value of an OTLP JSON ``AnyValue``."""
    if "stringValue" in any_value:
        return any_value["stringValue"]
    if "intValue" in any_value:
        return int(any_value["intValue"])
    if "boolValue" in any_value:
        return bool(any_value["boolValue"])
    if "doubleValue" in any_value:
        return float(any_value["doubleValue"])
    if "arrayValue" in any_value:
        return [_value(v) for v in any_value["arrayValue"].get("values", [])]
    if "kvlistValue" in any_value:
        return _attributes(any_value["kvlistValue"].get("values", []))
    if "bytesValue" in any_value:
        return base64.b64decode(any_value["bytesValue"])
    return None


def _attributes(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items}


def _spans(data: Mapping[str, Any] | str | bytes) -> Iterable[dict[str, Any]]:
    if isinstance(data, bytes | str):
        data = json.loads(data)
    if not isinstance(data, Mapping) or "resourceSpans" not in data:
        raise ValueError("not OTLP JSON: expected an object with 'resourceSpans'")
    for resource_spans in data["resourceSpans"]:
        for scope_spans in resource_spans.get("scopeSpans", []):
            yield from scope_spans.get("spans", [])


def tapes_from_otlp_json(
    data: Mapping[str, Any] | str | bytes, tape_class: type[Tape[Any, Any]] = Tape
) -> list[Tape[Any, Any]]:
    """The tapes in OTLP JSON written by tapekit (one per trace, in the order of their tape
    spans), with their steps, metadata and context exactly as exported.

    Raises ``ValueError`` naming the trace when a tape's steps are not all there (a partial or
    cut export), or when steps have no tape span.
    """
    tapes: dict[str, dict[str, Any]] = {}
    steps: dict[str, dict[int, str]] = {}
    for span in _spans(data):
        trace = span.get("traceId", "")
        attributes = _attributes(span.get("attributes", []))
        if attributes.get("tapekit.span.type") == "tape":
            tapes[trace] = attributes
        for event in span.get("events", []):
            if event.get("name") == STEP_EVENT:
                fields = _attributes(event.get("attributes", []))
                steps.setdefault(trace, {})[int(fields["tapekit.step.index"])] = fields["tapekit.step.json"]
    orphans = sorted(set(steps) - set(tapes))
    if orphans:
        raise ValueError(f"traces {orphans} have tape steps but no tape span (was the export cut short?)")
    out = []
    for trace, attributes in tapes.items():
        found = steps.get(trace, {})
        n_steps = int(attributes["tapekit.tape.n_steps"])
        missing = [i for i in range(n_steps) if i not in found]
        if missing or len(found) != n_steps:
            raise ValueError(
                f"trace {trace}: the tape has {n_steps} steps but the spans hold steps "
                f"{sorted(found)[:20]}; missing {missing[:20]}"
            )
        metadata = TapeMetadata.model_validate_json(attributes["tapekit.tape.metadata"])
        context = json.loads(attributes["tapekit.tape.context"])
        step_data = [json.loads(found[i]) for i in range(n_steps)]
        out.append(tape_class.model_validate({"metadata": metadata, "context": context, "steps": step_data}))
    return out


def llm_calls_from_otlp_json(data: Mapping[str, Any] | str | bytes) -> list[LLMCall]:
    """The LLM calls recorded in the ``chat`` spans of OTLP JSON written by tapekit, once each
    (tapes that share a history share its calls)."""
    calls: dict[str, LLMCall] = {}
    for span in _spans(data):
        attributes = _attributes(span.get("attributes", []))
        if attributes.get("tapekit.span.type") == "llm_call":
            call = LLMCall.model_validate_json(attributes["tapekit.llm_call"])
            calls.setdefault(call.prompt.id, call)
    return list(calls.values())


# ---------------------------------------------------------------------------- exporting


def write_otlp_json(
    source: TapeStore | Iterable[Tape[Any, Any]],
    path: str | Path,
    tape_ids: Iterable[str] | None = None,
    *,
    llm_calls: Iterable[LLMCall] | Mapping[str, LLMCall] = (),
    service_name: str = "tapekit",
) -> int:
    """Write tapes (a store's, all or ``tape_ids``; or the tapes given, with their
    ``llm_calls``) to ``path`` as one OTLP JSON document; returns how many tapes.
    :func:`tapes_from_otlp_json` reads it back."""
    _otel()
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": service_name})
    spans: list[ReadableSpan] = []
    n = 0
    for tape, calls, created in _tapes_of(source, tape_ids, llm_calls):
        records = tape_span_records(tape, calls, base_time=created)
        spans.extend(to_readable(records, tape.metadata.id, resource))
        n += 1
    document = _hex_ids(MessageToDict(encode_spans(spans)))
    Path(path).write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    return n


def export_tapes_otlp(
    source: TapeStore | Iterable[Tape[Any, Any]],
    endpoint: str | None = None,
    *,
    tape_ids: Iterable[str] | None = None,
    llm_calls: Iterable[LLMCall] | Mapping[str, LLMCall] = (),
    headers: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
    service_name: str = "tapekit",
    timeout_s: float = 10.0,
    batch_size: int = 512,
) -> int:
    """Send tapes as GenAI spans with the standard OTLP/HTTP exporter; returns how many spans.

    ``source`` is a tape store (all its tapes, or ``tape_ids``; the LLM calls come from the
    store and each tape's creation time dates the steps no call dates) or tapes (with their
    ``llm_calls``). ``endpoint`` is the traces URL (``http://host:4318/v1/traces``; default:
    the ``OTEL_EXPORTER_OTLP_*`` environment variables, else localhost); ``exporter`` replaces
    the OTLP exporter (any OpenTelemetry ``SpanExporter``). Raises ``RuntimeError`` naming the
    endpoint if the collector refuses a batch.
    """
    _otel()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SpanExportResult

    own = exporter is None
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(headers or {}), timeout=timeout_s)
    resource = Resource.create({"service.name": service_name})
    sent = 0
    try:
        pending: list[ReadableSpan] = []
        for tape, calls, created in _tapes_of(source, tape_ids, llm_calls):
            records = tape_span_records(tape, calls, base_time=created)
            pending.extend(to_readable(records, tape.metadata.id, resource))
            while len(pending) >= batch_size:
                sent += _send(exporter, pending[:batch_size], endpoint, SpanExportResult.SUCCESS)
                pending = pending[batch_size:]
        if pending:
            sent += _send(exporter, pending, endpoint, SpanExportResult.SUCCESS)
    finally:
        if own:
            exporter.shutdown()
    return sent


def _send(exporter: SpanExporter, spans: list[ReadableSpan], endpoint: str | None, ok: Any) -> int:
    if exporter.export(spans) != ok:
        where = endpoint or "the endpoint set by OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (or localhost:4318)"
        raise RuntimeError(f"the OTLP exporter could not send {len(spans)} spans to {where}")
    return len(spans)


def _tapes_of(
    source: TapeStore | Iterable[Tape[Any, Any]],
    tape_ids: Iterable[str] | None,
    llm_calls: Iterable[LLMCall] | Mapping[str, LLMCall],
) -> Iterable[tuple[Tape[Any, Any], dict[str, LLMCall], float | None]]:
    from tapekit.store.base import TapeStore

    if isinstance(source, TapeStore):
        if isinstance(tape_ids, str):
            raise TypeError("tape_ids must be a list of ids, not a string")
        ids = list(tape_ids) if tape_ids is not None else list(reversed(source.list_tapes()))
        for tape_id in ids:
            tape = source.get_tape(tape_id)
            calls = {}
            for prompt_id in dict.fromkeys(s.metadata.prompt_id for s in tape.steps if s.metadata.prompt_id):
                call = source.get_llm_call(prompt_id)
                if call is not None:
                    calls[prompt_id] = call
            yield tape, calls, source.get_tape_info(tape_id).created
        return
    if tape_ids is not None:
        raise TypeError("tape_ids selects tapes of a store; pass the tapes themselves instead")
    calls = dict(llm_calls) if isinstance(llm_calls, Mapping) else {c.prompt.id: c for c in llm_calls}
    for tape in source:
        if not isinstance(tape, Tape):
            raise TypeError(f"export_tapes_otlp needs a TapeStore or Tapes, got a {type(tape).__name__}")
        yield tape, calls, None
