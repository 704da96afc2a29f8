"""The zombie sweeper (SPEC S1-S3, seed 000 §6): finds Runs that outlived their state's threshold and
forces the mapped transition through the same compare-and-set every other writer uses.

It writes `zombie_detected` before acting and `zombie_recovered` (forced_by=zombie_sweeper) after a
forced transition it won; a sweeper that loses to another writer (a second sweeper, the worker
itself) finds its attempt audited as a lost race and moves on, so several sweepers may run at once.
A Run whose worker still heartbeats its lease is healthy and left alone. Approval requests past
their deadline time out through the gatekeeper's default-deny path (G3).

The scan uses the (state, last_state_change_at) index per non-final state, so its cost depends on the
number of stuck Runs, not on how many Runs have ever finished.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.kernel import TRANSIENT, RunState
from harness.kernel.thresholds import STATE_THRESHOLDS_S
from harness.state_machine import StateMachine

S = RunState
log = logging.getLogger(__name__)
SWEEPER = "zombie_sweeper"

#: seed 000 §6.1: where each stuck state is forced
FORCED: Mapping[RunState, RunState] = {
    S.CREATED: S.FAILED,
    S.PREPARING: S.FAILED,
    S.PLANNING: S.TIMEOUT,
    S.POLICY_CHECK: S.FAILED,
    S.EXECUTING: S.TIMEOUT,
    S.TRACING: S.FAILED,
}

_STUCK = (
    sa.select(t.runs.c.run_id, t.runs.c.version, t.runs.c.last_state_change_at, t.runs.c.lease_expires_at)
    .where(t.runs.c.state == sa.bindparam("p_state"), t.runs.c.last_state_change_at < sa.bindparam("p_cutoff"))
    .order_by(t.runs.c.last_state_change_at)
    .limit(sa.bindparam("p_limit"))
)


@dataclass
class SweepReport:
    """What one sweep found and did."""

    detected: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    healthy: list[str] = field(default_factory=list)
    approvals_expired: list[str] = field(default_factory=list)


class ZombieSweeper:
    """Finds and closes stuck Runs."""

    def __init__(self, store: SqlStore, machine: StateMachine, *,
                 thresholds: Mapping[RunState, float | None] = STATE_THRESHOLDS_S,
                 expire_approvals: Callable[[], list[str]] | None = None, batch: int = 500) -> None:
        self.store = store
        self.machine = machine
        self.thresholds = thresholds
        self.expire_approvals = expire_approvals
        self.batch = batch

    def sweep_once(self) -> SweepReport:
        """One pass over every non-final state."""
        report = SweepReport()
        now = self.store.clock.now()
        for state, threshold in self.thresholds.items():
            if threshold is None:
                continue
            with self.store.reader.connect() as conn:
                rows = conn.execute(_STUCK, {"p_state": state.value, "p_cutoff": now - threshold,
                                             "p_limit": self.batch}).all()
            for row in rows:
                if row.lease_expires_at is not None and row.lease_expires_at > now:
                    report.healthy.append(row.run_id)  # its worker still heartbeats: a long step, not a zombie
                    continue
                # rounded once, as recorded: a replay re-applies the sweep from the record (force)
                age = round(now - row.last_state_change_at, 3)
                self._force(row.run_id, row.version, state, age, threshold, report)
        if self.expire_approvals is not None:
            report.approvals_expired = self.expire_approvals()
        return report

    def force(self, run_id: str, state: RunState, stuck_for_s: float, threshold_s: float) -> bool:
        """Force one Run on as a sweep that found it stuck in `state` for `stuck_for_s` would: how a replay
        re-applies a recorded sweep (A5). False when it is not in that state or the force lost its race."""
        run = self.store.get_run(run_id)
        if run.state != state:
            return False
        report = SweepReport()
        self._force(run_id, run.version, state, stuck_for_s, threshold_s, report)
        return bool(report.recovered)

    def _force(self, run_id: str, version: int, state: RunState, age: float, threshold: float,
               report: SweepReport) -> None:
        detail = {"state": state.value, "stuck_for_s": round(age, 3), "threshold_s": threshold, "layer": "sweeper"}
        self.store.audit(run_id, "zombie_detected", SWEEPER, detail)
        report.detected.append(run_id)
        # a transient state only lacks its funnel step; anything else is forced as seed 000 §6.1 maps it
        target = S.TRACING if state in TRANSIENT else FORCED[state]
        reason = f"zombie: {state.value} for {age:.0f}s (threshold {threshold:.0f}s)"
        if state in TRANSIENT:  # its close reason (and result) are already set; only the funnel is missing
            outcome = self.machine.transition(run_id, state, target, actor=SWEEPER, forced_by=SWEEPER,
                                              expected_version=version, reason=reason)
        else:
            outcome = self.machine.transition(
                run_id, state, target, actor=SWEEPER, forced_by=SWEEPER, expected_version=version, reason=reason,
                result={"error": f"zombie_sweeper: stuck in {state.value} for {age:.0f}s"})
        final = self.store.get_run(run_id).state
        if outcome.applied:
            self.store.audit(run_id, "zombie_recovered", SWEEPER,
                             {**detail, "forced_by": SWEEPER, "final_state": final.value})
            report.recovered.append(run_id)
        else:
            report.lost.append(run_id)

    def run_forever(self, interval_s: float, stop: threading.Event) -> None:
        """Sweep every `interval_s` seconds until `stop` is set (the in-process sweeper of D1)."""
        while not stop.wait(interval_s):
            try:
                report = self.sweep_once()
                if report.recovered or report.approvals_expired:
                    log.info("sweep: recovered %d, approvals expired %d", len(report.recovered),
                             len(report.approvals_expired))
            except Exception:  # a failing sweep must not kill the sweeper; the next pass retries
                log.exception("sweep failed")
