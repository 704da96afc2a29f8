"""Costs (seed 004 §3.6 CostTrace, SPEC G1, A1): a Run with a planning call, an LLM-as-tool call, a
sandboxed call and a child Run carries the right total in its RunTrace, the API, the console and the CLI,
and reconcile checks it; the cost view groups the same costs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.audit.reconcile import reconcile
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.records import TraceRecordIn
from harness.domain.traces import cost_fields
from harness.settings import Settings

from .api_helpers import make_client

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
TESS_KEY = "t1-tess-api-key-0123"
OPS_KEY = "t1-olga-api-key-0123"
SKILLS = '''
def say(args, ctx):
    return dict(args)

def crunch(args, ctx):
    total = 0
    for i in range(200000):
        total += i
    return {"total": total}
'''
MANIFESTS: dict[str, dict[str, Any]] = {
    "test.say": {"entrypoint": "skills.py:say"},
    "test.crunch": {"entrypoint": "skills.py:crunch", "sandbox": True},
    "test.summarise": {"kind": "llm", "prompt": "Summarise: {text}"},
    "test.delegate": {"kind": "agent", "prompt": "say {text}", "timeout_s": 60},
}


def _step(step_id: str, skill: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": step_id, "tool_call": {"skill": skill, "arguments": arguments}, "output_key": step_id}


RULES = {"rules": [
    {"name": "say", "when": "^say (?P<text>.+)$", "purpose": "plan",
     "plan": {"steps": [_step("a", "test.say", {"text": "{text}"})], "answer_template": "{a.text}"}},
    {"name": "summary", "when": "^Summarise", "purpose": "tool", "reply": "a short summary"},
    {"name": "everything", "when": "^everything$", "purpose": "plan", "plan": {
        "steps": [_step("s", "test.summarise", {"text": "the quarter"}), _step("c", "test.crunch", {}),
                  _step("d", "test.delegate", {"text": "hello"})],
        "answer_template": "{s.text} / {d.answer}"}},
], "pricing": {"input_per_1k_usd": 0.01, "output_per_1k_usd": 0.03}}


def cost_runtime(tmp_path: Path, clock: FakeClock | None = None) -> Runtime:
    """A runtime whose "everything" task plans, calls an LLM as a tool, a sandboxed skill and a child Run."""
    skills = tmp_path / "skills"
    skills.mkdir(exist_ok=True)
    (skills / "skills.py").write_text(SKILLS)
    for skill_id, extra in MANIFESTS.items():
        manifest = {"id": skill_id, "version": "1.0.0", "input_schema": {"type": "object"},
                    "risk": {"access": "read"}, "timeout_s": 30, **extra}
        (skills / f"{skill_id.split('.')[1]}.yaml").write_text(yaml.safe_dump(manifest))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(RULES))
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump({"sandbox_per_s": 0.5}))
    identities = {"identities": {"t1/tess": {"roles": ["tester"], "api_key_sha256": hashlib.sha256(
        TESS_KEY.encode()).hexdigest()}, "t1/lee": {"roles": ["tester", "lead"]},
        "t1/olga": {"roles": ["operator"], "api_key_sha256": hashlib.sha256(OPS_KEY.encode()).hexdigest()}}}
    (tmp_path / "identities.yaml").write_text(yaml.safe_dump(identities))
    return build_runtime(Settings(
        db=str(tmp_path / "costs.db"), skills_dirs=(skills,), policy_file=FIXTURES / "policy.yaml",
        llm_rules=tmp_path / "rules.yaml", identities_file=tmp_path / "identities.yaml",
        data_dir=tmp_path / "data", llm_pricing=tmp_path / "prices.yaml"), clock=clock)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    runtime = cost_runtime(tmp_path)
    yield runtime
    runtime.close()


def cost_rows(rt: Runtime) -> list[dict[str, Any]]:
    with rt.store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(t.costs).order_by(t.costs.c.id))]


def test_a_runs_total_counts_every_cost_of_it_and_its_child_everywhere(rt: Runtime, tmp_path: Path) -> None:
    """Planning, LLM-as-tool, sandboxed seconds and the child Run's planning all count: the RunTrace, the
    API, the console, `harness runs show` and the cost view show one total, and reconcile agrees."""
    result = rt.runs.create_run({"task": "everything", **TESS})
    assert result.state == "SUCCEEDED", result.error
    rows = cost_rows(rt)
    child = next(r["run_id"] for r in rows if r["run_id"] != result.run_id)
    assert sorted((r["run_id"] == child, r["source"].split(":")[0], r["skill_id"] or "") for r in rows) == [
        (False, "llm", ""), (False, "llm", "test.summarise"), (False, "sandbox", "test.crunch"), (True, "llm", "")]
    assert all(r["parent_run_id"] == result.run_id for r in rows if r["run_id"] == child)
    sandboxed = next(r for r in rows if r["source"].startswith("sandbox"))
    assert sandboxed["sandbox_s"] > 0 and sandboxed["usd"] == pytest.approx(sandboxed["sandbox_s"] * 0.5, abs=1e-8)
    assert json.loads(sandboxed["unit_price"])["sandbox_per_s"] == 0.5
    usd = sum(r["usd"] for r in rows)
    assert usd > sandboxed["usd"] > 0
    rt.store.drain_all()
    run_trace = next(r.data() for r in rt.store.trace_of(result.run_id) if r.kind == "run")
    total = run_trace["total_cost"]
    assert total["v"] == 2 and total["usd"] == pytest.approx(usd, abs=1e-8)
    assert (total["api_calls"], total["costs"], total["children"]) == (3, 4, 1)
    assert total["input_tokens"] == sum(r["input_tokens"] for r in rows)
    assert total["sandbox_s"] == pytest.approx(sandboxed["sandbox_s"], abs=1e-6)
    records = [cost_fields(r.data()) for r in rt.store.trace_of(result.run_id) if r.kind == "cost"]
    assert {r["v"] for r in records} == {2} and sum(r["api_calls"] for r in records) == 2
    report = reconcile(SqlReconcileReads(rt.store))
    assert report.ok and report.counts["run_cost_total"] == 0, report.to_dict()

    with make_client(rt) as client:
        headers = {"X-API-Key": TESS_KEY}
        doc = client.get(f"/api/v1/runs/{result.run_id}", headers=headers)
        assert doc.status_code == 200, doc.text
        assert doc.json()["cost"]["usd"] == pytest.approx(usd, abs=1e-8) and doc.json()["cost"]["children"] == 1
        client.post("/ui/login", data={"api_key": TESS_KEY, "next": f"/ui/runs/{result.run_id}"})
        page = client.get(f"/ui/runs/{result.run_id}")
        assert page.status_code == 200 and f'data-usd="{total["usd"]}"' in page.text
        view = client.get("/api/v1/costs", params={"group_by": "skill"}, headers=headers).json()
        assert view["total_usd"] == pytest.approx(usd, abs=1e-8)
        assert {g["key"] for g in view["groups"]} == {"(planning)", "test.summarise", "test.crunch"}
        metrics = client.get("/metrics", headers={"X-API-Key": OPS_KEY}).text
        sandbox_line = f'harness_cost_usd_total{{skill="test.crunch",tenant="t1"}} {sandboxed["usd"]!r}'
        assert sandbox_line in metrics, [m for m in metrics.splitlines() if m.startswith("harness_cost_usd")]
        assert 'harness_cost_api_calls_total{skill="(planning)",tenant="t1"} 2.0' in metrics
    shown = subprocess.run([sys.executable, "-m", "harness.cli", "runs", "show", result.run_id, "--db",
                            str(tmp_path / "costs.db"), "--json"], capture_output=True, text=True, check=True)
    cli_cost = json.loads(shown.stdout)["cost"]
    assert cli_cost["usd"] == pytest.approx(usd, abs=1e-8) and cli_cost["children"] == 1
    by_skill = {g.key: g for g in rt.runs.ledger.by_group("skill", tenant_id="t1")}
    assert set(by_skill) == {"(planning)", "test.summarise", "test.crunch"}
    assert sum(g.usd for g in by_skill.values()) == pytest.approx(usd, abs=1e-8)


def test_reconcile_finds_a_run_total_that_is_not_the_sum_of_its_costs(rt: Runtime) -> None:
    """A cost slipped in under a closed Run, dated before its close, makes reconcile name that Run; one
    recorded after the close (a call still running when the Run was cancelled) is only counted apart."""
    result = rt.runs.create_run({"task": "say hi", **TESS})
    rt.store.drain_all()
    assert reconcile(SqlReconcileReads(rt.store)).ok
    closed_at = rt.store.get_run(result.run_id).last_state_change_at
    row = {"run_id": result.run_id, "tenant_id": "t1", "user_id": "tess", "source": "llm:x:tool",
           "input_tokens": 5, "output_tokens": 5, "usd": 0.25, "api_calls": 1}
    with rt.store.engine.begin() as conn:
        conn.execute(t.costs.insert(), {**row, "at": closed_at + 5})
    late = reconcile(SqlReconcileReads(rt.store))
    assert late.counts["run_cost_total"] == 0 and late.info["costs_after_close"] == 1
    with rt.store.engine.begin() as conn:
        conn.execute(t.costs.insert(), {**row, "at": closed_at - 1})
    report = reconcile(SqlReconcileReads(rt.store))
    assert not report.ok and report.counts["run_cost_total"] == 1
    bad = next(m for m in report.mismatches if m.check == "run_cost_total")
    assert bad.run_id == result.run_id and "usd" in bad.detail


def test_version_1_cost_records_still_read_and_verify(rt: Runtime) -> None:
    """A chain holding CostTraces of the first shape (no version, no API calls), with their costs rows as
    that version wrote them, verifies and reads as priced costs with no API calls."""
    from harness.adapters.sql.ledger import CostLedger
    from harness.audit.verify import verify_chain
    from harness.domain.traces import CostTrace

    result = rt.runs.create_run({"task": "say hi", **TESS})
    old = {"source": "llm:scripted:plan", "input_tokens": 3, "output_tokens": 4, "usd": 0.5, "tenant_id": "t1",
           "user_id": "tess"}
    row = CostTrace(run_id=result.run_id, api_calls=0, **old)
    with rt.store.engine.begin() as conn:
        CostLedger(rt.store).insert(conn, row)
        rt.store.enqueue(conn, [TraceRecordIn("cost", old, result.run_id)], rt.store.clock.now())
    rt.store.drain_all()
    report = verify_chain(SqlAuditReads(rt.store))
    assert report.ok, [str(p) for p in report.problems]
    fields = cost_fields(old)
    assert fields["v"] == 1 and fields["api_calls"] == 0 and fields["priced"] is True and fields["skill_id"] is None
    assert reconcile(SqlReconcileReads(rt.store)).counts["run_cost_total"] == 0


def test_the_cost_view_groups_by_tenant_user_skill_and_day(rt: Runtime) -> None:
    """The same costs summed four ways give the same total, and a date range narrows them."""
    rt.runs.create_run({"task": "everything", **TESS})
    rt.runs.create_run({"task": "say hi", "tenant_id": "t1", "user_id": "lee", "roles": ["tester"]})
    totals = {g: sum(x.usd for x in rt.runs.ledger.by_group(g, tenant_id="t1"))
              for g in ("tenant", "user", "skill", "day")}
    assert len({round(v, 8) for v in totals.values()}) == 1
    users = {g.key: g.runs for g in rt.runs.ledger.by_group("user", tenant_id="t1")}
    assert users == {"tess": 2, "lee": 1}
    days = rt.runs.ledger.by_group("day", tenant_id="t1")
    assert len(days) == 1 and len(days[0].key) == 10
    assert rt.runs.ledger.by_group("user", tenant_id="t1", since=rt.store.clock.now() + 60) == []
    assert rt.runs.ledger.by_group("user", tenant_id="t2") == []
