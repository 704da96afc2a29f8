"""HTTP API: creating, reading, listing, cancelling and tracing Runs (SPEC U2, K5, K6)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from harness.config import Runtime
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    REFUND_L3,
    REFUND_TOO_BIG,
    client_fixture,
    create,
    key,
    runtime_fixture,
)
from tests.acceptance.checks import assert_audit_clean

MAIN_PATH = ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK", "EXECUTING", "TRACING", "SUCCEEDED"]


def test_create_run_and_wait_reaches_succeeded(client: TestClient, runtime: Runtime) -> None:
    """A Run created over HTTP runs in the embedded worker and reports its path, answer and legacy status."""
    response = client.post(
        "/api/v1/runs", json={"task": ORDER_STATUS}, headers=key("alice"), params={"wait": "true"}
    )
    assert response.status_code == 202
    doc = response.json()
    assert response.headers["location"] == f"/api/v1/runs/{doc['run_id']}"
    assert doc["state"] == "SUCCEEDED" and doc["path"] == MAIN_PATH
    assert doc["legacy_status"] == "done" and doc["phase"] == "final"
    assert doc["answer"].startswith("Order A-1001 is")
    assert (doc["tenant_id"], doc["user_id"]) == ("default", "alice")
    assert doc["transitions"][-1]["duration_s"] == 0.0
    assert all(t["duration_s"] >= 0 for t in doc["transitions"])
    assert doc["cost"]["input_tokens"] > 0
    assert_audit_clean(runtime)


def test_a_run_works_for_a_team_its_caller_belongs_to_and_no_other(client: TestClient, runtime: Runtime) -> None:
    """create_run carries the caller's team (the identity directory's `teams`) into the stored request and
    the Run document; naming a team the caller is not a member of is a 403 and creates nothing."""
    created = client.post("/api/v1/runs", json={"task": ORDER_STATUS, "team_id": "support-eu"},
                          headers=key("alice"), params={"wait": "true"})
    assert created.status_code == 202, created.text
    doc = created.json()
    assert doc["team_id"] == "support-eu"
    assert runtime.store.get_run(doc["run_id"]).request["team_id"] == "support-eu"
    before = len(client.get("/api/v1/runs", headers=key("carol")).json()["runs"])
    refused = client.post("/api/v1/runs", json={"task": ORDER_STATUS, "team_id": "support-eu"}, headers=key("carol"))
    assert refused.status_code == 403 and "not a member of team 'support-eu'" in refused.json()["detail"]
    assert len(client.get("/api/v1/runs", headers=key("carol")).json()["runs"]) == before


def test_create_returns_a_durable_id_before_the_run_finishes(client: TestClient, runtime: Runtime) -> None:
    """Without wait, the id comes back at once and the Run already exists in the store (K5)."""
    response = client.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers=key("alice"))
    assert response.status_code == 202
    run_id = response.json()["run_id"]
    assert runtime.store.get_run(run_id).run_id == run_id
    final = client.get(f"/api/v1/runs/{run_id}", headers=key("alice"), params={"wait": "true"}).json()
    assert final["state"] == "SUCCEEDED"


def test_idempotency_key_returns_the_existing_run(client: TestClient) -> None:
    """A repeated submit with the same idempotency key returns the same Run with 200, not a new one (K5)."""
    body = {"task": ORDER_STATUS, "idempotency_key": "order-1001-status"}
    first = client.post("/api/v1/runs", json=body, headers=key("alice"))
    second = client.post("/api/v1/runs", json=body, headers=key("alice"))
    assert (first.status_code, second.status_code) == (202, 200)
    assert first.json()["run_id"] == second.json()["run_id"]


@pytest.mark.parametrize(
    "body",
    [
        {"task": ORDER_STATUS, "tenant_id": "acme"},
        {"task": ORDER_STATUS, "user_id": "dave"},
        {"task": ORDER_STATUS, "roles": ["support_lead"]},
    ],
)
def test_identity_cannot_come_from_the_body(client: TestClient, body: dict[str, object]) -> None:
    """Tenant, user and roles come only from the credential: a body naming them is refused (U2)."""
    response = client.post("/api/v1/runs", json=body, headers=key("alice"))
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "JSON"),
        ("[]", "body"),
        ('{"task": ""}', "task"),
        ('{"task": "   "}', "task"),
        ('{"task": 42}', "task"),
        ('{"task": "x", "token_budget": 1}', "token_budget"),
        ('{"task": "x", "history": [{"role": "robot", "content": "hi"}]}', "history"),
        ('{"task": "x", "retry_of": "no-such-run"}', "retry_of"),
    ],
)
def test_malformed_create_bodies_are_clear_422s(client: TestClient, content: str, why: str) -> None:
    """Malformed create bodies get a 422 naming the problem, never a 500."""
    response = client.post(
        "/api/v1/runs", content=content, headers={**key("alice"), "Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert why in response.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/runs/{id}"),
        ("POST", "/api/v1/runs/{id}/cancel"),
        ("GET", "/api/v1/runs/{id}/trace"),
        ("GET", "/api/v1/runs/{id}/events"),
        ("GET", "/jobs/{id}"),
    ],
)
def test_unknown_and_foreign_runs_are_404(client: TestClient, method: str, path: str) -> None:
    """An unknown id and another tenant's Run both answer 404, so ids do not leak across tenants."""
    run_id = create(client, ORDER_STATUS, "alice")["run_id"]
    for who, target in (("alice", "00000000-0000-0000-0000-000000000000"), ("zoe", run_id)):
        response = client.request(method, path.format(id=target), headers=key(who))
        assert response.status_code == 404, (who, response.text)
        assert response.json()["error"] == "not_found"


