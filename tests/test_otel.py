# ruff: noqa: E402  (the OTel imports come after the skip when the extra is missing)
"""OpenTelemetry export: GenAI spans from tapes (live and stored), OTLP JSON round trips, and a
real OTLP/HTTP receiver on 127.0.0.1 that decodes what the standard exporter sends."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

NEEDS = "the OTel tests need the otel extra (pip install 'tapekit[otel]')"
pytest.importorskip("opentelemetry.sdk", reason=NEEDS)
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason=NEEDS)

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tapekit import (
    Agent,
    AssistantThought,
    FunctionLLM,
    LLMCall,
    LLMOutput,
    LLMStream,
    Node,
    Prompt,
    SetNextNode,
    StopStep,
    Tape,
    ToolCallRequest,
    ToolEnvironment,
    ToolResult,
    UserStep,
    async_main_loop,
    main_loop,
    tool_calls_from_output,
    view_to_messages,
)
from tapekit.core import new_id
from tapekit.otel import (
    SEMCONV_VERSION,
    OtelTracer,
    export_tapes_otlp,
    llm_calls_from_otlp_json,
    otlp_json_from_protobuf,
    tape_span_records,
    tapes_from_otlp_json,
    tapes_to_otlp_json,
)
from tapekit.store import SQLiteStore
from tests.test_fork import nested_team

# ----------------------------------------------------------------------------- sessions to export


class Weather(BaseModel):
    """A typed tape context."""

    city: str
    units: str = "metric"


class ToolUse(Node):
    """Asks the LLM with the tools; tool calls loop back to this node."""

    name: str = "act"

    def make_prompt(self, agent: Agent, tape: Tape[Any, Any]) -> Prompt:
        return Prompt(messages=view_to_messages(tape.steps), tools=agent.templates["tools"])

    def generate_steps(self, agent: Agent, tape: Tape[Any, Any], llm_stream: LLMStream) -> Iterator[Any]:
        output = llm_stream.get_output()
        if output.tool_calls:
            yield SetNextNode(next_node="act")
            yield from tool_calls_from_output(output)
        else:
            yield AssistantThought(content=output.content or "")
            yield StopStep(reason="done")


def temperature(city: str) -> float:
    """Today's temperature in a city."""
    if city == "Atlantis":
        raise KeyError("no such city")
    return 21.5


def forecaster(prompt: Prompt) -> LLMOutput:
    if prompt.messages[-1]["role"] == "user":
        calls = [
            ToolCallRequest(id="t1", name="temperature", arguments=json.dumps({"city": "Paris"})),
            ToolCallRequest(id="t2", name="temperature", arguments=json.dumps({"city": "Atlantis"})),
        ]
        return LLMOutput(tool_calls=calls)
    return LLMOutput(content="Paris: " + prompt.messages[-2]["content"])


ENV = ToolEnvironment([temperature])


def tool_agent() -> Agent:
    llm = FunctionLLM(fn=forecaster, model_name="forecast-1")
    return Agent.create("weather", llms=llm, nodes=[ToolUse()], templates={"tools": ENV.tool_schemas()})


def tool_start() -> Tape[Any, Any]:
    return Tape(context=Weather(city="Paris"), steps=[UserStep(content="weather?")])


async def run(
    agent: Agent, start: Tape[Any, Any], record: Any = None, store: Any = None
) -> tuple[Tape[Any, Any], list[LLMCall]]:
    calls, final = [], start
    async for event in async_main_loop(agent, start, ENV, store=store):
        if record is not None:
            record(event)
        if event.agent_event is not None and event.agent_event.llm_call is not None:
            calls.append(event.agent_event.llm_call)
        if event.tape is not None:
            final = event.tape
    return final, calls


def sessions() -> tuple[list[Tape[Any, Any]], list[LLMCall]]:
    """A tool-using session (typed context, a failing tool, a result) and a nested team with forks."""
    weather, calls1 = asyncio.run(run(tool_agent(), tool_start()))
    weather = weather.with_metadata(result={"answer": "21.5", "score": 1.0})
    team, calls2 = asyncio.run(run(nested_team(), Tape(steps=[UserStep(content="go")])))
    broken = team.with_metadata(id=new_id(), error="RuntimeError: model down (in node lead.merge)")
    return [weather, team, broken], calls1 + calls2


