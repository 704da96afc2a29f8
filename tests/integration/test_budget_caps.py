"""Budget caps stop Runs, on SQLite, PostgreSQL and MariaDB (SPEC G1): a plan whose estimate would take the
Run or its tenant past a cap is rejected at the policy check before any of its steps runs, and a tenant
whose Runs (by several users) spent its cap gets its next Run refused before the model is called, while
another tenant goes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.settings import Settings
from tests.conftest import FIXTURES


def capped(backend_url: str, tmp_path: Path, clock: FakeClock, budgets: dict[str, float]) -> Runtime:
    """The test skills, priced scripted model and Cedar rules on the backend under test, with only `budgets`
    as the policy's caps."""
    policy = yaml.safe_load((FIXTURES / "policy.yaml").read_text())
    policy["budgets"] = budgets
    policy["permissions"]["cedar"] = str(FIXTURES / "policies.cedar")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    return build_runtime(Settings(db=backend_url, skills_dirs=(FIXTURES / "skills",),
                                  policy_file=tmp_path / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                                  identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data",
                                  memory="off"), clock=clock)


def caller(tenant: str, user: str) -> dict[str, Any]:
    return {"tenant_id": tenant, "user_id": user, "roles": ["tester"]}


def skill_calls(call_log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in call_log.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("scope", ["run", "tenant"])
def test_a_plan_over_the_cap_is_rejected_before_its_steps_run(backend_url: str, tmp_path: Path, clock: FakeClock,
                                                              call_log: Path, scope: str) -> None:
    """A plan estimated at 0.05 USD under a 0.04 USD cap on the Run (or on its tenant) ends CLOSED_REJECTED
    through REJECTED, the error naming the cap's rule, and its skill never runs; under a 1 USD cap the same
    task succeeds, so it is the cap that stopped it."""
    rt = capped(backend_url, tmp_path, clock, {f"per_{scope}_usd": 0.04})
    try:
        done = rt.runs.create_run({"task": "expensive", **caller("t1", "tess")})
        assert done.state == "CLOSED_REJECTED", done.error
        assert list(done.path)[-3:] == ["REJECTED", "TRACING", "CLOSED_REJECTED"]
        assert f"budget.per_{scope}" in (done.error or "") and "exceeds cap 0.04" in (done.error or "")
        assert skill_calls(call_log) == []
    finally:
        rt.close()
    roomy = capped(backend_url, tmp_path, clock, {f"per_{scope}_usd": 1.0})
    try:
        assert roomy.runs.create_run({"task": "expensive", **caller("t1", "tess")}).state == "SUCCEEDED"
    finally:
        roomy.close()


def test_a_tenant_that_spent_its_cap_gets_its_next_run_refused(backend_url: str, tmp_path: Path, clock: FakeClock,
                                                               call_log: Path) -> None:
    """Runs by three users of one tenant spend towards its 0.03 USD cap until a Run is refused before its
    model call (CLOSED_FAILED, `budget_exceeded: budget.per_tenant`, the call not made); so is the next
    Run of a user who spent nothing, while a Run of another tenant succeeds. The tenant's spend never
    passes the cap."""
    rt = capped(backend_url, tmp_path, clock, {"per_tenant_usd": 0.03})
    try:
        users = ["ana", "bo", "cy"]
        states = []
        for i in range(30):
            states.append(rt.runs.create_run({"task": "chatty", **caller("t1", users[i % 3])}).state)
            if states[-1] != "SUCCEEDED":
                break
        assert states.count("SUCCEEDED") >= 3 and states[-1] == "CLOSED_FAILED", states
        fresh = rt.runs.create_run({"task": "chatty", **caller("t1", "dee")})
        assert fresh.state == "CLOSED_FAILED"
        assert (fresh.error or "").startswith("budget_exceeded: budget.per_tenant")
        assert "the call was not made" in (fresh.error or "")
        assert not [r for r in rt.store.trace_of(fresh.run_id) if r.kind == "llm"]
        spent = rt.runs.ledger.spent(tenant_id="t1")
        assert 0.03 * 0.5 < spent <= 0.03
        assert rt.runs.create_run({"task": "chatty", **caller("t2", "eve")}).state == "SUCCEEDED"
        assert len(skill_calls(call_log)) == states.count("SUCCEEDED") + 1
    finally:
        rt.close()
