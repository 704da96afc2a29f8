"""`harness audit reconcile` (SPEC K8, K6): the runs table agrees with the audit log and transitions.

For each final state, count(runs in it) == count(its FINAL_EVENT audit events). Per Run: its state is
the last transition's target, the legacy job row mirrors it, it has at most one final transition and
its transition seqs run 0, 1, 2, … without a hole, and a final Run has exactly one final event. Apart
from Runs (run_id None): every user's and tenant's spend total (SPEC G1) counts its recorded costs and
sums their USD, the float sums to within a relative SPEND_TOLERANCE (the same amounts added in another
order); a total with no recorded cost is named too. A non-idempotent step called more than once (its
ToolTraces) is named: the duplicate side effect the lease and the start mark exist to prevent.

Every check is one set-based query (GROUP BY / joins), never a loop over Runs, so it scales to a
million Runs; each lists at most `limit` offenders and counts them all. One check reads payloads: every
RunTrace's total cost (shape 2) must be the sums of the costs its Run and its child Runs recorded up to
its close (SPEC A1); it walks the RunTraces in batches of `RUN_TRACE_BATCH`, with a query per level of
a batch's child Runs and one for all their costs. Costs a Run recorded after it closed (a call that was still
running when the Run was cancelled) are not in its RunTrace: they are counted apart, as information.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.ledger import TENANT_TOTAL, RunTotal, descendants
from harness.adapters.sql.store import SqlStore
from harness.kernel import FINAL, FINAL_EVENT
from harness.kernel.projection import PROJECTION

_FINAL_STATES = sorted(s.value for s in FINAL)
_FINAL_EVENTS = sorted(FINAL_EVENT.values())
_STATE_OF_EVENT = {event: state.value for state, event in FINAL_EVENT.items()}
#: how far (relative, plus as much in absolute USD) a spend total may stray from its costs' sum: the same
#: floats added in another order differ by a few ulps per addition, far below this for ~10**7 costs
SPEND_TOLERANCE = 1e-9
RUN_TRACE_BATCH = 500
_MEASURES = ("input_tokens", "output_tokens", "api_calls", "sandbox_s", "usd", "costs")


@dataclass(frozen=True, slots=True)
class FinalCount:
    """K8 for one final state."""

    state: str
    event: str
    runs: int
    events: int

    @property
    def ok(self) -> bool:
        """True when the counts agree."""
        return self.runs == self.events


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One Run (or event) that breaks a per-Run check."""

    check: str
    run_id: str | None
    detail: str


