"""Carrying out approval decisions the Run manager did not make in a decision's own call (SPEC G3, G6):
approval timeouts (default-deny, or escalation) and the sweeper's backstop for decisions whose Run
did not move; and, before a decision is recorded, whether this process can drive what it approves."""

from __future__ import annotations

from harness.domain.errors import SkillsUnavailableError
from harness.domain.records import TransitionResult
from harness.domain.traces import HITLTrace
from harness.pipeline.run_core import RunCore, S, trace_records
from harness.policy.hitl import HitlRequest
from harness.ports import Tx


class Decisions(RunCore):
    """Approval timeouts and stranded decisions."""

    def check_skills_for(self, request_id: str) -> None:
        """Refuse (SkillsUnavailableError, nothing recorded) to approve a request whose approved steps call a
        skill this process does not have as the Run pinned it at its start (T1): the drive that follows
        would refuse the step (not_approved, manifest_changed) and the approval would be used up. A request
        no longer pending is left to the decision's own refusal."""
        request = self.hitl.get(request_id)
        if request.status != "pending":
            return
        pinned = (self.store.get_run(request.run_id).context or {}).get("manifests", {})
        missing, changed = [], []
        for skill_id in sorted({str(action["skill"]) for action in request.actions}):
            skill = self.tools.registry.get(skill_id)
            if skill is None:
                missing.append(skill_id)
            elif pinned.get(skill_id, {}).get("hash") != skill.manifest_hash:
                changed.append(skill_id)
        if missing or changed:
            raise SkillsUnavailableError(request.run_id, missing, changed)

    def expire_approvals(self) -> list[str]:
        """Apply every due approval timeout (default-deny, G3); L3 may escalate to L4 by config. Each is
        one transaction with the Run's move (or the escalation's new request)."""
        handled = []
        for request in self.hitl.due(self.store.clock.now()):
            expiry = self.hitl.expire(request.request_id, self._timeout_move)
            if expiry.outcome == "lost":
                self._timeout_lost(request.run_id, request.request_id)
                continue
            if expiry.transition is not None:
                self.machine.settle(expiry.transition)
            handled.append(request.request_id)
        return handled

    def resume_decisions(self, older_than_s: float) -> list[str]:
        """Carry out decisions whose Run did not move (the sweeper's backstop; deciding commits the move
        with the decision, so only an older version's crash or a damaged database leaves any): an
        approved request moves its Run to EXECUTING, a rejected or timed-out one closes it, an escalated
        one gets its L4 request. Returns the Runs moved to EXECUTING, for a driver to resume."""
        to_drive = []
        for request in self.hitl.stranded(self.store.clock.now() - older_than_s):
            with self.writes.transaction() as tx:
                if self.writes.lock_run(tx, request.run_id) != S.AWAITING_HITL:
                    continue
                outcome = self._carry_out(tx, request)
            self.store.audit(request.run_id, "hitl_decision_resumed", "zombie_sweeper",
                             {"request_id": request.request_id, "status": request.status})
            if outcome is not None:
                self.machine.settle(outcome, forced_by="zombie_sweeper")
                if outcome.target == S.EXECUTING:
                    to_drive.append(request.run_id)
        return to_drive

    def _carry_out(self, conn: Tx, request: HitlRequest) -> TransitionResult | None:
        run_id, actor = request.run_id, "zombie_sweeper"
        if request.status == "approved":
            return self.machine.transition_in(conn, run_id, S.AWAITING_HITL, S.EXECUTING, actor=actor,
                                              reason=f"approved ({request.level}); resumed by the sweeper")
        if request.status == "rejected":
            return self.machine.transition_in(conn, run_id, S.AWAITING_HITL, S.REJECTED, actor=actor,
                                              reason="rejected by an approver; closed by the sweeper",
                                              result={"error": "rejected by an approver"})
        if request.status == "timed_out":
            return self._timeout_move(conn, request)
        if request.status == "escalated":
            self.hitl.open_escalation(conn, request)
            return None
        return self.machine.transition_in(conn, run_id, S.AWAITING_HITL, S.CANCELLED, actor=actor,
                                          reason=f"its approval request was {request.status}")

    def _timeout_move(self, conn: Tx, request: HitlRequest) -> TransitionResult:
        """AWAITING_HITL → TIMEOUT for a request past its deadline, inside the expiry's transaction."""
        trace = HITLTrace(run_id=request.run_id, request_id=request.request_id, event="timeout",
                          level=request.level, actions_hash=request.actions_hash,
                          waited_s=round(self.store.clock.now() - request.created_at, 3), timeout_action="reject",
                          reason="no decision before the deadline: default-deny")
        return self.machine.transition_in(conn, request.run_id, S.AWAITING_HITL, S.TIMEOUT, actor="gatekeeper",
                                          reason="approval timed out (default-deny)", records=trace_records(trace),
                                          result={"error": "approval timed out: default-deny"})

    def _timeout_lost(self, run_id: str, request_id: str) -> None:
        """A timeout found its request already decided or cancelled: record the losing attempt."""
        self.store.audit(run_id, "hitl_timeout_lost", "gatekeeper",
                         {"request_id": request_id, "status": self.hitl.get(request_id).status})
