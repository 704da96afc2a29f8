"""The Run's decider (SPEC G3, G4, G6): a human's decision and the Run's move it causes, recorded together;
approval timeouts (default-deny, or escalation) and the sweeper's backstop for decisions whose Run did not
move; and, before a decision is recorded, whether this process can drive what it approves."""

from __future__ import annotations

from harness.domain.approvals import HitlRequest
from harness.domain.contracts import CallerIdentity
from harness.domain.errors import InvalidRequestError, SkillsUnavailableError
from harness.domain.records import TransitionResult
from harness.domain.traces import HITLTrace, step_trace
from harness.drive.state_machine import StateMachine
from harness.pipeline.run_core import S, trace_records
from harness.policy.hitl import Decision, HitlDesk
from harness.ports import Tx
from harness.ports.runs import RunStore, RunWrites
from harness.skills.manifests import SkillRegistry


class RunDecider:
    """Approval decisions, their timeouts and stranded decisions: each moves a parked Run in the
    transaction that records it. It never drives a Run; the Run manager drives an approved one on."""

    def __init__(self, *, store: RunStore, writes: RunWrites, machine: StateMachine, hitl: HitlDesk,
                 registry: SkillRegistry) -> None:
        self.store = store
        self.writes = writes
        self.machine = machine
        self.hitl = hitl
        #: the skills this process has, as the approved steps would call them
        self.registry = registry

    def decide(self, request_id: str, approver: CallerIdentity, decision: str, *, approved_hash: str | None,
               break_glass: bool, reason: str, check_skills: bool) -> Decision:
        """Record a human decision and the Run's move it causes in one transaction (G4: the decision is
        durable no later than its effect). An approval whose Run this process will drive (`check_skills`)
        is refused first, nothing recorded, when the process lacks a skill the approved steps call."""
        if decision not in ("approve", "reject"):
            raise InvalidRequestError(f"decision must be approve or reject, not {decision!r}")
        if decision == "approve" and check_skills:
            self.check_skills_for(request_id)
        who = f"{approver.tenant_id}/{approver.user_id}"

        def move(conn: Tx, request: HitlRequest, effect: str) -> TransitionResult:
            if effect == "approved":
                step = step_trace(request.run_id, 7, {"request_id": request.request_id}, {"approved_by": who}, 0.0)
                return self.machine.transition_in(
                    conn, request.run_id, S.AWAITING_HITL, S.EXECUTING, actor=who,
                    reason=f"approved ({request.level})" + (" by break-glass" if break_glass else ""),
                    records=trace_records(step))
            why = reason or "no reason given"
            return self.machine.transition_in(conn, request.run_id, S.AWAITING_HITL, S.REJECTED, actor=who,
                                              reason=f"rejected by an approver: {why}",
                                              result={"error": f"rejected by {who}: {why}"})

        verdict = self.hitl.decide(request_id, approver, decision,  # type: ignore[arg-type]
                                   approved_hash=approved_hash, break_glass=break_glass, reason=reason, move=move)
        if verdict.transition is not None:
            self.machine.settle(verdict.transition)
        return verdict

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
            skill = self.registry.get(skill_id)
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
