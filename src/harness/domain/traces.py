"""The trace record kinds (SPEC A1): value types, serialised into the outbox by `to_record`.

Trace format 2 (issue 20) changed two shapes; the chain hashes whatever bytes a record was written in, so
every chain written before keeps verifying, and the readers here read both shapes:

- a StepTrace is no longer a record of its own: it rides in the "transition" record of the transition that
  ends its step, as an entry of its `steps` list (`fold_steps`; read back with `step_entries`);
- a ToolTrace and an "llm" record leave their None fields out;
- a PolicyTrace names the rule set by hash and lists only the verdicts that did not simply pass (a pass at
  L1 or with no level, of a rule judged for every plan or call), with the count of those that did
  (`policy_trace`, `policy_passed`).
"""


from __future__ import annotations

import hashlib
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict

from harness.domain.chain import content_hash
from harness.domain.costs import COST_TRACE_VERSION
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


#: the trace format this version writes (see the module's docstring)
TRACE_FORMAT: Final = 2
#: the kind of a StepTrace: a record of its own in format 1, an entry of a "transition" record in format 2
STEP: Final = "step"
#: the key of a "transition" record's payload that holds the StepTraces of the steps it ends (format 2)
STEPS_KEY: Final = "steps"


class StepTrace(TraceModel):
    """One pipeline step: number, input/output hashes, duration and status."""

    kind: Literal["step"] = STEP
    step: int
    name: str
    input_hash: str
    output_hash: str
    duration_ms: float
    status: Literal["ok", "error", "skipped"]
    detail: str = ""


class ToolTrace(TraceModel):
    """One tool call: skill, version, manifest hash, argument/result hashes, attempts, error code.

    Its payload leaves None fields out (trace format 2): a call that succeeded locally carries no error code,
    fallback, isolation or child Run."""

    compact: ClassVar[bool] = True
    kind: Literal["tool"] = "tool"
    step_id: str
    skill_id: str
    skill_version: str
    manifest_hash: str
    call_kind: Literal["local", "sandbox", "llm", "agent", "mcp"] = "local"
    idempotency_key: str
    arguments_hash: str
    result_hash: str | None = None
    attempts: int
    duration_ms: float
    status: Literal["ok", "error", "refused"]
    error_code: str | None = None
    fallback_from: str | None = None
    isolation: str | None = None  # sandbox calls: "bwrap", or "rlimit" (the weaker fallback)
    #: sandbox calls: the provider that ran it when not this host's own ("remote": a sandbox server)
    sandbox_provider: str | None = None
    child_run_id: str | None = None  # agent calls: the child Run (T4)
    #: sandbox calls: the content hashes of the files the call wrote and that were kept (the step's
    #: outcome lists them by name, size, media type and SHA-256)
    files: tuple[str, ...] | None = None
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
    """One policy evaluation (G1): the unified decision, the highest level, the rule set's hash and the
    verdicts that did not simply pass, with the count of those that did (`policy_trace` builds one).

    Its payload leaves None fields out, so a verdict without a step or a level costs no bytes for them."""

    compact: ClassVar[bool] = True
    kind: Literal["policy"] = "policy"
    v: Literal[2] = TRACE_FORMAT
    decision: str
    level: str | None = None
    #: the hash of the rule set the plan was judged by (the policy file and its Cedar policies)
    rules: str
    #: how many verdicts simply passed (not listed)
    passed: int = 0
    #: the verdicts that did not simply pass: rejections, approvals asked for, levels above L1
    verdicts: tuple[PolicyVerdict, ...]
    duration_us: float = 0.0


#: rules the policy engine judges only in a particular situation — a model with no price (passing means "allowed
#: with a warning"), a call that starts a child Run, a plan with no steps, a plan asking for another round:
#: their verdict says something even when it passes, so a PolicyTrace always lists it
SITUATIONAL_RULES: Final = frozenset({"budget.unpriced_model", "budget.delegation", "budget.rounds",
                                      "structural.direct_answer"})


def simply_passes(rule_id: str, decision: str, level: str | None) -> bool:
    """Whether a verdict is one a format-2 PolicyTrace counts rather than lists: a pass that asks for no
    approval, of a rule judged for every plan or call (not a situational one)."""
    return decision == "pass" and level in (None, "L1") and rule_id not in SITUATIONAL_RULES