def test_lists_are_tenant_scoped_and_filterable(client: TestClient) -> None:
    """A tenant lists only its own Runs, newest first, filtered by state and paginated."""
    ok = create(client, ORDER_STATUS, "alice")["run_id"]
    rejected = create(client, REFUND_TOO_BIG, "bob")["run_id"]
    create(client, ORDER_STATUS, "zoe")
    listed = client.get("/api/v1/runs", headers=key("alice")).json()["runs"]
    assert [r["run_id"] for r in listed] == [rejected, ok]
    assert listed[0]["legacy_status"] == "failed" and listed[0]["state"] == "CLOSED_REJECTED"
    only = client.get("/api/v1/runs", headers=key("alice"), params={"state": "SUCCEEDED"}).json()["runs"]
    assert [r["run_id"] for r in only] == [ok]
    page = client.get("/api/v1/runs", headers=key("alice"), params={"limit": 1}).json()
    after = client.get("/api/v1/runs", headers=key("alice"), params={"before": page["next_before"]}).json()
    assert [r["run_id"] for r in page["runs"] + after["runs"]] == [rejected, ok]
    assert client.get("/api/v1/runs", headers=key("alice"), params={"state": "NOPE"}).status_code == 422


def test_cancel_a_waiting_run(client: TestClient, runtime: Runtime) -> None:
    """The requester cancels a Run waiting for approval: it closes CLOSED_CANCELLED through TRACING."""
    run_id = create(client, REFUND_L3, "alice")["run_id"]
    assert client.post(f"/api/v1/runs/{run_id}/cancel", headers=key("bob")).status_code == 403
    response = client.post(
        f"/api/v1/runs/{run_id}/cancel", json={"reason": "customer withdrew"}, headers=key("alice")
    )
    assert response.status_code == 200
    doc = response.json()
    assert doc["state"] == "CLOSED_CANCELLED" and doc["path"][-3:] == [
        "CANCELLED",
        "TRACING",
        "CLOSED_CANCELLED",
    ]
    assert doc["transitions"][-3]["reason"] == "customer withdrew"
    assert client.post(f"/api/v1/runs/{run_id}/cancel", headers=key("alice")).status_code == 409
    assert (
        client.post(f"/api/v1/runs/{run_id}/cancel", json={"reason": ""}, headers=key("alice")).status_code
        == 422
    )
    assert_audit_clean(runtime)


def test_operator_may_cancel_any_run_of_the_tenant(client: TestClient) -> None:
    """An operator cancels someone else's Run; the transition names the operator as the actor."""
    run_id = create(client, REFUND_L3, "alice")["run_id"]
    doc = client.post(f"/api/v1/runs/{run_id}/cancel", headers=key("operator")).json()
    assert doc["state"] == "CLOSED_CANCELLED"
    assert any(t["actor"] == "default/operator" for t in doc["transitions"])


def test_trace_is_chained_and_grouped_by_step(client: TestClient) -> None:
    """The trace endpoint returns the chained records and the same records under the eight steps."""
    run_id = create(client, ORDER_STATUS, "alice")["run_id"]
    doc = client.get(f"/api/v1/runs/{run_id}/trace", headers=key("alice")).json()
    assert doc["state"] == "SUCCEEDED"
    kinds = {r["kind"] for r in doc["records"]}
    assert {"transition", "policy", "tool", "cost", "run", "audit"} <= kinds and "step" not in kinds
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == [
        "create_run",
        "assemble_context",
        "load_skills",
        "plan",
        "policy",
        "tools",
        "trace",
    ]
    assert {r["kind"] for r in steps["tools"]["records"]} >= {"tool"}
    # every step's StepTrace is its summary, read from the transition that ended the step
    assert all(s["summary"]["status"] == "ok" and len(s["summary"]["input_hash"]) == 64 for s in steps.values())
    assert steps["create_run"]["records"] == [] and steps["create_run"]["summary"]["step"] == 1
    (policy,) = [r["data"] for r in steps["policy"]["records"] if r["kind"] == "policy"]
    assert policy["decision"] == "pass" and policy["level"] == "L1"
    # every verdict passed at L1: counted, under the rule set's hash, none listed
    assert policy["verdicts"] == [] and policy["passed"] >= 5 and len(policy["rules"]) == 64
    seqs = [r["seq"] for r in doc["records"]]
    assert seqs == sorted(seqs)
