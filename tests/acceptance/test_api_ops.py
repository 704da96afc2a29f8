"""HTTP API operations: legacy job view, audit checks, health, metrics, OpenAPI (SPEC K6, K8, A3, U2)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harness.clock import FakeClock
from harness.config import Runtime
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    REFUND_L3,
    REFUND_TOO_BIG,
    client_fixture,
    create,
    key,
    make_client,
    make_runtime,
    runtime_fixture,
)

OPERATOR = key("operator")


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    raise AssertionError(f"no sample {name} in metrics")


@pytest.mark.parametrize(
    ("task", "status", "snapshot"),
    [
        (ORDER_STATUS, "done", "SUCCEEDED"),
        (REFUND_L3, "running", "AWAITING_HITL"),
        (REFUND_TOO_BIG, "failed", "CLOSED_REJECTED"),
    ],
)
def test_legacy_job_view(client: TestClient, task: str, status: str, snapshot: str) -> None:
    """GET /jobs/<id> shows one of the four legacy statuses and the live state as run_state_snapshot (K6)."""
    run = create(client, task)
    doc = client.get(f"/jobs/{run['run_id']}", headers=key("alice")).json()
    assert (doc["job_id"], doc["status"], doc["run_state_snapshot"]) == (run["run_id"], status, snapshot)


def test_audit_verify_and_reconcile_are_clean_after_runs(client: TestClient) -> None:
    """After Runs of every outcome, the chain verifies and the final-state counts reconcile."""
    for task in (ORDER_STATUS, REFUND_TOO_BIG):
        create(client, task)
    verify = client.get("/api/v1/audit/verify", headers=OPERATOR)
    reconcile = client.get("/api/v1/audit/reconcile", headers=OPERATOR)
    assert verify.status_code == reconcile.status_code == 200
    assert verify.json()["ok"] is True and verify.json()["report"]["records_checked"] > 0
    assert reconcile.json()["ok"] is True


def test_audit_verify_reports_a_tampered_record(client: TestClient, runtime: Runtime) -> None:
    """An edited trace record makes verify answer ok=false and name the first bad record."""
    create(client, ORDER_STATUS)
    runtime.store.drain_all()
    with runtime.store.engine.begin() as conn:
        for (name,) in conn.execute(
            sa.text("SELECT name FROM sqlite_master WHERE type='trigger' AND tbl_name='trace_records'")
        ).all():
            conn.execute(sa.text(f'DROP TRIGGER "{name}"'))
        conn.execute(
            sa.text("UPDATE trace_records SET payload = replace(payload, 'alice', 'mallory') WHERE seq = 2")
        )
    doc = client.get("/api/v1/audit/verify", headers=OPERATOR).json()
    assert doc["ok"] is False
    assert doc["report"]["first_bad"]["seq"] == 2


def test_health(client: TestClient) -> None:
    """Health says the database answers and shows the worker's load."""
    doc = client.get("/health", headers=key("alice")).json()
    assert doc["status"] == "ok" and doc["database"] == "ok"
    assert doc["worker"]["threads"] >= 1 and doc["worker"]["in_flight"] == 0


def test_metrics_count_runs_transitions_and_approvals(client: TestClient) -> None:
    """Metrics show Runs by state, transitions applied here, pending approvals and the cancel ratio."""
    create(client, ORDER_STATUS)
    waiting = create(client, REFUND_L3)
    create(client, REFUND_L3)
    client.post(f"/api/v1/runs/{waiting['run_id']}/cancel", headers=key("alice"))
    response = client.get("/metrics", headers=OPERATOR)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert _metric(text, 'harness_runs{state="SUCCEEDED"}') == 1
    assert _metric(text, 'harness_runs{state="AWAITING_HITL"}') == 1
    assert _metric(text, 'harness_runs{state="CLOSED_CANCELLED"}') == 1
    assert _metric(text, 'harness_transitions_total{from_state="TRACING",to_state="SUCCEEDED"}') == 1
    assert _metric(text, "harness_hitl_pending") == 1
    assert _metric(text, "harness_hitl_oldest_wait_seconds") >= 0
    assert _metric(text, "harness_cancel_ratio") == 0.5
    assert _metric(text, "harness_trace_backlog") >= 0
    deadline = time.monotonic() + 10  # the drives end a moment after their Runs park or close
    while _metric(text, "harness_drives") and time.monotonic() < deadline:
        time.sleep(0.05)
        text = client.get("/metrics", headers=OPERATOR).text
    assert _metric(text, "harness_drives") == 0 and _metric(text, "harness_drives_queued") == 0
    for lane in ("local", "sandbox", "llm"):
        assert _metric(text, f'harness_lane_calls_running{{lane="{lane}"}}') == 0
        assert _metric(text, f'harness_lane_calls_queued{{lane="{lane}"}}') == 0
    assert (
        'harness_http_request_duration_seconds_count{method="POST",route="/api/v1/runs",status="202"}' in text
    )


def test_zombie_count_uses_the_state_thresholds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Run left in CREATED past 30 s, and one waiting past its approval deadline, count as zombies."""
    clock = FakeClock()
    rt = make_runtime(tmp_path, monkeypatch, clock=clock)
    try:
        with make_client(rt, housekeeping_interval_s=3600) as c:
            create(c, REFUND_L3)
            rt.runs.submit({"task": ORDER_STATUS, "user_id": "alice"})  # accepted, never driven
            fresh = c.get("/metrics", headers=OPERATOR).text
            assert _metric(fresh, 'harness_zombie_runs{state="CREATED"}') == 0
            clock.advance(31)
            text = c.get("/metrics", headers=OPERATOR).text
            assert _metric(text, 'harness_zombie_runs{state="CREATED"}') == 1
            assert _metric(text, 'harness_zombie_runs{state="AWAITING_HITL"}') == 0
            clock.advance(86_400)
            text = c.get("/metrics", headers=OPERATOR).text
            assert _metric(text, 'harness_zombie_runs{state="AWAITING_HITL"}') == 1
    finally:
        rt.close()


def test_openapi_document_describes_every_endpoint(client: TestClient) -> None:
    """The OpenAPI document lists the endpoints of SPEC U2 and both credential styles."""
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    for path in (
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/cancel",
        "/api/v1/runs/{run_id}/trace",
        "/api/v1/runs/{run_id}/events",
        "/api/v1/approvals",
        "/api/v1/approvals/{request_id}/decision",
        "/jobs/{job_id}",
        "/api/v1/audit/verify",
        "/api/v1/audit/reconcile",
        "/health",
        "/metrics",
    ):
        assert path in paths, path
    schemes = doc["components"]["securitySchemes"]
    assert {s["type"] for s in schemes.values()} == {"apiKey", "http"}
    assert "tenant_id" not in doc["components"]["schemas"]["CreateRunBody"]["properties"]
