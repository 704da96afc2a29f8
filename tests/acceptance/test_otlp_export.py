"""Spans exported over OTLP/HTTP (SPEC U4, `--otel otlp`) reach a collector, tested against a local
server that speaks the collector's wire protocol: protobuf ExportTraceServiceRequest on /v1/traces."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from harness.config import Runtime
from harness.service.telemetry import Telemetry, run_root_span_id
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    create,
    make_client,
    runtime_fixture,
)


class Collector:
    """A loopback OTLP/HTTP trace receiver that keeps what it was sent, decoded."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)  # a malformed body fails the test's assertions below
                received.requests.append(request)
                received.content_types.append(self.headers.get("Content-Type", ""))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET address
        return f"http://{host}:{port}/v1/traces"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        out: list[tuple[dict[str, Any], Any]] = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope_spans.spans)
        return out


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.thread.start()
    yield c
    c.server.shutdown()
    c.server.server_close()


def _attributes(span: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        values[a.key] = getattr(a.value, kind) if kind else None
    return values


def test_a_runs_spans_reach_an_otlp_collector(runtime: Runtime, collector: Collector,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`--otel otlp`: the Run's root, step, chat and tool spans arrive as OTLP protobuf, in the trace
    whose id is the run id, with the service's resource and the GenAI attributes."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.endpoint)
    telemetry = Telemetry.from_setting("otlp")
    assert telemetry is not None
    with make_client(runtime, telemetry=telemetry) as c:
        run = create(c, ORDER_STATUS)
    telemetry.shutdown()  # flushes the batch processor (the service's lifespan does this on exit too)
    trace_id = uuid.UUID(run["run_id"]).bytes
    spans = [(resource, s) for resource, s in collector.spans() if s.trace_id == trace_id]
    assert spans, "no span of the Run reached the collector"
    assert set(collector.content_types) == {"application/x-protobuf"}
    assert {resource["service.name"] for resource, _ in spans} == {"harness-kernel"}
    by_name = {s.name: s for _, s in spans}
    for step in ("create_run", "assemble_context", "plan", "policy", "tools", "trace"):
        assert f"harness.step {step}" in by_name
    root = by_name["invoke_agent harness"]
    assert int.from_bytes(root.span_id, "big") == run_root_span_id(run["run_id"])
    assert _attributes(root)["harness.final_state"] == "SUCCEEDED"
    chat = next(s for name, s in by_name.items() if name.startswith("chat "))
    assert _attributes(chat)["gen_ai.operation.name"] == "chat"
    assert chat.parent_span_id == by_name["harness.step plan"].span_id
    tools = {_attributes(s)["gen_ai.tool.name"] for _, s in spans if s.name.startswith("execute_tool ")}
    assert tools == {"orders.lookup", "notes.add"}


def test_a_collector_that_is_down_does_not_stop_a_run(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Telemetry never blocks a Run: with nothing listening at the endpoint the Run still succeeds and
    shutting telemetry down returns once the exporter gives up."""
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as probe:
        port = probe.server_address[1]  # a loopback port that nothing listens on once this closes
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    telemetry = Telemetry.from_setting("otlp")
    assert telemetry is not None
    with make_client(runtime, telemetry=telemetry) as c:
        run = create(c, ORDER_STATUS)
    telemetry.shutdown()
    assert run["state"] == "SUCCEEDED"
