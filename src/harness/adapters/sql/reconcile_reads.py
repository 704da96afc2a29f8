"""The reads of `harness audit reconcile` on the harness database (ports.audit.ReconcileReads).

Every check is one set-based query (GROUP BY / joins), never a loop over Runs, so it scales to a
million Runs; the judgement (what counts as wrong, how it is said) is harness.audit.reconcile's. All
reads of one reconcile run on one connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.ledger import TENANT_TOTAL, descendants
from harness.adapters.sql.retention_schema import archived_costs
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import SPEND_TOLERANCE
from harness.kernel.events import FINAL_EVENT
from harness.kernel.projection import PROJECTION
from harness.kernel.states import FINAL

_FINAL_STATES = sorted(s.value for s in FINAL)
_FINAL_EVENTS = sorted(FINAL_EVENT.values())
_STATE_OF_EVENT = {event: state.value for state, event in FINAL_EVENT.items()}


def _per_run_transitions() -> sa.Subquery:
    tr = t.transitions
    return (
        sa.select(tr.c.run_id, sa.func.min(tr.c.seq).label("first"), sa.func.max(tr.c.seq).label("last"),
                  sa.func.count().label("n"))
        .group_by(tr.c.run_id)
        .subquery("g")
    )


def _state_vs_last_transition() -> sa.Select[Any]:
    g, last, r = _per_run_transitions(), t.transitions.alias("last_t"), t.runs
    return (
        sa.select(r.c.run_id, r.c.state, last.c.to_state)
        .outerjoin(g, g.c.run_id == r.c.run_id)
        .outerjoin(last, sa.and_(last.c.run_id == r.c.run_id, last.c.seq == g.c.last))
        .where(sa.or_(last.c.to_state.is_(None), last.c.to_state != r.c.state))
    )


def _seq_gaps() -> sa.Select[Any]:
    g = _per_run_transitions()
    gap = sa.or_(g.c.first != 0, g.c.n != g.c.last + 1)
    return sa.select(g.c.run_id, g.c.first, g.c.last, g.c.n).where(gap)


def _legacy_projection() -> sa.Select[Any]:
    r, j = t.runs, t.jobs
    expected = sa.case({s.value: p.value for s, p in PROJECTION.items()}, value=r.c.state)
    return (
        sa.select(r.c.run_id, r.c.state, j.c.status, j.c.run_state_snapshot)
        .outerjoin(j, j.c.job_id == r.c.run_id)
        .where(sa.or_(j.c.job_id.is_(None), j.c.status != expected, j.c.run_state_snapshot != r.c.state))
    )


def _double_final() -> sa.Select[Any]:
    tr = t.transitions
    return (
        sa.select(tr.c.run_id, sa.func.count())
        .where(tr.c.to_state.in_(_FINAL_STATES))
        .group_by(tr.c.run_id)
        .having(sa.func.count() > 1)
    )


def _final_event_per_run() -> sa.Select[Any]:
    r, a = t.runs, t.audit_events
    wanted = sa.case({s.value: e for s, e in FINAL_EVENT.items()}, value=r.c.state)
    return (
        sa.select(r.c.run_id, r.c.state, sa.func.count(a.c.id))
        .outerjoin(a, sa.and_(a.c.run_id == r.c.run_id, a.c.event == wanted))
        .where(r.c.state.in_(_FINAL_STATES))
        .group_by(r.c.run_id, r.c.state)
        .having(sa.func.count(a.c.id) != 1)
    )


def _orphan_final_events() -> sa.Select[Any]:
    r, a = t.runs, t.audit_events
    expected = sa.case(_STATE_OF_EVENT, value=a.c.event)
    return (
        sa.select(a.c.run_id, a.c.event, r.c.state)
        .outerjoin(r, r.c.run_id == a.c.run_id)
        .where(a.c.event.in_(_FINAL_EVENTS), sa.or_(r.c.run_id.is_(None), r.c.state != expected))
    )


def _spend_totals() -> sa.Select[Any]:
    """Totals that are not the sums of their recorded costs: the live costs plus what the costs of pruned
    Runs added (archived_costs), per user and per tenant; and totals with no recorded cost at all. A
    total is the sum of its rows (its shards)."""
    c, a, rows = t.costs, archived_costs, t.spend_totals
    s = (sa.select(rows.c.tenant_id, rows.c.user_id, sa.func.sum(rows.c.usd).label("usd"),
                   sa.func.sum(rows.c.cost_count).label("cost_count"))
         .group_by(rows.c.tenant_id, rows.c.user_id).subquery("totals"))
    per_user = sa.union_all(
        sa.select(c.c.tenant_id, c.c.user_id, sa.func.sum(c.c.usd).label("usd"), sa.func.count().label("n"))
        .group_by(c.c.tenant_id, c.c.user_id),
        sa.select(a.c.tenant_id, a.c.user_id, sa.func.sum(a.c.usd), sa.func.sum(a.c.cost_count))
        .group_by(a.c.tenant_id, a.c.user_id),
    ).subquery("per_user")
    u = per_user.c
    sums = sa.union_all(
        sa.select(u.tenant_id, u.user_id, sa.func.sum(u.usd).label("usd"), sa.func.sum(u.n).label("n"))
        .group_by(u.tenant_id, u.user_id),
        sa.select(u.tenant_id, sa.literal(TENANT_TOTAL), sa.func.sum(u.usd), sa.func.sum(u.n)).group_by(u.tenant_id),
    ).subquery("sums")
    off = sa.func.abs(s.c.usd - sums.c.usd) > SPEND_TOLERANCE * (1 + sa.func.abs(sums.c.usd))
    wrong = (
        sa.select(sa.null().label("run_id"), sums.c.tenant_id, sums.c.user_id, s.c.usd, s.c.cost_count,
                  sums.c.usd.label("costs_usd"), sums.c.n)
        .select_from(sums.outerjoin(s, sa.and_(s.c.tenant_id == sums.c.tenant_id, s.c.user_id == sums.c.user_id)))
        .where(sa.or_(s.c.tenant_id.is_(None), s.c.cost_count != sums.c.n, off))
    )
    stray = (sa.select(sa.null(), s.c.tenant_id, s.c.user_id, s.c.usd, s.c.cost_count, sa.null(), sa.null())
             .select_from(s.outerjoin(sums, sa.and_(sums.c.tenant_id == s.c.tenant_id, sums.c.user_id == s.c.user_id)))
             .where(sums.c.tenant_id.is_(None)))
    return sa.select(sa.union_all(wrong, stray).subquery("spend"))


def _spend_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A spend-totals offender with the tenant-wide total's user as None."""
    run_id, tenant, user, *rest = row
    return (run_id, tenant, None if user == TENANT_TOTAL else user, *rest)


