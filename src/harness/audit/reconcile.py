"""`harness audit reconcile` (SPEC K8, K6): the runs table agrees with the audit log and transitions.

For each final state, count(runs in it) == count(its FINAL_EVENT audit events). Per Run: its state is
the last transition's target, the legacy job row mirrors it, it has at most one final transition and
its transition seqs run 0, 1, 2, … without a hole, and a final Run has exactly one final event. Apart
from Runs (run_id None): every user's and tenant's spend total (SPEC G1) counts its recorded costs and
sums their USD (the live costs plus what pruned Runs' costs added, kept per archive segment), the float
sums to within a relative SPEND_TOLERANCE (the same amounts added in another order); a total with no
recorded cost is named too. A non-idempotent step called more than once (its
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

from harness.kernel.events import FINAL_EVENT
from harness.ports.audit import ReconcileReads, ReconcileSnapshot

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


def _describe_spend(row: tuple[Any, ...]) -> str:
    tenant, user, usd, count, costs_usd, n = row
    scope = f"tenant {tenant!r} " + (f"user {user!r}" if user is not None else "total")
    total = "no total" if usd is None else f"total {usd!r} USD over {count} cost(s)"
    recorded = "no recorded cost" if n is None else f"recorded costs sum to {costs_usd!r} USD over {n}"
    return f"{scope}: {total}, {recorded}"


#: each check (its offenders' query is the read port's, run_id first) and how to say what is wrong with one row
CHECKS: dict[str, Callable[[tuple[Any, ...]], str]] = {
    "state_vs_last_transition": lambda r: f"state {r[0]} but last transition to {r[1] or '(none)'}",
    "transition_seq_gap": lambda r: f"{r[2]} transitions with seqs {r[0]}..{r[1]}, not 0..{r[2] - 1}",
    "legacy_projection": lambda r: f"state {r[0]} but legacy job {r[1] or '(missing)'}/{r[2] or '-'}",
    "double_final": lambda r: f"{r[0]} transitions into a final state",
    "final_event_per_run": lambda r: f"state {r[0]} with {r[1]} final events, not 1",
    "orphan_final_event": lambda r: f"{r[0]} event but run state {r[1] or '(no such run)'}",
    "spend_totals": _describe_spend,
}


def _repeated_calls(snap: ReconcileSnapshot) -> list[Mismatch]:
    """Non-idempotent steps whose skill was called more than once (T6: never a silent duplicate), from the
    ToolTraces chained or waiting in the outbox. A refused call never ran and does not count; records
    written before ToolTraces said whether the skill is idempotent are not judged."""
    calls: dict[tuple[str, str], list[str]] = {}
    for run_id, payload in snap.tool_calls():
        call = json.loads(payload)
        if call.get("idempotent") is False and call.get("status") != "refused":
            calls.setdefault((run_id, call["step_id"]), []).append(call.get("skill_id", "?"))
    return [Mismatch("repeated_non_idempotent_call", run_id,
                     f"step {step_id} called {len(skills)} times ({', '.join(skills)}), but its skill is not "
                     "idempotent") for (run_id, step_id), skills in calls.items() if len(skills) > 1]


def reconcile(reads: ReconcileReads, *, limit: int = 20) -> ReconcileReport:
    """Run every check; list at most `limit` offenders per check, count them all."""
    report = ReconcileReport()
    with reads.snapshot() as snap:
        runs, events = snap.final_counts()
        report.finals = [FinalCount(s.value, e, runs.get(s.value, 0), events.get(e, 0))
                         for s, e in FINAL_EVENT.items()]
        for name, describe in CHECKS.items():
            total, rows = snap.offenders(name, limit)
            report.counts[name] = total
            for row in rows:
                report.mismatches.append(Mismatch(name, row[0], describe(tuple(row[1:]))))
        repeated = _repeated_calls(snap)
        report.counts["repeated_non_idempotent_call"] = len(repeated)
        report.mismatches.extend(repeated[:limit])
        _run_cost_totals(snap, report, limit)
    return report


def _off(recorded: dict[str, Any], expected: dict[str, float]) -> list[str]:
    """The measures in which a RunTrace's total differs from the recomputed sums (and the child count)."""
    wrong = []
    for name in _MEASURES:
        got, want = float(recorded.get(name, 0) or 0), float(expected[name])
        if abs(got - want) > SPEND_TOLERANCE * (1 + abs(want)) + {"sandbox_s": 1e-6, "usd": 1e-8}.get(name, 0.0):
            wrong.append(f"{name} {got!r} but the recorded costs sum to {want!r}")
    children = int(expected["children"])
    if int(recorded.get("children", 0) or 0) != children:
        wrong.append(f"children {recorded.get('children')!r} but {children} child Run(s)")
    return wrong


def _run_cost_totals(snap: ReconcileSnapshot, report: ReconcileReport, limit: int) -> None:
    """Each RunTrace's total cost (shape 2) against the sums of its Run's and child Runs' costs up to its
    close; RunTraces written before the total had a shape (the planning call only) are left out."""
    after, wrong, late = 0, 0, 0
    while True:
        rows = snap.run_traces(after, RUN_TRACE_BATCH)
        if not rows:
            break
        after = rows[-1][0]
        traces = [(run_id, json.loads(payload).get("total_cost") or {}, closed_at)
                  for _, run_id, payload, closed_at in rows]
        traces = [x for x in traces if x[1].get("v") == 2]
        family = snap.family([run_id for run_id, _, _ in traces])
        costs_of: dict[str, list[Any]] = {}
        for cost in snap.costs_of(family):
            costs_of.setdefault(cost.run_id, []).append(cost)
        children: dict[str, list[str]] = {}
        for child, parent in snap.parents(family).items():
            children.setdefault(parent, []).append(child)
        for run_id, recorded, closed_at in traces:
            tree = _tree(run_id, children)
            rows_in = [x for run in tree for x in costs_of.get(run, [])]
            counted = [x for x in rows_in if x.at <= closed_at]
            late += len(rows_in) - len(counted)
            expected = {"input_tokens": sum(x.input_tokens for x in counted),
                        "output_tokens": sum(x.output_tokens for x in counted),
                        "api_calls": sum(x.api_calls for x in counted), "sandbox_s": sum(x.sandbox_s for x in counted),
                        "usd": sum(x.usd for x in counted), "costs": len(counted), "children": len(tree) - 1}
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