def policy_trace(run_id: str, decision: str, level: str | None, verdicts: Iterable[Any], rules: str,
                 duration_us: float = 0.0) -> PolicyTrace:
    """The compact PolicyTrace of one evaluation: the rule set's hash, every verdict that did not simply
    pass, and how many did (a pass is what re-evaluating the same plan under the same rules gives again)."""
    listed: list[PolicyVerdict] = []
    passed = 0
    for v in verdicts:
        if simply_passes(v.rule_id, v.decision, v.level):
            passed += 1
        else:
            listed.append(PolicyVerdict.model_validate(v, from_attributes=True))
    return PolicyTrace(run_id=run_id, decision=decision, level=level, rules=rules, passed=passed,
                       verdicts=tuple(listed), duration_us=duration_us)


def policy_verdicts(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rule verdicts a "policy" record lists, each with every PolicyVerdict field (None if absent).

    Reads every shape: format 2 lists only the verdicts that did not simply pass (`policy_passed` counts
    the rest), format 1 every verdict of the evaluation, and the oldest databases one verdict per record
    (rule_id, family, decision, ... at the top)."""
    entries = payload.get("verdicts", [payload])
    return [{name: entry.get(name) for name in PolicyVerdict.model_fields} for entry in entries]


def policy_passed(payload: Mapping[str, Any]) -> int | None:
    """How many verdicts a format-2 "policy" record counts as simple passes without listing them; None for
    an older record, which lists every verdict."""
    passed = payload.get("passed")
    return int(passed) if passed is not None else None


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


def error_trace(run_id: str, step: int, code: str, exc: BaseException | str, retries: int = 0,
                message: str | None = None) -> ErrorTrace:
    """An ErrorTrace for an exception (its stack hashed, so equal failures group) or a message; `message`
    stands for the exception's own (one filtered for secrets)."""
    if isinstance(exc, BaseException):
        stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return ErrorTrace(run_id=run_id, step=step, error_code=code, message=message or str(exc) or type(exc).__name__,
                          stack_hash=hashlib.sha256(stack.encode()).hexdigest(), retries=retries)
    return ErrorTrace(run_id=run_id, step=step, error_code=code, message=exc, retries=retries)


def step_trace(run_id: str, step: int, inputs: Any, outputs: Any, duration_ms: float,
               status: Literal["ok", "error", "skipped"] = "ok", detail: str = "") -> StepTrace:
    """A StepTrace with inputs and outputs referenced by hash."""
    return StepTrace(run_id=run_id, step=step, name=STEP_NAMES[step], input_hash=content_hash(inputs),
                     output_hash=content_hash(outputs), duration_ms=round(duration_ms, 3), status=status,
                     detail=detail)


def step_entry(record: TraceRecordIn) -> dict[str, Any]:
    """A StepTrace record as the entry its transition record carries: no kind or run_id (the transition
    record's), no name (the step number names it), no empty detail."""
    entry = {k: v for k, v in record.payload.items() if k not in ("run_id", "name")}
    if not entry.get("detail"):
        entry.pop("detail", None)
    return entry


def fold_steps(run_id: str, records: Sequence[TraceRecordIn]) -> tuple[list[dict[str, Any]], list[TraceRecordIn]]:
    """Split a transition's records into the StepTraces of its Run, as the entries its "transition"
    record carries, and the records that stay records of their own."""
    steps = [step_entry(r) for r in records if r.kind == STEP and r.run_id == run_id]
    if not steps:
        return [], list(records)
    return steps, [r for r in records if not (r.kind == STEP and r.run_id == run_id)]


def step_entries(kind: str, payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The StepTraces a record holds, each with every StepTrace field: a format-1 "step" record is one, a
    format-2 "transition" record carries those of the steps it ends, any other record none."""
    if kind == STEP:
        entries: Iterable[Mapping[str, Any]] = (payload,)
    elif kind == "transition":
        entries = payload.get(STEPS_KEY) or ()
    else:
        return []
    out = []
    for entry in entries:
        step = int(entry["step"])
        out.append({"step": step, "name": entry.get("name") or STEP_NAMES.get(step, str(step)),
                    "input_hash": entry.get("input_hash"), "output_hash": entry.get("output_hash"),
                    "duration_ms": entry.get("duration_ms", 0.0), "status": entry.get("status", "ok"),
                    "detail": entry.get("detail", "")})
    return out