# ----------------------------------------------------------------------------- round trips


def test_tape_to_otlp_json_to_tape_is_lossless() -> None:
    tapes, calls = sessions()
    data = json.loads(json.dumps(tapes_to_otlp_json(tapes, calls)))  # through JSON text, as a file would
    back = tapes_from_otlp_json(data)
    assert [t.model_dump() for t in back] == [t.model_dump() for t in tapes]
    assert back[0].context == {"city": "Paris", "units": "metric"}
    assert back[0].metadata.result == {"answer": "21.5", "score": 1.0}
    assert back[2].metadata.error == tapes[2].metadata.error
    assert [type(s) for s in back[1].steps] == [type(s) for s in tapes[1].steps]
    typed = tapes_from_otlp_json(data, tape_class=Tape[Weather, Any])  # type: ignore[misc]
    assert typed[0].context == Weather(city="Paris")
    got = {c.prompt.id: c for c in llm_calls_from_otlp_json(data)}
    assert len(got) == len(calls) and all(got[c.prompt.id] == c for c in calls)


def test_partial_or_foreign_data_is_refused_with_the_reason() -> None:
    tapes, calls = sessions()
    data = tapes_to_otlp_json(tapes[:1], calls)
    spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    tool_span = next(s for s in spans if s["name"] == "execute_tool temperature")
    spans.remove(tool_span)
    with pytest.raises(ValueError, match=r"the tape has 8 steps but .* missing \[4\]"):
        tapes_from_otlp_json(data)
    root = next(s for s in spans if not s.get("parentSpanId"))
    spans.remove(root)
    with pytest.raises(ValueError, match="no tape span"):
        tapes_from_otlp_json(data)
    with pytest.raises(ValueError, match="not OTLP JSON"):
        tapes_from_otlp_json({"spans": []})


# ----------------------------------------------------------------------------- span layout


