"""The rows a Run's writes are made of, built from their values alone (no connection, no clock): a new Run's
row and its record, the columns of a compare-and-set, and a state change's transition row and trace
record. harness.adapters.sql.store_runs writes them, in its transactions."""

from __future__ import annotations

import json
from typing import Any

from harness.adapters.sql.documents import encode_context
from harness.domain.chain import canonical_json
from harness.domain.records import UNSET, NewRun, RunRecord
from harness.kernel.states import RunState


def new_run_row(new: NewRun, now: float, request: str) -> dict[str, Any]:
    """The runs row of a Run created now in CREATED, with its request as canonical JSON."""
    return {
        "run_id": new.run_id,
        "tenant_id": new.tenant_id,
        "user_id": new.user_id,
        "session_id": new.session_id,
        "state": RunState.CREATED.value,
        "close_reason": None,
        "version": 0,
        "retry_of": new.retry_of,
        "parent_run_id": new.parent_run_id,
        "idempotency_key": new.idempotency_key,
        "created_at": now,
        "last_state_change_at": now,
        "deadline_at": new.deadline_at,
        "lease_epoch": 0,
        "stall_count": 0,
        "request": request,
        # named only when there is one: a Run without a body hash inserts exactly the columns
        # it did before migration 0011 (the older migrations' tests drive Runs at old revisions)
        **({"request_hash": new.request_hash} if new.request_hash is not None else {}),
        **({"start_by": new.start_by} if new.start_by is not None else {}),
    }


def created_record(new: NewRun, now: float, request: str) -> RunRecord:
    """The record of the row `new_run_row` wrote, without reading it back."""
    return RunRecord(
        run_id=new.run_id, tenant_id=new.tenant_id, user_id=new.user_id, session_id=new.session_id,
        state=RunState.CREATED, close_reason=None, version=0, retry_of=new.retry_of,
        parent_run_id=new.parent_run_id, idempotency_key=new.idempotency_key, created_at=now,
        last_state_change_at=now, deadline_at=new.deadline_at, lease_owner=None, lease_epoch=0,
        stall_count=0, request=json.loads(request), context=None, result=None,
    )


def documents(context: dict[str, Any] | None, result: dict[str, Any] | None, *,
              packs: bool) -> dict[str, str | bytes | None]:
    """The RunContext and result columns a compare-and-set writes: those given (UNSET: left as they are),
    as canonical JSON (a long context packed where `packs`, harness.adapters.sql.documents), None
    clearing one."""
    values: dict[str, str | bytes | None] = {}
    if context is not UNSET:
        values["context"] = None if context is None else encode_context(context, packs=packs)
    if result is not UNSET:
        values["result"] = None if result is None else canonical_json(result)
    return values


def transition_row(run_id: str, seq: int, source: RunState | None, target: RunState, actor: str, reason: str,
                   forced_by: str | None, now: float) -> dict[str, Any]:
    """The transitions row of a state change (`source` None: the Run's creation)."""
    return {"run_id": run_id, "seq": seq, "from_state": source.value if source else None, "to_state": target.value,
            "actor": actor, "reason": reason, "forced_by": forced_by, "at": now}
