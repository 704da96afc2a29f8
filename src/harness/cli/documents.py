"""The one JSON document of a Run that every command prints for it (`run`, `runs show`, `cancel`, `approve`,
`reject`): the same Run gives the same document whichever command asked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.kernel.states import RunState

if TYPE_CHECKING:
    from harness.stores import SqlStore


def run_document(store: SqlStore, run_id: str) -> dict[str, Any]:
    """What the Run holds now: state and outcome (answer, artifacts, the files its sandboxed skills kept,
    error, the request it waits on), who asked (and for which team), its path of transitions with their
    times, the legacy job status and its recorded cost. Times are epoch seconds here; `emit` writes them as
    ISO 8601 in UTC."""
    from harness.domain.contracts import effects_of
    from harness.pipeline.artifacts import files_of, streams_of
    from harness.stores import approval_rows, cost_ledger

    run = store.get_run(run_id)
    path = store.transitions_of(run_id)
    status, snapshot = store.legacy_job(run_id)
    stored = run.result or {}
    pending = [r for r in approval_rows(store).for_run(run_id) if r.status == "pending"] \
        if run.state == RunState.AWAITING_HITL else []
    return {
        "run_id": run.run_id,
        "trace_id": run.run_id,
        "state": run.state.value,
        "close_reason": run.close_reason.value if run.close_reason else None,
        "answer": stored.get("answer"),
        "artifacts": stored.get("artifacts", {}),
        "files": [f.model_dump(mode="json") for f in files_of(run.context)],
        "streams": streams_of(run.context),
        "error": stored.get("error"),
        "approval_request_id": pending[-1].request_id if pending else None,
        "effects": list(effects_of(run.context)),
        "tenant_id": run.tenant_id,
        "user_id": run.user_id,
        "session_id": run.session_id,
        "team_id": run.request.get("team_id"),
        "retry_of": run.retry_of,
        "created_at": run.created_at,
        "last_state_change_at": run.last_state_change_at,
        "path": [t.to_state.value for t in path],
        "transitions": [
            {"seq": t.seq, "from": t.from_state.value if t.from_state else None, "to": t.to_state.value,
             "at": t.at, "actor": t.actor, "reason": t.reason, "forced_by": t.forced_by}
            for t in path
        ],
        "legacy_status": status,
        "legacy_job": {"status": status, "run_state_snapshot": snapshot},
        "result": run.result,
        "cost": cost_ledger(store).run_total(run_id).to_dict(),
    }