#: each check's query listing offenders (run_id first)
QUERIES: dict[str, Callable[[], sa.Select[Any]]] = {
    "state_vs_last_transition": _state_vs_last_transition,
    "transition_seq_gap": _seq_gaps,
    "legacy_projection": _legacy_projection,
    "double_final": _double_final,
    "final_event_per_run": _final_event_per_run,
    "orphan_final_event": _orphan_final_events,
    "spend_totals": _spend_totals,
}


class _Snapshot:
    """The reads of one reconcile, on one connection."""

    def __init__(self, conn: sa.Connection) -> None:
        self.conn = conn

    def final_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        conn = self.conn
        runs = {str(state): int(n) for state, n in conn.execute(
            sa.select(t.runs.c.state, sa.func.count())
            .where(t.runs.c.state.in_(_FINAL_STATES))
            .group_by(t.runs.c.state)
        )}
        events = {str(event): int(n) for event, n in conn.execute(
            sa.select(t.audit_events.c.event, sa.func.count())
            .where(t.audit_events.c.event.in_(_FINAL_EVENTS))
            .group_by(t.audit_events.c.event)
        )}
        return runs, events

    def offenders(self, check: str, limit: int) -> tuple[int, list[tuple[Any, ...]]]:
        query = QUERIES[check]()
        total = int(self.conn.execute(sa.select(sa.func.count()).select_from(query.subquery())).scalar_one())
        if not total:
            return 0, []
        rows = [tuple(row) for row in self.conn.execute(query.limit(limit))]
        return total, [_spend_row(r) for r in rows] if check == "spend_totals" else rows

    def tool_calls(self) -> Iterator[tuple[str, str]]:
        for table in (t.trace_records, t.outbox):
            for run_id, payload in self.conn.execute(
                    sa.select(table.c.run_id, table.c.payload).where(table.c.kind == "tool")):
                yield str(run_id), str(payload)

    def run_traces(self, after: int, batch: int) -> list[tuple[int, str, str, float]]:
        tr, r = t.trace_records, t.runs
        rows = self.conn.execute(sa.select(tr.c.seq, tr.c.run_id, tr.c.payload, r.c.last_state_change_at)
                                 .join(r, r.c.run_id == tr.c.run_id)
                                 .where(tr.c.kind == "run", tr.c.seq > after).order_by(tr.c.seq)
                                 .limit(batch)).all()
        return [(int(x.seq), str(x.run_id), str(x.payload), float(x.last_state_change_at)) for x in rows]

    def family(self, run_ids: Sequence[str]) -> list[str]:
        return descendants(self.conn, run_ids)

    def costs_of(self, run_ids: Sequence[str]) -> list[Any]:
        c = t.costs
        return list(self.conn.execute(sa.select(c.c.run_id, c.c.at, c.c.input_tokens, c.c.output_tokens,
                                                c.c.api_calls, c.c.sandbox_s, c.c.usd, c.c.priced)
                                      .where(c.c.run_id.in_(run_ids))))

    def parents(self, run_ids: Sequence[str]) -> dict[str, str]:
        if not run_ids:
            return {}
        r = t.runs
        return {str(a): str(b) for a, b in self.conn.execute(sa.select(r.c.run_id, r.c.parent_run_id).where(
            r.c.run_id.in_(run_ids), r.c.parent_run_id.is_not(None)))}


class SqlReconcileReads:
    """ReconcileReads over a SqlStore."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    @contextmanager
    def snapshot(self) -> Iterator[_Snapshot]:
        with self.store.reader.connect() as conn:
            yield _Snapshot(conn)