@dataclass
class ReconcileReport:
    """The outcome of reconcile(); `ok` is False on any mismatch."""

    finals: list[FinalCount] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    #: facts that are not mismatches (e.g. costs recorded after their Run closed)
    info: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every count agrees and no per-Run check found anything."""
        return all(f.ok for f in self.finals) and not any(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        return {
            "ok": self.ok,
            "finals": [{**asdict(f), "ok": f.ok} for f in self.finals],
            "counts": self.counts,
            "info": self.info,
            "mismatches": [asdict(m) for m in self.mismatches],
        }


def _final_counts(conn: sa.Connection) -> list[FinalCount]:
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
    return [FinalCount(s.value, e, runs.get(s.value, 0), events.get(e, 0)) for s, e in FINAL_EVENT.items()]


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
    c, s = t.costs, t.spend_totals
    sums = sa.union_all(
        sa.select(c.c.tenant_id, c.c.user_id, sa.func.sum(c.c.usd).label("usd"), sa.func.count().label("n"))
        .group_by(c.c.tenant_id, c.c.user_id),
        sa.select(c.c.tenant_id, sa.literal(TENANT_TOTAL), sa.func.sum(c.c.usd), sa.func.count())
        .group_by(c.c.tenant_id),
    ).subquery("sums")
    off = sa.func.abs(s.c.usd - sums.c.usd) > SPEND_TOLERANCE * (1 + sa.func.abs(sums.c.usd))
    wrong = (
        sa.select(sa.null().label("run_id"), sums.c.tenant_id, sums.c.user_id, s.c.usd, s.c.cost_count,
                  sums.c.usd.label("costs_usd"), sums.c.n)
        .select_from(sums.outerjoin(s, sa.and_(s.c.tenant_id == sums.c.tenant_id, s.c.user_id == sums.c.user_id)))
        .where(sa.or_(s.c.tenant_id.is_(None), s.c.cost_count != sums.c.n, off))
    )
    recorded = sa.exists().where(c.c.tenant_id == s.c.tenant_id,
                                 sa.or_(s.c.user_id == TENANT_TOTAL, c.c.user_id == s.c.user_id))
    stray = sa.select(sa.null(), s.c.tenant_id, s.c.user_id, s.c.usd, s.c.cost_count, sa.null(), sa.null()).where(
        ~recorded)
    return sa.select(sa.union_all(wrong, stray).subquery("spend"))


def _describe_spend(row: tuple[Any, ...]) -> str:
    tenant, user, usd, count, costs_usd, n = row
    scope = f"tenant {tenant!r} " + (f"user {user!r}" if user != TENANT_TOTAL else "total")
    total = "no total" if usd is None else f"total {usd!r} USD over {count} cost(s)"
    recorded = "no recorded cost" if n is None else f"recorded costs sum to {costs_usd!r} USD over {n}"
    return f"{scope}: {total}, {recorded}"


#: each check: the query listing offenders (run_id first) and how to say what is wrong with one row
CHECKS: dict[str, tuple[Callable[[], sa.Select[Any]], Callable[[tuple[Any, ...]], str]]] = {
    "state_vs_last_transition": (
        _state_vs_last_transition, lambda r: f"state {r[0]} but last transition to {r[1] or '(none)'}"),
    "transition_seq_gap": (
        _seq_gaps, lambda r: f"{r[2]} transitions with seqs {r[0]}..{r[1]}, not 0..{r[2] - 1}"),
    "legacy_projection": (
        _legacy_projection, lambda r: f"state {r[0]} but legacy job {r[1] or '(missing)'}/{r[2] or '-'}"),
    "double_final": (_double_final, lambda r: f"{r[0]} transitions into a final state"),
    "final_event_per_run": (_final_event_per_run, lambda r: f"state {r[0]} with {r[1]} final events, not 1"),
    "orphan_final_event": (
        _orphan_final_events, lambda r: f"{r[0]} event but run state {r[1] or '(no such run)'}"),
    "spend_totals": (_spend_totals, _describe_spend),
}


def _repeated_calls(conn: sa.Connection) -> list[Mismatch]:
    """Non-idempotent steps whose skill was called more than once (T6: never a silent duplicate), from the
    ToolTraces chained or waiting in the outbox. A refused call never ran and does not count; records
    written before ToolTraces said whether the skill is idempotent are not judged."""
    calls: dict[tuple[str, str], list[str]] = {}
    for table in (t.trace_records, t.outbox):
        rows = conn.execute(sa.select(table.c.run_id, table.c.payload).where(table.c.kind == "tool"))
        for run_id, payload in rows:
            call = json.loads(payload)
            if call.get("idempotent") is False and call.get("status") != "refused":
                calls.setdefault((run_id, call["step_id"]), []).append(call.get("skill_id", "?"))
    return [Mismatch("repeated_non_idempotent_call", run_id,
                     f"step {step_id} called {len(skills)} times ({', '.join(skills)}), but its skill is not "
                     "idempotent") for (run_id, step_id), skills in calls.items() if len(skills) > 1]


def reconcile(store: SqlStore, *, limit: int = 20) -> ReconcileReport:
    """Run every check; list at most `limit` offenders per check, count them all."""
    report = ReconcileReport()
    with store.reader.connect() as conn:
        report.finals = _final_counts(conn)
        for name, (build, describe) in CHECKS.items():
            query = build()
            total = conn.execute(sa.select(sa.func.count()).select_from(query.subquery())).scalar_one()
            report.counts[name] = int(total)
            if total:
                for row in conn.execute(query.limit(limit)):
                    report.mismatches.append(Mismatch(name, row[0], describe(tuple(row[1:]))))
        repeated = _repeated_calls(conn)
        report.counts["repeated_non_idempotent_call"] = len(repeated)
        report.mismatches.extend(repeated[:limit])
        _run_cost_totals(conn, report, limit)
    return report


def _off(recorded: dict[str, Any], expected: RunTotal) -> list[str]:
    """The measures in which a RunTrace's total differs from the recomputed sums."""
    wrong = []
    for name in _MEASURES:
        got, want = float(recorded.get(name, 0) or 0), float(getattr(expected, name))
        if abs(got - want) > SPEND_TOLERANCE * (1 + abs(want)) + {"sandbox_s": 1e-6, "usd": 1e-8}.get(name, 0.0):
            wrong.append(f"{name} {got!r} but the recorded costs sum to {want!r}")
    if int(recorded.get("children", 0) or 0) != expected.children:
        wrong.append(f"children {recorded.get('children')!r} but {expected.children} child Run(s)")
    return wrong


