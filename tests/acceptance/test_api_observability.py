"""Observability: OpenTelemetry spans per step, LLM and tool call; JSON logs with run_id (SPEC U4)."""

from __future__ import annotations

import io
import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harness.config import Runtime
from harness.service.logs import JsonFormatter, TextFormatter
from harness.service.telemetry import Telemetry, run_root_span_id
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    REFUND_L3,
    create,
    key,
    make_client,
    make_runtime,
    runtime_fixture,
)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    """Finished spans, kept in memory."""
    return InMemorySpanExporter()


def _spans_of(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    trace_id = uuid.UUID(run_id).int
    return [
        s for s in exporter.get_finished_spans() if s.context is not None and s.context.trace_id == trace_id
    ]


def test_spans_for_steps_llm_and_tools(runtime: Runtime, exporter: InMemorySpanExporter) -> None:
    """One Run yields a root span, a span per step, a GenAI chat span and an execute_tool span per call,
    all in the trace whose id is the run id."""
    with make_client(runtime, telemetry=Telemetry(exporter)) as c:
        run = create(c, ORDER_STATUS)
    spans = _spans_of(exporter, run["run_id"])
    names = [s.name for s in spans]
    for step in ("create_run", "assemble_context", "plan", "policy", "tools", "trace"):
        assert f"harness.step {step}" in names
    root = next(s for s in spans if s.name == "invoke_agent harness")
    assert root.context is not None and root.context.span_id == run_root_span_id(run["run_id"])
    assert root.attributes is not None and root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["harness.final_state"] == "SUCCEEDED"
    chat = next(s for s in spans if s.name.startswith("chat "))
    assert chat.attributes is not None and chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.usage.input_tokens"] > 0  # type: ignore[operator]
    plan_step = next(s for s in spans if s.name == "harness.step plan")
    assert chat.parent is not None and plan_step.context is not None
    assert chat.parent.span_id == plan_step.context.span_id
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert {s.attributes["gen_ai.tool.name"] for s in tools if s.attributes} == {"orders.lookup", "notes.add"}
    executing = next(s for s in spans if s.name == "harness.step tools")
    assert executing.context is not None
    assert all(s.parent is not None and s.parent.span_id == executing.context.span_id for s in tools)
    assert all(
        s.parent is not None and s.parent.span_id == root.context.span_id
        for s in spans
        if s.name.startswith("harness.step")
    )


def test_a_run_resumed_elsewhere_stays_in_one_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: InMemorySpanExporter
) -> None:
    """A Run planned by one service and approved through another (a restart) lands in the same trace."""
    first = make_runtime(tmp_path, monkeypatch)
    with make_client(first, telemetry=Telemetry(exporter)) as c:
        run = create(c, REFUND_L3)
    first.close()
    second = make_runtime(tmp_path, monkeypatch)
    other = InMemorySpanExporter()
    with make_client(second, telemetry=Telemetry(other)) as c:
        c.post(
            f"/api/v1/approvals/{run['approval_request_id']}/decision",
            json={"decision": "approve"},
            headers=key("carol"),
            params={"wait": "true"},
        )
    second.close()
    before, after = _spans_of(exporter, run["run_id"]), _spans_of(other, run["run_id"])
    assert {s.name for s in before} >= {"harness.step plan", "harness.step policy"}
    assert {s.name for s in after} >= {"harness.step tools", "invoke_agent harness"}


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """Everything the harness loggers write, formatted as JSON lines."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("harness")
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield buffer
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_json_logs_carry_the_run_id(runtime: Runtime, json_log: io.StringIO) -> None:
    """Every log line about a Run (state changes, worker, requests) is a JSON object with its run_id."""
    with make_client(runtime) as c:
        run = create(c, ORDER_STATUS)
        c.get(f"/api/v1/runs/{run['run_id']}", headers=key("alice"))
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    changes = [r for r in lines if r["message"] == "state changed"]
    assert [r["to"] for r in changes] == run["path"][1:]
    assert {r["run_id"] for r in changes} == {run["run_id"]}
    assert any(r["message"] == "run stopped" and r["run_id"] == run["run_id"] for r in lines)
    reads = [r for r in lines if r["message"] == "request" and r.get("route") == "/api/v1/runs/{run_id}"]
    assert reads and reads[0]["run_id"] == run["run_id"] and reads[0]["status"] == 200
    assert all({"time", "level", "logger"} <= set(r) for r in lines)


def test_request_log_lines_carry_method_path_status_duration_and_run_id(runtime: Runtime) -> None:
    """Every request's log line, as text and as JSON, names its method, path, status and duration, and the
    run id when the path names a Run."""
    buffers = {"text": io.StringIO(), "json": io.StringIO()}
    handlers = []
    for name, formatter in (("text", TextFormatter()), ("json", JsonFormatter())):
        handler = logging.StreamHandler(buffers[name])
        handler.setFormatter(formatter)
        handlers.append(handler)
    log = logging.getLogger("harness.service")
    old_level = log.level
    for handler in handlers:
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with make_client(runtime) as c:
            run = create(c, ORDER_STATUS)
            assert c.get(f"/api/v1/runs/{run['run_id']}", headers=key("alice")).status_code == 200
            assert c.get("/api/v1/runs/no-such-run", headers=key("alice")).status_code == 404
    finally:
        for handler in handlers:
            log.removeHandler(handler)
        log.setLevel(old_level)
    text = [line for line in buffers["text"].getvalue().splitlines() if " harness.service request " in line]
    read = next(line for line in text if f"path=/api/v1/runs/{run['run_id']} " in line)
    assert " INFO harness.service request method=GET " in read and " status=200 " in read
    assert re.search(r" duration_ms=\d+(\.\d+)? ", read) and f" run_id={run['run_id']}" in read
    assert any("path=/api/v1/runs/no-such-run " in line and " status=404 " in line for line in text)
    docs = [json.loads(line) for line in buffers["json"].getvalue().splitlines()]
    doc = next(d for d in docs if d["message"] == "request" and d["path"] == f"/api/v1/runs/{run['run_id']}")
    assert doc["method"] == "GET" and doc["status"] == 200 and doc["run_id"] == run["run_id"]
    assert isinstance(doc["duration_ms"], float | int)
