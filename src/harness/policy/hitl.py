"""Human approval requests and decisions (SPEC G2-G6).

A request names the Run, the level, who may decide, the deadline and the exact actions (with their
hash). A decision is persisted before it drives the state machine (G4) and is refused unless it is
bound to that Run, to the same actions hash, and comes from an authenticated identity of the same
tenant with the level's role; the requester cannot approve its own L3/L4 request; one person counts
once, by a unique row per accepted approval; L4 needs two distinct approvers; any reject is final.
Break-glass (G5, amended) shortens the wait only: a permitted identity's approval is marked in the trace
and its Run resumes at once, but it never counts for more than one person.

Every decision, timeout and cancel on a request is one transaction that locks the Run's row, then the
request's row, judges against what it locked, and commits the request's new status together with the
Run's state change; so they resolve to exactly one outcome, and no decided request is left behind by a
transition that did not happen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from harness.domain.approvals import ApprovalConflictError, HitlRequest, parent_runs_of
from harness.domain.chain import content_hash
from harness.domain.contracts import CallerIdentity
from harness.domain.errors import BadInputError, StoreError
from harness.domain.ids import ordered_id
from harness.domain.plans import Plan
from harness.domain.records import TransitionResult
from harness.domain.traces import HITLTrace
from harness.kernel.states import RunState
from harness.policy.config import Hitl, Level
from harness.ports import Clock, Tx
from harness.ports.approvals import ApprovalRows

__all__ = ["BREAK_GLASS_ROLE", "Decision", "Expiry", "HitlDesk", "InsertHook", "Mover", "UnknownRequestError",
           "actions_hash", "plan_actions"]

BREAK_GLASS_ROLE = "break_glass"
#: runs inside the transaction that inserts an approval request: (transaction, request, escalated_from);
#: the webhook notifier's way of pushing a request exactly when it is opened or escalated (SPEC P4 / N1)
InsertHook = Callable[[Tx, HitlRequest, str | None], None]


class UnknownRequestError(BadInputError):
    """No approval request has this id (in the caller's tenant)."""


@dataclass(frozen=True)
class Decision:
    """What happened to a submitted decision."""

    request: HitlRequest
    accepted: bool
    effect: Literal["approved", "rejected", "recorded", "refused"]
    refusal: str | None
    approvals: int
    trace: HITLTrace
    #: the Run's state change the decision caused, committed with it (None when it caused none)
    transition: TransitionResult | None = None


#: moves the Run for a decision that completed its request, inside the decision's transaction
Mover = Callable[[Tx, HitlRequest, Literal["approved", "rejected"]], TransitionResult]


def plan_actions(plan: Plan) -> list[dict[str, Any]]:
    """The exact actions a plan would take, as an approver sees them and the hash binds them."""
    return [{"step_id": s.id, "skill": s.tool_call.skill, "arguments": s.tool_call.arguments} for s in plan.steps]


def actions_hash(run_id: str, actions: list[dict[str, Any]]) -> str:
    """Hash binding a decision to one Run and its exact actions (G4)."""
    return content_hash({"run_id": run_id, "actions": actions})


def _unknown(request_id: str) -> UnknownRequestError:
    return UnknownRequestError(f"no approval request with id {request_id!r}")


class HitlDesk:
    """Opens approval requests and judges decisions, timeouts and cancellations on them."""

    def __init__(self, rows: ApprovalRows, settings: Hitl) -> None:
        self.rows = rows
        self.settings = settings
        self._insert_hooks: list[InsertHook] = []

    @property
    def clock(self) -> Clock:
        """The store's clock, read at each use (a store whose clock is replaced is followed)."""
        return self.rows.clock

    def on_insert(self, hook: InsertHook) -> None:
        """Register a hook that writes inside the transaction inserting each request (opened or escalated)."""
        self._insert_hooks.append(hook)

    # ------------------------------------------------------------------ requests

    def pending_count(self, tenant_id: str, requester: str) -> int:
        """How many requests of this requester still wait (for the per-requester rate limit)."""
        return self.rows.pending_count(tenant_id, requester)

    def new_request(self, run_id: str, tenant_id: str, requester: str, level: Level,
                    actions: list[dict[str, Any]]) -> HitlRequest:
        """A request ready to be inserted (in the AWAITING_HITL transition, see `insert`)."""
        now = self.clock.now()
        roles = () if level == "L2" else tuple(self.settings.approvers.get(level, ()))
        return HitlRequest(
            request_id=ordered_id(), run_id=run_id, tenant_id=tenant_id, requester=requester, level=level,
            required_approvals=2 if level == "L4" else 1, approver_roles=roles, actions=actions,
            actions_hash=actions_hash(run_id, actions), status="pending", created_at=now,
            deadline_at=now + self.settings.timeout_s,
        )

    def insert(self, tx: Tx, request: HitlRequest, escalated_from: str | None = None) -> None:
        """Insert a request inside the caller's transaction, with the record that chains it."""
        self.rows.insert(tx, request, escalated_from)
        for hook in self._insert_hooks:
            hook(tx, request, escalated_from)

    def get(self, request_id: str, tenant_id: str | None = None) -> HitlRequest:
        """The request with this id (in this tenant, when given); UnknownRequestError otherwise."""
        request = self.rows.get(request_id, tenant_id)
        if request is None:
            raise _unknown(request_id)
        return request

    def for_run(self, run_id: str) -> list[HitlRequest]:
        """A Run's requests, oldest first."""
        return self.rows.for_run(run_id)

    def pending(self, tenant_id: str | None = None, limit: int = 200) -> list[HitlRequest]:
        """Requests still waiting, oldest deadline first."""
        return self.rows.pending(tenant_id, limit)

    def due(self, now: float, limit: int = 500) -> list[HitlRequest]:
        """Pending requests whose deadline has passed."""
        return self.rows.due(now, limit)

    def parent_runs(self, requests: list[HitlRequest]) -> dict[str, str]:
        """For requests of child Runs (AgentInvoke): the parent Run each one serves, by request id."""
        return parent_runs_of(requests, self.rows.parent_runs)

    def approvals(self, request_id: str) -> list[str]:
        """Approvers whose approval of this request was accepted (each person once)."""
        return self.rows.approvals(request_id)

    # ------------------------------------------------------------------ decisions

    def decide(self, request_id: str, approver: CallerIdentity, decision: Literal["approve", "reject"], *,
               approved_hash: str | None = None, break_glass: bool = False, reason: str = "",
               move: Mover | None = None) -> Decision:
        """Judge and persist one decision, and the state change it causes, in one transaction.

        The Run's row and then the request's row are locked first, so every rule is judged against the
        request as it is at the commit, not as an earlier read saw it: several processes deciding at once
        serialize here. An accepted approval is also a row of hitl_approvals, unique per request and
        person, so one person counts once whatever happens (G4). A decision that completes the request
        (the last approval needed, or any reject) closes it and calls `move` in the same transaction,
        which moves the Run (AWAITING_HITL → EXECUTING / REJECTED): the decision and its effect commit
        together or not at all, so no decided request ever waits for a transition that never came.
        """
        for attempt in range(2):
            try:
                return self._decide_once(request_id, approver, decision, approved_hash, break_glass, reason, move)
            except ApprovalConflictError:
                # only a decider that skipped the row locks can collide on the uniqueness of an approval;
                # the retry reads the committed approval and refuses the repeat
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _decide_once(self, request_id: str, approver: CallerIdentity, decision: Literal["approve", "reject"],
                     approved_hash: str | None, break_glass: bool, reason: str, move: Mover | None) -> Decision:
        run_id = self.get(request_id).run_id
        who = f"{approver.tenant_id}/{approver.user_id}"
        effect: Literal["approved", "rejected", "recorded", "refused"] = "refused"
        moved: TransitionResult | None = None
        with self.rows.transaction() as tx:
            run_state = self.rows.lock_run(tx, run_id)
            request = self._locked(tx, request_id)
            now = self.clock.now()
            prior = self.rows.approvals(request_id, tx)
            refusal = self._refusal(request, approver, decision, approved_hash, break_glass, reason, prior)
            if refusal is None and run_state != RunState.AWAITING_HITL:
                refusal = f"the Run no longer waits for this decision (it is {run_state.value})"
            decision_id = ordered_id()
            if refusal is None:
                count = len(prior) + (1 if decision == "approve" else 0)
                if decision == "approve":
                    self.rows.add_approval(tx, request_id, who, decision_id, now)
                # break-glass shortens the wait only: it never stands in for a second person (G5)
                complete = decision == "reject" or count >= request.required_approvals
                effect = ("approved" if decision == "approve" else "rejected") if complete else "recorded"
            self.rows.add_decision(tx, dict(
                decision_id=decision_id, request_id=request_id, run_id=run_id, approver=who,
                decision=decision, actions_hash=approved_hash or request.actions_hash, break_glass=break_glass,
                reason=reason, outcome="refused" if refusal else "accepted", refusal=refusal, at=now,
            ))
            if effect in ("approved", "rejected"):  # the decision is written first: the move's hooks read it
                self._set_status(tx, request_id, effect, now)
                if move is not None:
                    moved = move(tx, request, effect)
                    if not moved.applied:  # cannot happen under the Run's lock; never half-decide
                        raise StoreError(f"run {run_id} moved while its decision held the lock")
            trace = HITLTrace(
                run_id=run_id, request_id=request_id, event="refused" if refusal else decision,
                level=request.level, approver=who, actions_hash=request.actions_hash,
                waited_s=round(now - request.created_at, 3), break_glass=break_glass,
                reason=refusal or reason,
            )
            self.rows.trace(tx, [trace.to_record()], now)
            if refusal:
                self.rows.audit(tx, run_id, "hitl_decision_refused", who,
                                {"request_id": request_id, "decision": decision, "refusal": refusal})
        approvals = len(prior) + (1 if decision == "approve" and refusal is None else 0)
        return Decision(request, refusal is None, effect if refusal is None else "refused", refusal, approvals,
                        trace, moved)

    def _locked(self, tx: Tx, request_id: str) -> HitlRequest:
        """The request's row, locked until the caller's transaction ends (the Run's row is locked first)."""
        request = self.rows.lock_request(tx, request_id)
        if request is None:
            raise _unknown(request_id)
        return request

    def _set_status(self, tx: Tx, request_id: str, status: str, now: float) -> None:
        """Close a pending request and chain it as it now stands; the caller holds its row's lock (or the
        Run's, which every writer of the Run's requests takes first), so it is still pending."""
        if not self.rows.close(tx, request_id, status, now):
            raise StoreError(f"approval request {request_id} changed while its row was locked")

    def refusal(self, request: HitlRequest, approver: CallerIdentity,
                decision: Literal["approve", "reject"]) -> str | None:
        """Why `approver` may not make this decision now (as `decide` would refuse it), or None when they
        may; for showing people what they can do before they try. `decide` judges again under the locks."""
        return self._refusal(request, approver, decision, None, False, "", self.approvals(request.request_id))

    def _refusal(self, request: HitlRequest, approver: CallerIdentity, decision: str, approved_hash: str | None,
                 break_glass: bool, reason: str, prior: list[str]) -> str | None:
        """Why this decision may not count, or None when it may."""
        if approver.tenant_id != request.tenant_id:
            return "approver belongs to another tenant"
        if request.status != "pending":
            return f"the request is already {request.status}"
        if self.clock.now() >= request.deadline_at:
            return "the request's deadline has passed (a timeout never approves)"
        if approved_hash is not None and approved_hash != request.actions_hash:
            return "the decision is for different actions than the request (actions hash mismatch)"
        is_requester = approver.user_id == request.requester
        if decision == "approve":
            if request.level == "L2" and not is_requester and not set(approver.roles) & set(
                    self.settings.approvers.get("L3", [])):
                return "an L2 request is confirmed by the requester (or a level-3 approver)"
            if request.level in ("L3", "L4"):
                if is_requester:
                    return f"the requester cannot approve their own {request.level} request"
                if not set(approver.roles) & set(request.approver_roles):
                    return f"{request.level} needs one of the roles {list(request.approver_roles)}"
            if f"{approver.tenant_id}/{approver.user_id}" in prior:
                return "this approver has already approved; one person counts once"
        elif not (is_requester or set(approver.roles) & set(request.approver_roles)
                  or set(approver.roles) & set(self.settings.approvers.get("L3", []))):
            return "only the requester or a permitted approver may reject"
        if break_glass:
            if BREAK_GLASS_ROLE not in approver.roles:
                return f"break-glass needs the {BREAK_GLASS_ROLE!r} role"
            if not reason.strip():
                return "break-glass needs a reason"
        return None

    # ------------------------------------------------------------------ timeouts and cancellation

    def expire(self, request_id: str, timeout_move: Callable[[Tx, HitlRequest], TransitionResult]) -> Expiry:
        """Apply a due request's deadline in one transaction (default-deny, G3): an L3 request escalates
        to a new L4 request on the same Run when configured, any other request times out and
        `timeout_move` moves its Run (AWAITING_HITL → TIMEOUT) in the same transaction. So a request is
        never closed without its successor or its Run's move. A request that was decided or cancelled
        first, or is no longer due, is left alone ("lost"); a pending request of a Run that no longer
        waits is closed as cancelled ("orphaned")."""
        run_id = self.get(request_id).run_id
        with self.rows.transaction() as tx:
            run_state = self.rows.lock_run(tx, run_id)
            request = self._locked(tx, request_id)
            now = self.clock.now()
            if request.status != "pending" or now < request.deadline_at:
                return Expiry("lost", request)
            if run_state != RunState.AWAITING_HITL:
                self._set_status(tx, request_id, "cancelled", now)
                self.rows.audit(tx, run_id, "hitl_request_orphaned", "gatekeeper", {
                    "request_id": request_id, "run_state": run_state.value})
                return Expiry("orphaned", request)
            if request.level == "L3" and self.settings.l3_timeout_action == "escalate":
                self._set_status(tx, request_id, "escalated", now)
                return Expiry("escalated", request, escalated=self.open_escalation(tx, request))
            self._set_status(tx, request_id, "timed_out", now)
            return Expiry("timed_out", request, transition=timeout_move(tx, request))

    def cancel_pending(self, tx: Tx, run_id: str) -> int:
        """Close the Run's pending requests as cancelled, inside the caller's transaction (the Run's
        cancel); returns how many were closed."""
        pending = self.rows.pending_of_run(tx, run_id)
        for request_id in pending:  # the Run's row is locked: they stay pending until closed here
            self._set_status(tx, request_id, "cancelled", self.clock.now())
        return len(pending)

    def stranded(self, decided_before: float, limit: int = 200) -> list[HitlRequest]:
        """The newest request of each Run that waits in AWAITING_HITL with no pending request, decided
        (or closed) before `decided_before`: a decision whose Run did not move. Deciding commits the Run's
        move with the decision, so only a database written by an older version, or damaged, has any; the
        sweeper carries them out (`RunManager.resume_decisions`)."""
        return self.rows.stranded(decided_before, limit)

    def open_escalation(self, tx: Tx, request: HitlRequest) -> HitlRequest:
        """Open the L4 request that replaces an escalated L3 one, inside the caller's transaction."""
        now = self.clock.now()
        escalated = self.new_request(request.run_id, request.tenant_id, request.requester, "L4", request.actions)
        self.insert(tx, escalated, escalated_from=request.request_id)
        self.rows.trace(tx, [HITLTrace(
            run_id=request.run_id, request_id=escalated.request_id, event="escalated", level="L4",
            actions_hash=request.actions_hash, waited_s=round(now - request.created_at, 3),
            timeout_action="escalate", reason=f"L3 request {request.request_id} timed out").to_record()], now)
        return escalated

    def approved_for(self, run_id: str, actions_hash_: str) -> HitlRequest | None:
        """The Run's approved request for exactly these actions, if any: the original request or the
        escalation that replaced it (both bind the same actions hash)."""
        for request in reversed(self.for_run(run_id)):
            if request.status == "approved" and request.actions_hash == actions_hash_:
                return request
        return None


@dataclass(frozen=True)
class Expiry:
    """What applying a request's deadline did."""

    outcome: Literal["timed_out", "escalated", "lost", "orphaned"]
    request: HitlRequest
    escalated: HitlRequest | None = None
    transition: TransitionResult | None = None
