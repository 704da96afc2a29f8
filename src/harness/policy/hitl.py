"""Human approval requests and decisions (SPEC G2-G6).

A request names the Run, the level, who may decide, the deadline and the exact actions (with their
hash). A decision is persisted before it drives the state machine (G4) and is refused unless it is
bound to that Run, to the same actions hash, and comes from an authenticated identity of the same
tenant with the level's role; the requester cannot approve its own L3/L4 request; one person counts
once; L4 needs two distinct approvers; any reject is final. Break-glass (G5) lets a permitted
identity complete the approval without waiting for a second approver; it is marked in the trace.
Request status changes are compare-and-set (`WHERE status = 'pending'`), so a decision, a timeout
and a cancel on the same request resolve to exactly one outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore, TraceRecordIn
from harness.audit import mirror_records
from harness.audit.chain import canonical_json, content_hash
from harness.errors import BadInputError
from harness.ids import ordered_id
from harness.pipeline.contracts import CallerIdentity, Plan
from harness.pipeline.trace_recorder import HITLTrace
from harness.policy.config import Hitl, Level

BREAK_GLASS_ROLE = "break_glass"


class UnknownRequestError(BadInputError):
    """No approval request has this id (in the caller's tenant)."""


@dataclass(frozen=True)
class HitlRequest:
    """An approval request as stored."""

    request_id: str
    run_id: str
    tenant_id: str
    requester: str
    level: Level
    required_approvals: int
    approver_roles: tuple[str, ...]
    actions: list[dict[str, Any]]
    actions_hash: str
    status: str
    created_at: float
    deadline_at: float


@dataclass(frozen=True)
class Decision:
    """What happened to a submitted decision."""

    request: HitlRequest
    accepted: bool
    effect: Literal["approved", "rejected", "recorded", "refused"]
    refusal: str | None
    approvals: int
    trace: HITLTrace


def plan_actions(plan: Plan) -> list[dict[str, Any]]:
    """The exact actions a plan would take, as an approver sees them and the hash binds them."""
    return [{"step_id": s.id, "skill": s.tool_call.skill, "arguments": s.tool_call.arguments} for s in plan.steps]


def actions_hash(run_id: str, actions: list[dict[str, Any]]) -> str:
    """Hash binding a decision to one Run and its exact actions (G4)."""
    return content_hash({"run_id": run_id, "actions": actions})


def _request_from_row(row: sa.Row[Any]) -> HitlRequest:
    m = row._mapping
    return HitlRequest(
        request_id=m["request_id"], run_id=m["run_id"], tenant_id=m["tenant_id"], requester=m["requester"],
        level=m["level"], required_approvals=m["required_approvals"],
        approver_roles=tuple(json.loads(m["approver_roles"])), actions=json.loads(m["actions"]),
        actions_hash=m["actions_hash"], status=m["status"], created_at=m["created_at"],
        deadline_at=m["deadline_at"],
    )


class HitlDesk:
    """Opens approval requests and judges decisions, timeouts and cancellations on them."""

    def __init__(self, store: SqlStore, settings: Hitl) -> None:
        self.store = store
        self.settings = settings

    # ------------------------------------------------------------------ requests

    def pending_count(self, tenant_id: str, requester: str) -> int:
        """How many requests of this requester still wait (for the per-requester rate limit)."""
        with self.store.reader.connect() as conn:
            return int(conn.execute(
                sa.select(sa.func.count()).select_from(t.hitl_requests).where(
                    t.hitl_requests.c.tenant_id == tenant_id, t.hitl_requests.c.requester == requester,
                    t.hitl_requests.c.status == "pending")
            ).scalar_one())

    def new_request(self, run_id: str, tenant_id: str, requester: str, level: Level,
                    actions: list[dict[str, Any]]) -> HitlRequest:
        """A request ready to be inserted (in the AWAITING_HITL transition, see `insert`)."""
        now = self.store.clock.now()
        roles = () if level == "L2" else tuple(self.settings.approvers.get(level, ()))
        return HitlRequest(
            request_id=ordered_id(), run_id=run_id, tenant_id=tenant_id, requester=requester, level=level,
            required_approvals=2 if level == "L4" else 1, approver_roles=roles, actions=actions,
            actions_hash=actions_hash(run_id, actions), status="pending", created_at=now,
            deadline_at=now + self.settings.timeout_s,
        )

    def insert(self, conn: sa.Connection, request: HitlRequest, escalated_from: str | None = None) -> None:
        """Insert a request inside the caller's transaction, with the record that chains it."""
        row = dict(
            request_id=request.request_id, run_id=request.run_id, tenant_id=request.tenant_id,
            requester=request.requester, level=request.level, required_approvals=request.required_approvals,
            approver_roles=json.dumps(list(request.approver_roles)), actions=canonical_json(request.actions),
            actions_hash=request.actions_hash, status="pending", created_at=request.created_at,
            deadline_at=request.deadline_at, decided_at=None, escalated_from=escalated_from,
        )
        conn.execute(t.hitl_requests.insert().values(**row))
        self._chain(conn, mirror_records.HITL_REQUEST, mirror_records.hitl_request(row), request.run_id)

    def _chain(self, conn: sa.Connection, kind: str, payload: dict[str, Any], run_id: str) -> None:
        """Chain a row as it now stands, in the transaction that wrote it (audit.mirror_records)."""
        self.store.enqueue(conn, [TraceRecordIn(kind, payload, run_id)], self.store.clock.now())

    def _set_status(self, conn: sa.Connection, request_id: str, status: str, now: float) -> bool:
        """Compare-and-set a pending request to `status` and chain the request as it now is; False when
        something else decided it first."""
        moved = conn.execute(t.hitl_requests.update().where(
            t.hitl_requests.c.request_id == request_id, t.hitl_requests.c.status == "pending")
            .values(status=status, decided_at=now)).rowcount == 1
        if moved:
            row = conn.execute(sa.select(t.hitl_requests).where(t.hitl_requests.c.request_id == request_id)).one()
            self._chain(conn, mirror_records.HITL_REQUEST, mirror_records.hitl_request(row._mapping), row.run_id)
        return moved

    def get(self, request_id: str, tenant_id: str | None = None) -> HitlRequest:
        """The request with this id (in this tenant, when given); UnknownRequestError otherwise."""
        query = sa.select(t.hitl_requests).where(t.hitl_requests.c.request_id == request_id)
        if tenant_id is not None:
            query = query.where(t.hitl_requests.c.tenant_id == tenant_id)
        with self.store.reader.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise UnknownRequestError(f"no approval request with id {request_id!r}")
        return _request_from_row(row)

    def for_run(self, run_id: str) -> list[HitlRequest]:
        """A Run's requests, oldest first."""
        with self.store.reader.connect() as conn:
            rows = conn.execute(sa.select(t.hitl_requests).where(t.hitl_requests.c.run_id == run_id)
                                .order_by(t.hitl_requests.c.created_at)).all()
        return [_request_from_row(r) for r in rows]

    def pending(self, tenant_id: str | None = None, limit: int = 200) -> list[HitlRequest]:
        """Requests still waiting, oldest deadline first."""
        query = (sa.select(t.hitl_requests).where(t.hitl_requests.c.status == "pending")
                 .order_by(t.hitl_requests.c.deadline_at).limit(limit))
        if tenant_id is not None:
            query = query.where(t.hitl_requests.c.tenant_id == tenant_id)
        with self.store.reader.connect() as conn:
            return [_request_from_row(r) for r in conn.execute(query)]

    def due(self, now: float, limit: int = 500) -> list[HitlRequest]:
        """Pending requests whose deadline has passed."""
        with self.store.reader.connect() as conn:
            rows = conn.execute(sa.select(t.hitl_requests).where(
                t.hitl_requests.c.status == "pending", t.hitl_requests.c.deadline_at <= now)
                .order_by(t.hitl_requests.c.deadline_at).limit(limit)).all()
        return [_request_from_row(r) for r in rows]

    def approvals(self, request_id: str) -> list[str]:
        """Approvers whose approval of this request was accepted."""
        with self.store.reader.connect() as conn:
            return list(conn.execute(sa.select(t.hitl_decisions.c.approver).where(
                t.hitl_decisions.c.request_id == request_id, t.hitl_decisions.c.decision == "approve",
                t.hitl_decisions.c.outcome == "accepted")).scalars())

    # ------------------------------------------------------------------ decisions

    def decide(self, request_id: str, approver: CallerIdentity, decision: Literal["approve", "reject"], *,
               approved_hash: str | None = None, break_glass: bool = False, reason: str = "") -> Decision:
        """Judge and persist one decision. Accepted approvals that complete the request and accepted
        rejects close the request; the caller then drives the Run (the decision is already durable)."""
        request = self.get(request_id)
        who = f"{approver.tenant_id}/{approver.user_id}"
        refusal = self._refusal(request, approver, decision, approved_hash, break_glass, reason)
        now = self.store.clock.now()
        prior = self.approvals(request_id)
        effect: Literal["approved", "rejected", "recorded", "refused"] = "refused"
        with self.store.engine.begin() as conn:
            if refusal is None:
                count = len(prior) + (1 if decision == "approve" else 0)
                complete = decision == "reject" or count >= request.required_approvals or break_glass
                if complete:
                    status = "approved" if decision == "approve" else "rejected"
                    if not self._set_status(conn, request_id, status, now):
                        refusal = "the request was decided, timed out or cancelled concurrently"
                    else:
                        effect = "approved" if status == "approved" else "rejected"
                else:
                    effect = "recorded"
            decided = dict(
                decision_id=ordered_id(), request_id=request_id, run_id=request.run_id, approver=who,
                decision=decision, actions_hash=approved_hash or request.actions_hash, break_glass=break_glass,
                reason=reason, outcome="refused" if refusal else "accepted", refusal=refusal, at=now,
            )
            conn.execute(t.hitl_decisions.insert().values(**decided))
            self._chain(conn, mirror_records.HITL_DECISION, mirror_records.hitl_decision(decided), request.run_id)
            trace = HITLTrace(
                run_id=request.run_id, request_id=request_id, event="refused" if refusal else decision,
                level=request.level, approver=who, actions_hash=request.actions_hash,
                waited_s=round(now - request.created_at, 3), break_glass=break_glass,
                reason=refusal or reason,
            )
            self.store.enqueue(conn, [trace.to_record()], now)
            if refusal:
                self.store.write_audit(conn, request.run_id, "hitl_decision_refused", who,
                                       {"request_id": request_id, "decision": decision, "refusal": refusal})
        approvals = len(prior) + (1 if decision == "approve" and refusal is None else 0)
        return Decision(request, refusal is None, effect if refusal is None else "refused", refusal, approvals,
                        trace)

    def _refusal(self, request: HitlRequest, approver: CallerIdentity, decision: str, approved_hash: str | None,
                 break_glass: bool, reason: str) -> str | None:
        """Why this decision may not count, or None when it may."""
        if approver.tenant_id != request.tenant_id:
            return "approver belongs to another tenant"
        if request.status != "pending":
            return f"the request is already {request.status}"
        if self.store.clock.now() >= request.deadline_at:
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
                if f"{approver.tenant_id}/{approver.user_id}" in self.approvals(request.request_id):
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

    def close(self, request_id: str, status: Literal["timed_out", "cancelled", "escalated"]) -> bool:
        """Compare-and-set a pending request to a closing status; False when something else won."""
        with self.store.engine.begin() as conn:
            return self._set_status(conn, request_id, status, self.store.clock.now())