def test_spans_follow_the_genai_conventions_and_the_agent_hierarchy() -> None:
    tapes, calls = sessions()
    weather, team = tapes[0], tapes[1]
    spans = tapes_to_otlp_json([weather, team], calls)["resourceSpans"][0]["scopeSpans"]
    assert spans[0]["scope"]["name"] == "tapekit"
    assert SEMCONV_VERSION in spans[0]["schemaUrl"]
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for span in spans[0]["spans"]:
        by_trace.setdefault(span["traceId"], []).append(span)
    assert set(by_trace) == {weather.metadata.id, team.metadata.id}  # the tape id is the trace id

    def attrs(span: dict[str, Any]) -> dict[str, Any]:
        return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}

    w = {s["name"]: s for s in by_trace[weather.metadata.id]}
    assert set(w) == {
        "invoke_agent weather",
        "invoke_agent weather.act",
        "chat forecast-1",
        "execute_tool temperature",
    }
    root = w["invoke_agent weather"]
    assert "parentSpanId" not in root or not root["parentSpanId"]
    assert attrs(root)["gen_ai.conversation.id"] == weather.metadata.id
    assert attrs(root)["gen_ai.operation.name"] == "invoke_agent"
    assert root["kind"] == "SPAN_KIND_INTERNAL"
    chats = [s for s in by_trace[weather.metadata.id] if s["name"] == "chat forecast-1"]
    assert len(chats) == 2
    chat = attrs(chats[0])
    assert chat["gen_ai.operation.name"] == "chat" and chat["gen_ai.request.model"] == "forecast-1"
    assert chat["gen_ai.response.finish_reasons"] == {"values": [{"stringValue": "tool_call"}]}
    assert "gen_ai.usage.input_tokens" in chat and "gen_ai.usage.output_tokens" in chat
    assert chats[0]["kind"] == "SPAN_KIND_CLIENT"
    runs = {s["spanId"]: s for s in by_trace[weather.metadata.id] if s["name"] == "invoke_agent weather.act"}
    assert chats[0]["parentSpanId"] in runs and len(runs) == 2
    first_run = attrs(runs[chats[0]["parentSpanId"]])
    call_steps = [s for s in weather.steps if s.metadata.prompt_id == first_run["tapekit.prompt_id"]]
    assert first_run["tapekit.step_ids"] == {"values": [{"stringValue": s.metadata.id} for s in call_steps]}
    tools = [s for s in by_trace[weather.metadata.id] if s["name"] == "execute_tool temperature"]
    assert len(tools) == 2
    ok, failed = sorted(tools, key=lambda s: attrs(s)["gen_ai.tool.call.id"])
    assert attrs(ok)["gen_ai.tool.call.result"] == "21.5" and attrs(ok)["gen_ai.tool.name"] == "temperature"
    assert failed["status"]["code"] == "STATUS_CODE_ERROR" and "no such city" in failed["status"]["message"]
    assert ok["parentSpanId"] == root["spanId"]
    # the team: subagent runs nest by the agent hierarchy, node runs inside their agent's run
    t = by_trace[team.metadata.id]
    ids = {s["spanId"]: s for s in t}
    mid_runs = [s for s in t if s["name"] == "invoke_agent lead/mid"]
    leaf_runs = [s for s in t if s["name"] == "invoke_agent lead/mid/leaf"]
    assert len(mid_runs) == 3 and len(leaf_runs) == 6
    assert all(ids[s["parentSpanId"]]["name"] == "invoke_agent lead" for s in mid_runs)
    assert all(ids[s["parentSpanId"]] in mid_runs for s in leaf_runs)
    leaf_nodes = [s for s in t if s["name"] == "invoke_agent lead/mid/leaf.leaf"]
    assert len(leaf_nodes) == 6 and all(ids[s["parentSpanId"]] in leaf_runs for s in leaf_nodes)
    assert all(int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]) for s in t)


def test_stored_tapes_are_dated_by_their_llm_calls() -> None:
    tapes, calls = sessions()
    weather = tapes[0]
    records = tape_span_records(weather, calls, base_time=1.0)
    chats = [r for r in records if r.name.startswith("chat ")]
    by_prompt = {c.prompt.id: c for c in calls}
    for chat in chats:
        call = by_prompt[chat.attributes["tapekit.prompt_id"]]
        assert chat.end_ns == int(call.timestamp * 1e9)
        assert chat.start_ns == int((call.timestamp - call.latency_s) * 1e9)
    root = records[-1]
    assert root.start_ns <= min(c.start_ns for c in chats) and root.end_ns >= max(c.end_ns for c in chats)


# ----------------------------------------------------------------------------- over OTLP/HTTP


