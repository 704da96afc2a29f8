"""`reconcile` (SPEC K8, K6): Runs agree with their audit events, transitions and legacy job rows."""

from __future__ import annotations

import pytest

from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import ReconcileReport, reconcile
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState
from tests.integration.test_tamper import drive, raw

S = RunState
MIX = {
    "succeeded": (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING),
    "rejected": (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.REJECTED),
    "hitl_timeout": (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.TIMEOUT),
    "failed": (S.PREPARING, S.PLANNING, S.FAILED),
    "exec_timeout": (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TIMEOUT),
    "cancelled": (S.PREPARING, S.CANCELLED),
    "awaiting": (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL),
    "created": (),
}
AUDIT_INSERT = ("INSERT INTO audit_events (event_id, run_id, event, actor, detail, at) "
                "VALUES (:id, :run, :event, 'intruder', '{}', 0)")


@pytest.fixture
def runs(machine: StateMachine) -> dict[str, str]:
    """One Run down each closing path, plus Runs still in flight."""
    return {name: drive(machine, path) for name, path in MIX.items()}


def offenders(report: ReconcileReport) -> set[tuple[str, str | None]]:
    """(check, run_id) of every listed mismatch."""
    return {(m.check, m.run_id) for m in report.mismatches}


def test_a_mix_of_runs_reconciles(store: SqlStore, runs: dict[str, str]) -> None:
    """After Runs close down every path, each final state's count equals its audit events' count."""
    report = reconcile(SqlReconcileReads(store))
    assert report.ok, report.to_dict()
    counts = {f.state: (f.runs, f.events) for f in report.finals}
    assert counts == {"SUCCEEDED": (1, 1), "CLOSED_REJECTED": (2, 2), "CLOSED_FAILED": (2, 2),
                      "CLOSED_CANCELLED": (1, 1)}


def test_an_inserted_audit_event_is_a_mismatch(store: SqlStore, runs: dict[str, str]) -> None:
    """A run_succeeded event forged for a failed Run breaks the K8 count and is named."""
    raw(store, (AUDIT_INSERT, {"id": "forged", "run": runs["failed"], "event": "run_succeeded"}))
    report = reconcile(SqlReconcileReads(store))
    assert not report.ok
    assert [f.ok for f in report.finals if f.state == "SUCCEEDED"] == [False]
    assert ("orphan_final_event", runs["failed"]) in offenders(report)


def test_a_duplicated_final_event_is_named(store: SqlStore, runs: dict[str, str]) -> None:
    """A second run_closed_cancelled event for the same Run is named for that Run."""
    raw(store, (AUDIT_INSERT, {"id": "dup", "run": runs["cancelled"], "event": "run_closed_cancelled"}))
    report = reconcile(SqlReconcileReads(store))
    assert ("final_event_per_run", runs["cancelled"]) in offenders(report)


def test_a_state_changed_behind_the_kernels_back_is_a_mismatch(store: SqlStore, runs: dict[str, str]) -> None:
    """runs.state rewritten by raw SQL disagrees with the last transition, the job row and the counts."""
    raw(store, ("UPDATE runs SET state = 'SUCCEEDED' WHERE run_id = :r", {"r": runs["awaiting"]}))
    report = reconcile(SqlReconcileReads(store))
    assert not report.ok
    assert {("state_vs_last_transition", runs["awaiting"]), ("legacy_projection", runs["awaiting"]),
            ("final_event_per_run", runs["awaiting"])} <= offenders(report)
    assert [(f.runs, f.events) for f in report.finals if f.state == "SUCCEEDED"] == [(2, 1)]


def test_a_stale_legacy_job_row_is_named(store: SqlStore, runs: dict[str, str]) -> None:
    """jobs.status must be the projection of the live state (SPEC K6)."""
    raw(store, ("UPDATE jobs SET status = 'done' WHERE job_id = :r", {"r": runs["created"]}))
    assert offenders(reconcile(SqlReconcileReads(store))) == {("legacy_projection", runs["created"])}


def test_a_deleted_transition_leaves_a_seq_gap(store: SqlStore, runs: dict[str, str]) -> None:
    """Transition seqs must run 0..n-1 for every Run."""
    raw(store, ("DELETE FROM transitions WHERE run_id = :r AND seq = 1", {"r": runs["rejected"]}))
    assert ("transition_seq_gap", runs["rejected"]) in offenders(reconcile(SqlReconcileReads(store)))


def test_two_final_transitions_are_named(store: SqlStore, runs: dict[str, str]) -> None:
    """No Run may enter a final state twice."""
    raw(store, ("INSERT INTO transitions (run_id, seq, from_state, to_state, actor, reason, at) "
                "VALUES (:r, 99, 'TRACING', 'SUCCEEDED', 'x', 'x', 0)", {"r": runs["succeeded"]}))
    assert ("double_final", runs["succeeded"]) in offenders(reconcile(SqlReconcileReads(store)))


def test_listing_is_capped_and_counting_is_not(store: SqlStore, runs: dict[str, str]) -> None:
    """With many offenders, at most `limit` are listed per check and all are counted."""
    raw(store, ("UPDATE jobs SET run_state_snapshot = 'CREATED'", {}))
    report = reconcile(SqlReconcileReads(store), limit=2)
    assert report.counts["legacy_projection"] == len(runs) - 1
    assert sum(m.check == "legacy_projection" for m in report.mismatches) == 2
