"""Reconcile after a prune, on SQLite, PostgreSQL and MariaDB: the spend totals keep counting what pruned
Runs spent, and reconcile balances them against the live costs plus what the prune kept of the pruned
ones (archived_costs), so it stays OK after `harness archive` and still names a tampered total."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import sqlalchemy as sa

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.retention import RetentionStore
from harness.adapters.sql.store import SqlStore
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.reconcile import reconcile
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.domain.records import NewRun
from harness.domain.traces import CostTrace
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState
from harness.retention.archiver import Archiver
from harness.retention.policy import DAY_S, RetentionPolicy
from harness.retention.storage import LocalSegmentStore

S = RunState


def costly_run(machine: StateMachine, user: str, usd: float) -> str:
    """A Run that records two LLM costs while it executes, then succeeds."""
    run, _ = cast(SqlStore, machine.store).create_run(NewRun("acme", user, "s1", {"task": "t"}))
    state = S.CREATED
    ledger = CostLedger(machine.store)  # type: ignore[arg-type]
    for target in (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING):
        if target is S.TRACING:
            for part in (usd, usd / 3):
                ledger.record(CostTrace(run_id=run.run_id, source="llm:fake:plan", input_tokens=10,
                                        output_tokens=5, usd=part, tenant_id="acme", user_id=user))
        machine.transition(run.run_id, state, target, actor="test", reason=f"to {target}")
        state = target
    return run.run_id


def test_reconcile_stays_ok_after_a_prune_and_still_names_a_tampered_total(backend_url: str,
                                                                            tmp_path: Path) -> None:
    """Two Runs with costs reconcile; after an archive pass prunes both they still reconcile (their costs
    are in archived_costs); a spend total changed by hand afterwards is a spend_totals MISMATCH."""
    clock = FakeClock()
    store = SqlStore.open(backend_url, clock)
    machine = StateMachine(store)
    runs = [costly_run(machine, "ana", 0.25), costly_run(machine, "bo", 0.5)]
    store.drain_all()
    cpdir = tmp_path / "checkpoints"
    publish_checkpoint(SqlAuditReads(store), cpdir)
    before = reconcile(SqlReconcileReads(store))
    assert before.ok, before.to_dict()
    clock.advance(40 * DAY_S)
    archiver = Archiver(RetentionStore(store), LocalSegmentStore(tmp_path / "archive"), cpdir,
                        policy=RetentionPolicy(days=30))
    report = archiver.run()
    assert report.pruned_runs == 2 and report.kept == [], report
    assert all(RetentionStore(store).archived(r) is not None for r in runs)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM costs")).scalar_one() == 0
        kept = conn.execute(sa.text("SELECT user_id, cost_count FROM archived_costs ORDER BY user_id")).all()
    assert [(u, int(n)) for u, n in kept] == [("ana", 2), ("bo", 2)]
    after = reconcile(SqlReconcileReads(store))
    assert after.ok, after.to_dict()
    assert verify_chain(SqlAuditReads(store), cpdir).ok
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE spend_totals SET usd = usd + 1 WHERE tenant_id = 'acme' AND user_id = 'bo'"))
    tampered = reconcile(SqlReconcileReads(store))
    assert not tampered.ok
    assert tampered.counts["spend_totals"] == 1
    assert [(m.check, "'bo'" in m.detail) for m in tampered.mismatches] == [("spend_totals", True)]
    store.close()
