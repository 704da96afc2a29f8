"""What is pushed, to whom, and when (SPEC P4 / N1; seed 004 §4.1 ⑩ HITL request, ⑱ ResultSink).

`WebhookNotifier` (the Notifier port) queues one delivery per endpoint: the Run's callback, and the
endpoints of the tenant's approvers of the request's roles. `WebhookResultSink` (the ResultSink port)
pushes a Run's result to its callback through it. `PushEvents` hangs both off the two places where what
they tell about is written: the state machine's transaction hook (every applied change: a park in
AWAITING_HITL, a decision's, a timeout's or a cancel's way out of it, and every close — a success, a
reject, a cancel, an approval timeout or the sweeper's) and the approval desk's insert hook (a request
opened or escalated). Each runs inside that change's transaction, so an event exists exactly when its
change does.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

from harness.domain.contracts import Notification, NotificationType, RunRequest, RunResult, effects_of
from harness.domain.ids import ordered_id
from harness.domain.webhooks import OutgoingEvent
from harness.kernel.states import FINAL, RunState
from harness.ports import ResultSink, Tx
from harness.ports.webhooks import WebhookQueue
from harness.webhooks.config import WebhookConfig

if TYPE_CHECKING:
    from harness.domain.approvals import HitlRequest

S = RunState
#: how the approval levels (SPEC G2) read as a risk to someone outside
RISK_OF_LEVEL = {"L1": "low", "L2": "medium", "L3": "high", "L4": "critical"}
#: the event a change out of AWAITING_HITL is, by where it goes
_LEAVING_HITL: dict[RunState, NotificationType] = {
    S.EXECUTING: "approval.decided", S.REJECTED: "approval.decided",
    S.TIMEOUT: "approval.timed_out", S.CANCELLED: "approval.cancelled",
}


def iso(seconds: float) -> str:
    """An epoch time as ISO 8601 in UTC."""
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def describe_actions(actions: list[dict[str, Any]]) -> str:
    """The actions an approval covers, in one line a person reads: `skill(arg=value, …); …`."""
    def call(action: dict[str, Any]) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(action.get("arguments", {}).items()))
        return f"{action.get('skill')}({args})"
    return "; ".join(call(a) for a in actions)


class WebhookNotifier:
    """The Notifier port over the webhook outbox: one delivery per endpoint the notification goes to."""

    def __init__(self, outbox: WebhookQueue, config: WebhookConfig) -> None:
        self.outbox = outbox
        self.config = config

    def notify(self, tx: Tx, notification: Notification) -> None:
        """Queue the notification for the Run's callback and the matching approver endpoints, within `tx`."""
        body = {"type": notification.type, "event_id": notification.event_id,
                "timestamp": iso(self.outbox.clock.now()), "data": notification.data}
        events = []
        caller = self.config.caller_endpoint(notification.tenant_id)
        if notification.callback is not None and caller is not None:
            events.append(self._event(notification, caller, notification.callback, body))
        for endpoint in self.config.approvers_for(notification.tenant_id, notification.approver_roles):
            events.append(self._event(notification, endpoint.key, endpoint.url, body))
        self.outbox.enqueue(tx, events)

    @staticmethod
    def _event(n: Notification, endpoint: str, url: str, body: dict[str, Any]) -> OutgoingEvent:
        return OutgoingEvent(n.event_id, n.type, n.run_id, n.tenant_id, endpoint, url, body)


class WebhookResultSink:
    """The ResultSink port over the same webhooks: a Run's result goes to its callback."""

    def __init__(self, notifier: WebhookNotifier) -> None:
        self.notifier = notifier

    def deliver(self, tx: Tx, result: RunResult, request: RunRequest) -> None:
        """Queue the result for the Run's callback (nothing when it has none), within `tx`."""
        if request.callback is None:
            return
        kind: NotificationType = "run.finished" if result.state in {s.value for s in FINAL} \
            else "run.awaiting_approval"
        data = {**result.model_dump(mode="json"), "final": kind == "run.finished",
                "links": {"run": self.notifier.config.console_link(f"/ui/runs/{result.run_id}"),
                          "api": self.notifier.config.console_link(f"/api/v1/runs/{result.run_id}"),
                          "trace": self.notifier.config.console_link(f"/api/v1/runs/{result.run_id}/trace")}}
        self.notifier.notify(tx, Notification(event_id=ordered_id(), type=kind, tenant_id=request.tenant_id,
                                              run_id=result.run_id, callback=request.callback, data=data))