class Receiver:
    """A tiny OTLP/HTTP trace receiver on 127.0.0.1: keeps each POST /v1/traces body."""

    def __init__(self, status: int = 200) -> None:
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces" and status == 200:
                    owner.bodies.append(body)
                    owner.content_types.append(self.headers["Content-Type"])
                self.send_response(status if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[Any]:
        out: list[Any] = []
        for body in self.bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            out.extend(s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
        return out

    def json(self) -> dict[str, Any]:
        merged: dict[str, Any] = {"resourceSpans": []}
        for body in self.bodies:
            merged["resourceSpans"].extend(otlp_json_from_protobuf(body)["resourceSpans"])
        return merged


def test_export_from_the_store_over_otlp_http(tmp_path: Path) -> None:
    tapes, calls = sessions()
    with SQLiteStore(tmp_path / "tapes.db") as store:
        for tape in tapes:
            store.save_tape(tape)
        for call in calls:
            store.save_llm_call(call)
        with Receiver() as receiver:
            n = export_tapes_otlp(store, receiver.url, batch_size=20)
        stored = [store.get_tape(t.metadata.id) for t in tapes]
    assert receiver.content_types and set(receiver.content_types) == {"application/x-protobuf"}
    assert len(receiver.bodies) > 1  # sent in batches
    spans = receiver.spans()
    assert len(spans) == n
    names = [s.name for s in spans]
    assert names.count("chat forecast-1") == 2 and names.count("execute_tool temperature") == 2
    chat = next(s for s in spans if s.name == "chat forecast-1")
    attributes = {a.key: a.value for a in chat.attributes}
    assert attributes["gen_ai.request.model"].string_value == "forecast-1"
    assert chat.trace_id.hex() == tapes[0].metadata.id
    back = {t.metadata.id: t for t in tapes_from_otlp_json(receiver.json())}
    assert [back[t.metadata.id].model_dump() for t in stored] == [t.model_dump() for t in stored]


def test_live_tracing_of_a_running_session(tmp_path: Path) -> None:
    start = tool_start()
    with Receiver() as receiver, SQLiteStore(tmp_path / "live.db") as store:
        with OtelTracer(start, receiver.url, schedule_delay_s=0.05) as trace:
            final, _ = asyncio.run(run(tool_agent(), start, trace, store=store))
        stored = store.get_tape(start.metadata.id)
    assert final.metadata.error is None
    spans = receiver.spans()
    assert {s.trace_id.hex() for s in spans} == {start.metadata.id}
    assert sorted(s.name for s in spans) == sorted(
        ["invoke_agent weather", "invoke_agent weather.act", "invoke_agent weather.act"]
        + ["chat forecast-1"] * 2
        + ["execute_tool temperature"] * 2
    )
    (live,) = tapes_from_otlp_json(receiver.json())
    assert live.model_dump() == stored.model_dump()  # the live trace holds the stored session
    assert [s.llm_dict() for s in live.steps] == [s.llm_dict() for s in final.steps]
    results = [s for s in live.steps if isinstance(s, ToolResult)]
    assert results[0].content == 21.5 and "no such city" in (results[1].error or "")


def test_live_tracing_with_the_sync_loop_and_a_team() -> None:
    with Receiver() as receiver:
        start: Tape[Any, Any] = Tape(steps=[UserStep(content="go")])
        with OtelTracer(start, receiver.url) as trace:
            for event in main_loop(nested_team(), start, ENV):
                trace(event)
                if event.tape is not None:
                    final = event.tape
        with pytest.raises(RuntimeError, match="closed"):
            trace(None)
    (live,) = tapes_from_otlp_json(receiver.json())
    assert [s.model_dump() for s in live.steps] == [s.model_dump() for s in final.steps]
    names = [s.name for s in receiver.spans()]
    assert names.count("invoke_agent lead/mid/leaf") == 6 and names.count("chat function") == 14


def test_a_refusing_collector_is_named() -> None:
    tapes, calls = sessions()
    with (
        Receiver(status=400) as receiver,
        pytest.raises(RuntimeError, match=r"could not send 7 spans to http://127\.0\.0\.1"),
    ):
        export_tapes_otlp(tapes[:1], receiver.url, llm_calls=calls, timeout_s=2)
    with pytest.raises(TypeError, match="tape_ids selects tapes of a store"):
        export_tapes_otlp(tapes, "http://127.0.0.1:9/v1/traces", tape_ids=["x"])


def test_cli_export_writes_otlp_json(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tapekit.cli import app

    tapes, calls = sessions()
    with SQLiteStore(tmp_path / "cli.db") as store:
        for tape in tapes:
            store.save_tape(tape)
        for call in calls:
            store.save_llm_call(call)
    out = tmp_path / "spans.json"
    result = CliRunner().invoke(
        app, ["export", "--db", str(tmp_path / "cli.db"), "--format", "otlp", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    back = {t.metadata.id: t for t in tapes_from_otlp_json(json.loads(out.read_text()))}
    assert set(back) == {t.metadata.id for t in tapes}
    assert [s.llm_dict() for s in back[tapes[1].metadata.id].steps] == [s.llm_dict() for s in tapes[1].steps]
    assert len(llm_calls_from_otlp_json(out.read_text())) == len(calls)
