"""HTTP API: the approvals inbox and human decisions (SPEC G2-G5, U2)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from harness.clock import FakeClock
from harness.config import Runtime
from harness.service.app import service_of_app
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    REFUND_L2,
    REFUND_L3,
    client_fixture,
    create,
    key,
    make_client,
    make_runtime,
    runtime_fixture,
)
from tests.acceptance.checks import assert_audit_clean


def _decide(client: TestClient, request_id: str, user: str, **body: object) -> tuple[int, dict[str, object]]:
    response = client.post(
        f"/api/v1/approvals/{request_id}/decision",
        json={"decision": "approve", **body},
        headers=key(user),
        params={"wait": "true"},
    )
    return response.status_code, response.json()


def test_self_confirm_l2_from_the_inbox(client: TestClient, runtime: Runtime) -> None:
    """An L2 request appears in the requester's inbox; their approval resumes the Run to SUCCEEDED."""
    run = create(client, REFUND_L2, "alice")
    assert run["state"] == "AWAITING_HITL" and run["legacy_status"] == "running"
    inbox = client.get("/api/v1/approvals", headers=key("alice")).json()["pending"]
    assert [a["request_id"] for a in inbox] == [run["approval_request_id"]]
    request = inbox[0]
    assert request["level"] == "L2" and request["task"] == REFUND_L2
    assert [a["skill"] for a in request["actions"]][-1] == "refunds.issue"
    status, doc = _decide(client, run["approval_request_id"], "alice", actions_hash=request["actions_hash"])
    assert status == 200 and doc["effect"] == "approved"
    assert doc["run"]["state"] == "SUCCEEDED"  # type: ignore[index]
    assert client.get("/api/v1/approvals", headers=key("alice")).json()["pending"] == []
    assert_audit_clean(runtime)


def test_l3_approver_identity_comes_from_the_credential(client: TestClient, runtime: Runtime) -> None:
    """The requester cannot approve their own L3 request; a support lead can, and the trace names the lead."""
    run = create(client, REFUND_L3, "alice")
    request_id = run["approval_request_id"]
    status, refused = _decide(client, request_id, "alice")
    assert status == 403 and refused["error"] == "decision_refused"
    assert "own L3" in str(refused["detail"])
    status, doc = _decide(client, request_id, "carol", reason="gold customer")
    assert status == 200 and doc["run"]["state"] == "SUCCEEDED"  # type: ignore[index]
    trace = client.get(f"/api/v1/runs/{run['run_id']}/trace", headers=key("alice")).json()
    approvals = [
        r["data"] for r in trace["records"] if r["kind"] == "hitl" and r["data"]["event"] == "approve"
    ]
    assert [a["approver"] for a in approvals] == ["default/carol"]
    refusals = [
        e for e in runtime.store.audit_events(run_id=run["run_id"]) if e.event == "hitl_decision_refused"
    ]
    assert len(refusals) == 1 and refusals[0].actor == "default/alice"
    assert_audit_clean(runtime)


def test_reject_closes_the_run_rejected(client: TestClient) -> None:
    """A reject is final: the Run closes CLOSED_REJECTED and the legacy status is failed."""
    run = create(client, REFUND_L3, "alice")
    status, doc = _decide(client, run["approval_request_id"], "carol", decision="reject", reason="no receipt")
    assert status == 200 and doc["effect"] == "rejected"
    assert doc["run"]["state"] == "CLOSED_REJECTED"  # type: ignore[index]
    assert doc["run"]["legacy_status"] == "failed"  # type: ignore[index]
    status, again = _decide(client, run["approval_request_id"], "carol")
    assert status == 409 and again["error"] == "conflict"


def test_break_glass_needs_the_role_and_a_reason(client: TestClient) -> None:
    """Break-glass is refused without the role or without a reason, and marked in the trace when used (G5)."""
    run = create(client, REFUND_L3, "alice")
    request_id = run["approval_request_id"]
    assert _decide(client, request_id, "carol", break_glass=True, reason="urgent")[0] == 403
    assert _decide(client, request_id, "dave", break_glass=True, reason="")[0] == 403
    status, doc = _decide(
        client, request_id, "dave", break_glass=True, reason="customer escalation, CEO call"
    )
    assert status == 200 and doc["run"]["state"] == "SUCCEEDED"  # type: ignore[index]
    trace = client.get(f"/api/v1/runs/{run['run_id']}/trace", headers=key("alice")).json()
    assert any(r["kind"] == "hitl" and r["data"]["break_glass"] for r in trace["records"])


