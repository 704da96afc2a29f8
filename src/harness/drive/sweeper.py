"""The zombie sweeper (SPEC S1-S3, seed 000 §6): finds Runs that outlived their state's threshold and
moves them on through the same compare-and-set every other writer uses.

A Run in CREATED has not started (nothing has left the process for it): it is queued, not stuck, and is
never forced. Past the CREATED threshold with no live lease it is handed back to a driver (`resume`),
whatever its age, with one `run_requeued` audit event the first time; with no `resume` (`harness sweep`
without a worker) it is left queued for a worker's re-drive. Only its start deadline closes it
(harness.pipeline.queue): the sweeper closes every queued Run whose deadline passed, CLOSED_FAILED
`not_started`, the first thing in each pass.

A stuck Run that can still be resumed (its worker died before it finished a side-effect-free step, or
between steps) is handed back to a driver (`resume`: the embedded worker, or a Celery queue) rather
than failed: sweeping is the backstop for Runs nobody can resume. A Run stuck in a transient state only
lacks its funnel, and one stuck in TRACING only its close: the sweeper completes both with the reason
the Run was entered with (K3), and fails a TRACING Run only when its close cannot be completed. Anything
else stuck is forced as seed 000 §6.1 maps it, writing `zombie_detected` before acting and
`zombie_recovered` (forced_by=zombie_sweeper) after a forced transition it won; a sweeper that loses to
another writer (a second sweeper, the worker itself) finds its attempt audited as a lost race and moves
on, so several sweepers may run at once.

A Run whose worker still heartbeats its lease is healthy, until its state's heartbeat ceiling (a
multiple of its threshold): past it the Run is forced on even with a heartbeat (S2). A Run whose workers
keep dying (its lease taken over `max_stalls` times) is no longer resumed. Approval requests past their
deadline time out through the gatekeeper's default-deny path (G3), and decided requests whose Run did
not move are carried out (`resume_decisions`).

The scan uses the (state, last_state_change_at) index per non-final state, so its cost depends on the
number of stuck Runs, not on how many Runs have ever finished.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from harness.domain.records import StuckRun
from harness.drive.state_machine import StateMachine
from harness.kernel.events import RUN_REQUEUED
from harness.kernel.states import TRANSIENT, RunState
from harness.kernel.thresholds import DEFAULT, Thresholds
from harness.kernel.transitions import final_state_for
from harness.pipeline.queue import close_not_started
from harness.ports.runs import RunStore

S = RunState
log = logging.getLogger(__name__)
SWEEPER = "zombie_sweeper"

#: seed 000 §6.1: where each stuck state is forced. A sweep never forces CREATED (a queued Run is not stuck);
#: the entry is how a replay re-applies a close an older sweeper recorded
FORCED: Mapping[RunState, RunState] = {
    S.CREATED: S.FAILED,
    S.PREPARING: S.FAILED,
    S.PLANNING: S.TIMEOUT,
    S.POLICY_CHECK: S.FAILED,
    S.EXECUTING: S.TIMEOUT,
    S.TRACING: S.FAILED,
}
#: states a driver can resume a Run from (steps ①-④ are side-effect free, EXECUTING skips completed
#: steps and refuses to repeat a non-idempotent one whose outcome is unknown, T6)
RESUMABLE = frozenset({S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING})

@dataclass
class SweepReport:
    """What one sweep found and did."""

    detected: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    healthy: list[str] = field(default_factory=list)
    #: stuck but resumable: handed back to a driver instead of being forced
    resumed: list[str] = field(default_factory=list)
    approvals_expired: list[str] = field(default_factory=list)
    #: decided approval requests whose Run had not moved, now carried out
    decisions_resumed: list[str] = field(default_factory=list)
    #: queued (CREATED, never started) past the CREATED threshold and handed back to a driver
    requeued: list[str] = field(default_factory=list)
    #: queued past the CREATED threshold and left waiting: no driver to hand them to in this sweep
    queued: list[str] = field(default_factory=list)
    #: queued past their start deadline: closed CLOSED_FAILED `not_started`, never run
    not_started: list[str] = field(default_factory=list)


class ZombieSweeper:
    """Finds stuck Runs and resumes or closes them."""

    def __init__(self, store: RunStore, machine: StateMachine, *, thresholds: Thresholds = DEFAULT,
                 expire_approvals: Callable[[], list[str]] | None = None,
                 resume: Callable[[str], object] | None = None,
                 resume_decisions: Callable[[float], list[str]] | None = None,
                 max_stalls: int = 3, batch: int = 500) -> None:
        self.store = store
        self.machine = machine
        self.thresholds = thresholds
        self.expire_approvals = expire_approvals
        self.resume = resume
        self.resume_decisions = resume_decisions
        self.max_stalls = max_stalls
        self.batch = batch

    def sweep_once(self) -> SweepReport:
        """One pass over every non-final state."""
        report = SweepReport()
        now = self.store.clock.now()
        self._close_overdue(now, report)
        for state, threshold in self.thresholds.per_state.items():
            if threshold is None:
                continue
            ceiling = self.thresholds.ceiling(state) or threshold
            rows = self.store.stuck_runs(state, now - threshold, self.batch)
            if state == S.CREATED:
                self._requeue(rows, now, threshold, report)
                continue
            for row in rows:
                age = round(now - row.last_state_change_at, 3)  # rounded once, as recorded: a replay re-applies it
                leased = row.lease_expires_at is not None and row.lease_expires_at > now
                if leased and age < ceiling:
                    report.healthy.append(row.run_id)  # its worker still heartbeats: a long step, not a zombie
                    continue
                if (not leased and self.resume is not None and state in RESUMABLE and age < ceiling
                        and row.stall_count < self.max_stalls):
                    self.store.audit(row.run_id, "zombie_resumed", SWEEPER, {
                        "state": state.value, "stuck_for_s": round(age, 3), "threshold_s": threshold})
                    self.resume(row.run_id)
                    report.resumed.append(row.run_id)
                    continue
                self._force(row.run_id, row.version, state, age, threshold, ceiling, leased, report)
        if self.expire_approvals is not None:
            report.approvals_expired = self.expire_approvals()
        if self.resume_decisions is not None:
            report.decisions_resumed = self.resume_decisions(self.thresholds.decided_s)
            for run_id in report.decisions_resumed:
                if self.resume is not None:
                    self.resume(run_id)
        return report

    def _close_overdue(self, now: float, report: SweepReport) -> None:
        """Close the queued Runs whose start deadline passed before a driver started them."""
        for run in self.store.overdue_unstarted(now, self.batch):
            if close_not_started(self.store, self.machine, run.run_id, version=run.version, deadline=run.start_by,
                                 created_at=run.created_at, noticed_by=SWEEPER):
                report.not_started.append(run.run_id)
            else:
                report.lost.append(run.run_id)

    def _requeue(self, rows: list[StuckRun], now: float, threshold: float, report: SweepReport) -> None:
        """Queued Runs waiting past the CREATED threshold: handed back to a driver (audited the first time),
        or left queued when there is none here; never forced, however long they have waited."""
        waiting = [r for r in rows if r.lease_expires_at is None or r.lease_expires_at <= now]
        report.healthy.extend(r.run_id for r in rows if r not in waiting)  # a driver is starting it now
        if self.resume is None:
            report.queued.extend(r.run_id for r in waiting)
            return
        announced = self.store.audited([r.run_id for r in waiting], RUN_REQUEUED)
        for row in waiting:
            if row.run_id not in announced:
                self.store.audit(row.run_id, RUN_REQUEUED, SWEEPER, {
                    "waited_s": round(now - row.last_state_change_at, 3), "threshold_s": threshold})
            self.resume(row.run_id)
            report.requeued.append(row.run_id)

    def force(self, run_id: str, state: RunState, stuck_for_s: float, threshold_s: float) -> bool:
        """Force one Run on as a sweep that found it stuck in `state` for `stuck_for_s` would: how a replay
        re-applies a recorded sweep (A5). False when it is not in that state or the force lost its race."""
        run = self.store.get_run(run_id)
        if run.state != state:
            return False
        report = SweepReport()
        ceiling = self.thresholds.ceiling(state) or threshold_s
        self._force(run_id, run.version, state, stuck_for_s, threshold_s, ceiling, False, report)
        return bool(report.recovered)

    def _force(self, run_id: str, version: int, state: RunState, age: float, threshold: float, ceiling: float,
               leased: bool, report: SweepReport) -> None:
        detail = {"state": state.value, "stuck_for_s": round(age, 3), "threshold_s": threshold, "layer": "sweeper",
                  "heartbeat_ceiling_s": ceiling if leased else None}
        self.store.audit(run_id, "zombie_detected", SWEEPER, detail)
        report.detected.append(run_id)
        reason = f"zombie: {state.value} for {age:.0f}s (threshold {threshold:.0f}s)"
        if leased:
            reason += f", past its heartbeat ceiling of {ceiling:.0f}s"
        close = self._finish_close(run_id, version, age, ceiling) if state == S.TRACING else "fail"
        if close in ("retry", "lost"):
            report.lost.append(run_id)
            return
        if close == "closed":
            applied = True
        elif state in TRANSIENT:  # its close reason (and result) are already set; only the funnel is missing
            applied = self.machine.transition(run_id, state, S.TRACING, actor=SWEEPER, forced_by=SWEEPER,
                                              expected_version=version, reason=reason).applied
        else:
            applied = self.machine.transition(
                run_id, state, FORCED[state], actor=SWEEPER, forced_by=SWEEPER, expected_version=version,
                reason=reason, result={"error": f"zombie_sweeper: stuck in {state.value} for {age:.0f}s"}).applied
        final = self.store.get_run(run_id).state
        if applied:
            self.store.audit(run_id, "zombie_recovered", SWEEPER,
                             {**detail, "forced_by": SWEEPER, "final_state": final.value})
            report.recovered.append(run_id)
        else:
            report.lost.append(run_id)

    def _finish_close(self, run_id: str, version: int, age: float, ceiling: float
                      ) -> Literal["closed", "lost", "retry", "fail"]:
        """Complete a TRACING Run's close with the reason it entered TRACING with (K3): everything but the
        trace was done. "fail" (the caller then forces TRACING → FAILED) only when the close cannot be
        completed: no close reason on record, or it keeps failing past the heartbeat ceiling."""
        run = self.store.get_run(run_id)
        if run.version != version:
            return "lost"
        if run.close_reason is None:
            return "fail"
        try:
            outcome = self.machine.transition(
                run_id, S.TRACING, final_state_for(run.close_reason), actor=SWEEPER, forced_by=SWEEPER,
                expected_version=version, reason=f"zombie: TRACING for {age:.0f}s; the close completed")
        except Exception:  # the close itself failed (a closing hook, the database): retry at the next sweep
            log.exception("closing the stuck TRACING run %s failed", run_id)
            return "retry" if age < ceiling else "fail"
        return "closed" if outcome.applied else "lost"

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