def _run_cost_totals(conn: sa.Connection, report: ReconcileReport, limit: int) -> None:
    """Each RunTrace's total cost (shape 2) against the sums of its Run's and child Runs' costs up to its
    close; RunTraces written before the total had a shape (the planning call only) are left out."""
    tr, r = t.trace_records, t.runs
    after, wrong, late = 0, 0, 0
    while True:
        rows = conn.execute(sa.select(tr.c.seq, tr.c.run_id, tr.c.payload, r.c.last_state_change_at)
                            .join(r, r.c.run_id == tr.c.run_id)
                            .where(tr.c.kind == "run", tr.c.seq > after).order_by(tr.c.seq)
                            .limit(RUN_TRACE_BATCH)).all()
        if not rows:
            break
        after = rows[-1].seq
        traces = [(row.run_id, json.loads(row.payload).get("total_cost") or {}, float(row.last_state_change_at))
                  for row in rows]
        traces = [x for x in traces if x[1].get("v") == 2]
        family = descendants(conn, [run_id for run_id, _, _ in traces])
        c = t.costs
        costs_of: dict[str, list[Any]] = {}
        for cost in conn.execute(sa.select(c.c.run_id, c.c.at, c.c.input_tokens, c.c.output_tokens, c.c.api_calls,
                                           c.c.sandbox_s, c.c.usd, c.c.priced).where(c.c.run_id.in_(family))):
            costs_of.setdefault(cost.run_id, []).append(cost)
        parents = {str(a): str(b) for a, b in conn.execute(sa.select(r.c.run_id, r.c.parent_run_id).where(
            r.c.run_id.in_(family), r.c.parent_run_id.is_not(None)))} if family else {}
        children: dict[str, list[str]] = {}
        for child, parent in parents.items():
            children.setdefault(parent, []).append(child)
        for run_id, recorded, closed_at in traces:
            tree = _tree(run_id, children)
            rows_in = [x for run in tree for x in costs_of.get(run, [])]
            counted = [x for x in rows_in if x.at <= closed_at]
            late += len(rows_in) - len(counted)
            expected = RunTotal(sum(x.input_tokens for x in counted), sum(x.output_tokens for x in counted),
                                sum(x.api_calls for x in counted), sum(x.sandbox_s for x in counted),
                                sum(x.usd for x in counted), len(counted), sum(1 for x in counted if not x.priced),
                                len(tree) - 1)
            problems = _off(recorded, expected)
            if problems:
                wrong += 1
                if len([m for m in report.mismatches if m.check == "run_cost_total"]) < limit:
                    report.mismatches.append(Mismatch("run_cost_total", run_id, "; ".join(problems)))
    report.counts["run_cost_total"] = wrong
    report.info["costs_after_close"] = late


def _tree(run_id: str, children: dict[str, list[str]]) -> list[str]:
    found, frontier = [run_id], [run_id]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, []) if c not in found]
        found.extend(frontier)
    return found
