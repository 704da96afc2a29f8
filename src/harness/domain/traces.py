"""The trace record kinds (SPEC A1): value types, serialised into the outbox by `to_record`."""


from __future__ import annotations

import hashlib
import traceback
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict

from harness.domain.chain import content_hash
from harness.domain.records import TraceRecordIn

STEP_NAMES = {
    1: "create_run", 2: "assemble_context", 3: "load_skills", 4: "plan",
    5: "policy", 6: "tools", 7: "hitl", 8: "trace",
}


class TraceModel(BaseModel):
    """Base of the trace record kinds; `kind` names the record family."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    #: leave None fields (nested ones too) out of the payload; for kinds whose records are many-fielded
    compact: ClassVar[bool] = False
    kind: str
    run_id: str

    def to_record(self) -> TraceRecordIn:
        """This record, ready for the outbox."""
        payload = self.model_dump(mode="json", exclude={"kind"}, exclude_none=self.compact)
        return TraceRecordIn(self.kind, payload, self.run_id)


class StepTrace(TraceModel):
    """One pipeline step: number, input/output hashes, duration and status."""

    kind: Literal["step"] = "step"
    step: int
    name: str
    input_hash: str
    output_hash: str
    duration_ms: float
    status: Literal["ok", "error", "skipped"]
    detail: str = ""


class ToolTrace(TraceModel):
    """One tool call: skill, version, manifest hash, argument/result hashes, attempts, error code."""

    kind: Literal["tool"] = "tool"
    step_id: str
    skill_id: str
    skill_version: str
    manifest_hash: str
    call_kind: Literal["local", "sandbox", "llm", "agent", "mcp"] = "local"
    idempotency_key: str
    arguments_hash: str
    result_hash: str | None
    attempts: int
    duration_ms: float
    status: Literal["ok", "error", "refused"]
    error_code: str | None = None
    fallback_from: str | None = None
    isolation: str | None = None  # sandbox calls: "bwrap", or "rlimit" (the weaker fallback)
    child_run_id: str | None = None  # agent calls: the child Run (T4)
    #: whether the skill may be run again for the same step (T6); reconcile flags a non-idempotent step
    #: called more than once. None in records written before it was recorded.
    idempotent: bool | None = None


class PolicyVerdict(BaseModel):
    """One rule's verdict inside a PolicyTrace."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rule_id: str
    family: str
    decision: str
    reason: str
    step_id: str | None = None
    level: str | None = None


class PolicyTrace(TraceModel):
    """One policy evaluation: the unified decision, the highest level and every rule's verdict (G1).

    Its payload leaves None fields out, so a verdict without a step or a level costs no bytes for them."""

    compact: ClassVar[bool] = True
    kind: Literal["policy"] = "policy"
    decision: str
    level: str | None = None
    verdicts: tuple[PolicyVerdict, ...]
    duration_us: float = 0.0


def policy_verdicts(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rule verdicts of a "policy" record's payload, each with every PolicyVerdict field (None if absent).

    Reads both shapes: one record per evaluation carrying `verdicts`, and the one-verdict-per-record
    payloads (rule_id, family, decision, ... at the top) that databases written before it hold."""
    entries = payload.get("verdicts", [payload])
    return [{name: entry.get(name) for name in PolicyVerdict.model_fields} for entry in entries]


class HITLTrace(TraceModel):
    """A human decision, a timeout or an escalation."""

    kind: Literal["hitl"] = "hitl"
    request_id: str
    event: Literal["requested", "approve", "reject", "timeout", "escalated", "refused", "cancelled"]
    level: str
    approver: str | None = None
    actions_hash: str
    waited_s: float = 0.0
    timeout_action: str | None = None
    break_glass: bool = False
    reason: str = ""


#: the shape of CostTrace payloads this version writes. 1 (before it): source, input/output tokens, usd,
#: tenant and user. 2: also API calls, sandbox seconds, the unit price applied (and whether the model was
#: priced), the model, the skill and the parent Run. Chained records keep the shape they were written in
#: (their hashes cover those bytes); `cost_fields` reads both.
COST_TRACE_VERSION: Final = 2


class CostTrace(TraceModel):
    """What one call spent (seed 004 §3.6): tokens, API calls, sandbox seconds, the unit price applied and
    its scope — tenant, user, skill, Run and parent Run."""

    compact: ClassVar[bool] = True
    kind: Literal["cost"] = "cost"
    v: Literal[2] = COST_TRACE_VERSION
    source: str
    input_tokens: int = 0
    output_tokens: int = 0
    api_calls: int = 0
    sandbox_s: float = 0.0
    usd: float = 0.0
    #: what the usd was computed from: input_per_mtok / output_per_mtok (model calls) or sandbox_per_s,
    #: and the price table's date
    unit_price: dict[str, float | str] | None = None
    priced: bool = True
    model: str | None = None
    tenant_id: str
    user_id: str
    skill_id: str | None = None
    parent_run_id: str | None = None


def unit_price(usage: Any) -> dict[str, float | str] | None:
    """The unit price an LLM call's usage was priced at, for its CostTrace (None when it had none)."""
    price: dict[str, float | str] = {}
    for name in ("input_per_mtok", "output_per_mtok"):
        if getattr(usage, name, None) is not None:
            price[name] = float(getattr(usage, name))
    if getattr(usage, "price_table", None):
        price["table"] = str(usage.price_table)
    return price or None


def cost_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A "cost" record's payload with every CostTrace field, whatever shape (version) it was written in:
    version 1 payloads read as one priced cost with no API calls, no sandbox seconds and no skill."""
    fields = {name: payload.get(name, field.default) for name, field in CostTrace.model_fields.items()
              if name not in ("kind",)}
    fields["v"] = int(payload.get("v", 1))
    return fields


class ErrorTrace(TraceModel):
    """A normalised error: code, message, stack hash and retry history."""

    kind: Literal["error"] = "error"
    step: int
    error_code: str
    message: str
    stack_hash: str | None = None
    retries: int = 0


def error_trace(run_id: str, step: int, code: str, exc: BaseException | str, retries: int = 0) -> ErrorTrace:
    """An ErrorTrace for an exception (its stack hashed, so equal failures group) or a message."""
    if isinstance(exc, BaseException):
        stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return ErrorTrace(run_id=run_id, step=step, error_code=code, message=str(exc) or type(exc).__name__,
                          stack_hash=hashlib.sha256(stack.encode()).hexdigest(), retries=retries)
    return ErrorTrace(run_id=run_id, step=step, error_code=code, message=exc, retries=retries)


def step_trace(run_id: str, step: int, inputs: Any, outputs: Any, duration_ms: float,
               status: Literal["ok", "error", "skipped"] = "ok", detail: str = "") -> StepTrace:
    """A StepTrace with inputs and outputs referenced by hash."""
    return StepTrace(run_id=run_id, step=step, name=STEP_NAMES[step], input_hash=content_hash(inputs),
                     output_hash=content_hash(outputs), duration_ms=round(duration_ms, 3), status=status,
                     detail=detail)