def test_other_tenants_cannot_see_or_decide(client: TestClient) -> None:
    """acme's lead neither sees nor decides tenant default's request: 404, as for an unknown id."""
    run = create(client, REFUND_L3, "alice")
    request_id = run["approval_request_id"]
    assert client.get("/api/v1/approvals", headers=key("zoe")).json()["pending"] == []
    assert client.get(f"/api/v1/approvals/{request_id}", headers=key("zoe")).status_code == 404
    status, doc = _decide(client, request_id, "zoe")
    assert status == 404 and doc["error"] == "not_found"
    assert (
        client.get(f"/api/v1/runs/{run['run_id']}", headers=key("alice")).json()["state"] == "AWAITING_HITL"
    )


@pytest.mark.parametrize(
    "body",
    [
        {"decision": "maybe"},
        {"decision": "approve", "approver": "default/carol"},
        {"decision": "approve", "actions_hash": "xyz"},
        {},
        {"decision": "approve", "break_glass": "very"},
    ],
)
def test_malformed_decisions_are_422(client: TestClient, body: dict[str, object]) -> None:
    """Malformed decision bodies — including one naming an approver — are 422, never a decision."""
    run = create(client, REFUND_L3, "alice")
    response = client.post(
        f"/api/v1/approvals/{run['approval_request_id']}/decision", json=body, headers=key("carol")
    )
    assert response.status_code == 422, response.text


def test_a_decision_for_other_actions_is_refused(client: TestClient) -> None:
    """An approval bound to a different actions hash does not count (G4: no replay onto other arguments)."""
    run = create(client, REFUND_L3, "alice")
    status, doc = _decide(client, run["approval_request_id"], "carol", actions_hash="0" * 64)
    assert status == 403 and "actions hash" in str(doc["detail"])


def test_unknown_request_is_404(client: TestClient) -> None:
    """Deciding or reading an unknown request id answers 404."""
    assert client.get("/api/v1/approvals/nope", headers=key("carol")).status_code == 404
    assert _decide(client, "nope", "carol")[0] == 404


def test_approval_timeout_is_default_deny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the deadline passes, the service's housekeeping closes the Run CLOSED_REJECTED (G3)."""
    clock = FakeClock()
    rt = make_runtime(tmp_path, monkeypatch, clock=clock)
    try:
        with make_client(rt) as c:
            run = create(c, REFUND_L3, "alice")
            clock.advance(86_400 + 1)
            deadline = time.monotonic() + 10
            doc = run
            while doc["state"] != "CLOSED_REJECTED" and time.monotonic() < deadline:
                time.sleep(0.05)  # the housekeeping loop, not this request, applies the timeout
                doc = c.get(f"/api/v1/runs/{run['run_id']}", headers=key("alice")).json()
            assert doc["state"] == "CLOSED_REJECTED"
            assert "TIMEOUT" in doc["path"]
            assert c.get("/api/v1/approvals", headers=key("carol")).json()["pending"] == []
    finally:
        rt.close()


def test_a_run_created_or_approved_while_the_service_stops_stays_queued_for_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests answered while the service stops (its worker stopped, the lifespan not yet over): a new Run
    is accepted (202, CREATED) and an approval is recorded (200), nothing is refused, the stopped worker is
    not started again, and the next service drives both Runs to SUCCEEDED."""
    clock = FakeClock()
    rt = make_runtime(tmp_path, monkeypatch, clock=clock)
    try:
        with make_client(rt) as c:
            parked = create(c, REFUND_L2, "alice")
            assert parked["state"] == "AWAITING_HITL"
            service_of_app(c.app).worker.stop()  # what the lifespan's shutdown does first
            created = c.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers=key("alice"))
            assert created.status_code == 202, created.text
            assert created.json()["state"] == "CREATED"
            decided = c.post(f"/api/v1/approvals/{parked['approval_request_id']}/decision",
                             json={"decision": "approve"}, headers=key("alice"))
            assert decided.status_code == 200 and decided.json()["effect"] == "approved", decided.text
            assert not [t.name for t in threading.enumerate()
                        if t.name.startswith(("harness-drives", "harness-housekeeping"))]
            run_ids = [created.json()["run_id"], parked["run_id"]]
            states = [rt.runs.result(r).state for r in run_ids]
            assert states[0] == "CREATED" and states[1] not in ("AWAITING_HITL", "SUCCEEDED"), states
        clock.advance(rt.settings.redrive_grace_s + 1)
        with make_client(rt) as c:  # the next service picks both up as it starts
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and {rt.runs.result(r).state for r in run_ids} != {"SUCCEEDED"}:
                time.sleep(0.05)
            assert [rt.runs.result(r).state for r in run_ids] == ["SUCCEEDED", "SUCCEEDED"]
        assert_audit_clean(rt)
    finally:
        rt.close()
