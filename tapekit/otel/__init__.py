"""OpenTelemetry export of tapes (extra ``otel``): GenAI semantic-convention spans, live or from a store.

Each tape is one trace, its id the trace id and the ``gen_ai.conversation.id``:

- ``invoke_agent {root}``: the tape (its metadata and context as attributes);
- ``invoke_agent {agent}``: each subagent run, from its ``Call`` to its ``Respond``, nested by
  the agent hierarchy;
- ``invoke_agent {agent}.{node}``: each node run, with its steps as span events (the step's
  full JSON) and their ids in ``tapekit.step_ids``;
- ``chat {model}``: each LLM call, inside its node run (model, token usage, finish reason, and
  the whole call as JSON);
- ``execute_tool {tool}``: each tool call, from the ``ToolCall`` to its ``ToolResult``.

:class:`OtelTracer` sends the spans while a session runs; :func:`export_tapes_otlp` sends
stored tapes; :func:`write_otlp_json` writes them to a file; :func:`tapes_to_otlp_json` and
:func:`tapes_from_otlp_json` convert both ways
without loss. The attribute names follow the GenAI semantic conventions
:data:`SEMCONV_VERSION` (status: development). The OpenTelemetry packages are imported only
when a function needs them.
"""

from tapekit.otel._build import SpanBuilder, SpanRecord, finish_reason
from tapekit.otel._live import OtelTracer
from tapekit.otel._otlp import (
    SEMCONV_VERSION,
    export_tapes_otlp,
    llm_calls_from_otlp_json,
    otlp_json_from_protobuf,
    tape_span_records,
    tape_spans,
    tapes_from_otlp_json,
    tapes_to_otlp_json,
    write_otlp_json,
)

__all__ = [
    "SEMCONV_VERSION",
    "OtelTracer",
    "SpanBuilder",
    "SpanRecord",
    "export_tapes_otlp",
    "finish_reason",
    "llm_calls_from_otlp_json",
    "otlp_json_from_protobuf",
    "tape_span_records",
    "tape_spans",
    "tapes_from_otlp_json",
    "tapes_to_otlp_json",
    "write_otlp_json",
]
