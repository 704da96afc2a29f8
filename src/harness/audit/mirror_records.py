"""The chained record each operational row mirrors, as a payload built from the row (SPEC A1, A3).

People read rows (`runs show`, the console, the API); the chain proves records. Every row that
mirrors a record is written in the same transaction as its record, and `harness audit verify` builds
the payload the row implies with these functions and compares it, field by field, with the chained
one. One function per table, used on both sides: by the writers of the mirror records that exist only
to chain a row (approval requests and decisions) and by the verifier for every table.

Pure functions over row mappings (column name -> value); no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: record kinds that exist only to chain a row: an approval request as it stands after each write
#: (created, then decided, timed out, cancelled or escalated), and every approval decision
HITL_REQUEST = "hitl_request"
HITL_DECISION = "hitl_decision"

_REQUEST_FIELDS = ("request_id", "tenant_id", "requester", "level", "required_approvals", "actions_hash",
                   "status", "created_at", "deadline_at", "decided_at", "escalated_from")
_DECISION_FIELDS = ("decision_id", "request_id", "approver", "decision", "actions_hash", "reason", "outcome",
                    "refusal", "at")


def _json(text: Any) -> Any:
    """A JSON text column, parsed (a value that does not parse is kept as text, so a diff shows it)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def transition(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The "transition" record a transitions row mirrors (its run_id is the record's own)."""
    return {"seq": row["seq"], "from": row["from_state"], "to": row["to_state"], "actor": row["actor"],
            "reason": row["reason"], "forced_by": row["forced_by"], "at": row["at"]}


def audit_event(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The "audit" record an audit_events row mirrors."""
    return {"event_id": row["event_id"], "event": row["event"], "actor": row["actor"],
            "detail": _json(row["detail"]), "at": row["at"]}


def cost(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The CostTrace ("cost" record) a costs row mirrors."""
    return {"source": row["source"], "input_tokens": row["input_tokens"], "output_tokens": row["output_tokens"],
            "usd": row["usd"], "tenant_id": row["tenant_id"], "user_id": row["user_id"]}


def hitl_request(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The "hitl_request" record of an approval request row. Its actions are chained by hash: the
    actions_hash binds them to the Run (policy.hitl.actions_hash), and the verifier recomputes it."""
    doc = {name: row[name] for name in _REQUEST_FIELDS}
    doc["approver_roles"] = _json(row["approver_roles"])
    return doc


def hitl_decision(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The "hitl_decision" record of an approval decision row."""
    doc = {name: row[name] for name in _DECISION_FIELDS}
    doc["break_glass"] = bool(row["break_glass"])
    return doc