class PushEvents:
    """The hooks that turn committed changes into notifications, inside their transactions."""

    def __init__(self, notifier: WebhookNotifier, sink: ResultSink) -> None:
        self.notifier = notifier
        self.sink = sink
        self.outbox = notifier.outbox

    # ------------------------------------------------------------------ the state machine's hook

    def on_transition(self, tx: Tx, run_id: str, source: RunState, target: RunState) -> None:
        """A change just applied in `tx`: push a park, a way out of an approval, or a close."""
        leaving = _LEAVING_HITL.get(target) if source == S.AWAITING_HITL else None
        if target != S.AWAITING_HITL and target not in FINAL and leaving is None:
            return
        snapshot = self.outbox.run_snapshot(tx, run_id)
        if snapshot is None:
            return
        run, path = snapshot
        request = RunRequest.model_validate(run["request"])
        if leaving is not None:
            found = self.outbox.latest_request(tx, run_id)
            if found is not None:
                self._approval(tx, leaving, found, request.callback, outcome=target)
        if target == S.AWAITING_HITL or target in FINAL:
            stored = run["result"] or {}
            pending = self.outbox.latest_request(tx, run_id) if target == S.AWAITING_HITL else None
            # a cancel's push lists the calls with side effects that had started before it took effect
            effects = effects_of(self.outbox.run_context(tx, run_id)) if target == S.CLOSED_CANCELLED else ()
            result = RunResult(
                run_id=run_id, state=target.value, answer=stored.get("answer"),
                artifacts=stored.get("artifacts", {}), files=tuple(stored.get("files", ())), trace_id=run_id,
                error=stored.get("error"),
                approval_request_id=pending["request_id"] if pending and pending["status"] == "pending" else None,
                path=tuple(path), effects=effects)
            self.sink.deliver(tx, result, request)

    # ------------------------------------------------------------------ the approval desk's hook

    def on_request(self, tx: Tx, request: HitlRequest, escalated_from: str | None) -> None:
        """An approval request was just inserted in `tx`: push it (opened, or escalated from another)."""
        snapshot = self.outbox.run_snapshot(tx, request.run_id)
        callback = RunRequest.model_validate(snapshot[0]["request"]).callback if snapshot else None
        row = {"request_id": request.request_id, "run_id": request.run_id, "tenant_id": request.tenant_id,
               "requester": request.requester, "level": request.level,
               "required_approvals": request.required_approvals,
               "approver_roles": list(request.approver_roles), "actions": request.actions,
               "actions_hash": request.actions_hash, "status": request.status,
               "created_at": request.created_at, "deadline_at": request.deadline_at,
               "escalated_from": escalated_from, "decisions": []}
        self._approval(tx, "approval.escalated" if escalated_from else "approval.requested", row, callback)

    # ------------------------------------------------------------------ payloads

    def _approval(self, tx: Tx, kind: NotificationType, request: dict[str, Any], callback: str | None,
                  outcome: RunState | None = None) -> None:
        roles = request["approver_roles"]
        roles = tuple(roles) if isinstance(roles, list | tuple) else tuple(_json_list(roles))
        actions = request["actions"] if isinstance(request["actions"], list) else _json_list(request["actions"])
        config, request_id = self.notifier.config, request["request_id"]
        inbox = f"/ui/approvals?request={request_id}"
        data: dict[str, Any] = {
            "request_id": request_id, "run_id": request["run_id"], "level": request["level"],
            "risk_level": RISK_OF_LEVEL.get(request["level"], request["level"]),
            "description": describe_actions(actions), "actions": actions, "actions_hash": request["actions_hash"],
            "requester": request["requester"], "required_approvals": request["required_approvals"],
            "approver_roles": list(roles), "status": request["status"],
            "created_at": iso(request["created_at"]), "deadline": iso(request["deadline_at"]),
            "escalated_from": request.get("escalated_from"),
            "links": {"console": config.console_link(inbox),
                      "approve": config.console_link(f"{inbox}&decision=approve"),
                      "reject": config.console_link(f"{inbox}&decision=reject"),
                      "api": config.console_link(f"/api/v1/approvals/{request_id}/decision")},
        }
        if kind == "approval.decided":
            data["decision"] = "approved" if outcome == S.EXECUTING else "rejected"
            data["decided_by"] = [d["approver"] for d in request.get("decisions", [])]
            data["break_glass"] = any(bool(d["break_glass"]) for d in request.get("decisions", []))
        self.notifier.notify(tx, Notification(
            event_id=ordered_id(), type=kind, tenant_id=request["tenant_id"], run_id=request["run_id"],
            callback=callback, approver_roles=roles, data=data))


def _json_list(raw: Any) -> list[Any]:
    value = json.loads(raw) if isinstance(raw, str) else raw
    return list(value or [])
