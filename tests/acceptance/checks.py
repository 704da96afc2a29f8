"""Assertions shared by the acceptance tests: path, trace kinds, chain and reconcile clean."""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.config import Runtime
from harness.domain.traces import step_entries


def trace_kinds(rt: Runtime, run_id: str) -> Counter[str]:
    """How many records of each kind the Run has in the chain (after draining)."""
    rt.store.drain_all()
    return Counter(r.kind for r in rt.store.trace_of(run_id))


def step_traces(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    """The Run's StepTraces, in chain order, from the transition records that carry them (after draining)."""
    rt.store.drain_all()
    return [entry for r in rt.store.trace_of(run_id) for entry in step_entries(r.kind, r.data())]


def assert_audit_clean(rt: Runtime) -> None:
    """`audit verify` and `audit reconcile` both find nothing wrong."""
    from harness.audit.reconcile import reconcile
    from harness.audit.verify import verify_chain

    rt.store.drain_all()
    chain = verify_chain(SqlAuditReads(rt.store))
    assert chain.ok, chain
    report = reconcile(SqlReconcileReads(rt.store))
    assert report.ok, report
