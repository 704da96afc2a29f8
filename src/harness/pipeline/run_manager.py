"""Run manager (step ①, seed 004 §3.1): owns a Run's lifecycle from request to ResultSink.

`create_run` validates the request, makes the Run durable in CREATED, then `drive` carries it through
the pipeline until it is final or parks in AWAITING_HITL. Every step writes its StepTrace inside the
transition that ends it. A Run parked for approval holds nothing in memory: `decide` persists the
decision and `drive` resumes from the persisted RunContext, skipping completed steps (G6, T6).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError

from harness.adapters.sql.blobs import (
    BlobStore,
    contents_of,
    llm_call_record,
    put,
    record_llm_call,
    save_context_with_blobs,
)
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.store import SqlStore
from harness.context.trace import context_records
from harness.domain.contracts import (
    AssembledContext,
    CallerIdentity,
    Plan,
    PlanStep,
    RunRequest,
    RunResult,
    render_template,
)
from harness.domain.errors import (
    CancelRefusedError,
    ContextError,
    InvalidRequestError,
    PlanError,
    ProviderError,
    UnknownRunError,
)
from harness.domain.limits import RequestLimits
from harness.domain.llm import LLMResponse
from harness.domain.records import NewRun, RunRecord, TraceRecordIn, TransitionResult
from harness.domain.traces import CostTrace, HITLTrace, ToolTrace, TraceModel, error_trace, step_trace, unit_price
from harness.kernel import FINAL, TRANSIENT, RunState
from harness.kernel.events import LOST_RACE
from harness.pipeline import rounds
from harness.pipeline.child_runs import ChildRuns
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.intake import RolesOf, admit, body_hash
from harness.pipeline.plan_orchestrator import PlanOrchestrator, StepRun, resolve
from harness.pipeline.tool_controller import ToolController
from harness.pipeline.tool_kinds import ChildWait, StepTimeoutError, ToolCallError
from harness.policy.hitl import Decision, HitlDesk, HitlRequest, plan_actions
from harness.ports import Fence
from harness.ports.runs import RunLeases
from harness.skills import Skill
from harness.state_machine import StateMachine
from harness.timefmt import approvals_needed

S = RunState
MANAGER = "run_manager"
#: a cancel that keeps losing races to the Run's own steps gives up after this many tries (each lost race
#: means the Run moved one step on, so a handful covers every path to a cancellable state)
_CANCEL_ATTEMPTS = 8


@dataclasses.dataclass
class _Drive:
    """One drive of one Run: its fence (lease) and the RunContext it executes with. Held in a context
    variable, not keyed by run_id on the manager: two drives of the same Run in one process (a paused
    worker and the one that took over) must never see each other's lease."""

    run_id: str
    fence: Fence | None
    context: dict[str, Any] | None = None


_DRIVE: contextvars.ContextVar[_Drive | None] = contextvars.ContextVar("harness_drive", default=None)


def _fence_for(run_id: str) -> Fence | None:
    drive = _DRIVE.get()
    return drive.fence if drive is not None and drive.run_id == run_id else None


def parse_request(raw: RunRequest | dict[str, Any]) -> RunRequest:
    """A RunRequest, or InvalidRequestError naming the offending field."""
    if isinstance(raw, RunRequest):
        return raw
    try:
        return RunRequest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(request)"
        raise InvalidRequestError(f"invalid run request: {where}: {err['msg']}") from exc


def _records(*models: TraceModel) -> list[TraceRecordIn]:
    return [m.to_record() for m in models]


class RunManager:
    """Creates Runs and drives them through the eight steps."""

    def __init__(self, *, store: SqlStore, machine: StateMachine, assembler: ContextAssembler,
                 orchestrator: PlanOrchestrator, policy: PolicyEngine, tools: ToolController, hitl: HitlDesk,
                 ledger: CostLedger, execution_limit_s: float = 600.0, chain_depth: int = 4,
                 limits: RequestLimits | None = None, roles_of: RolesOf | None = None,
                 check_callback: Callable[[RunRequest], None] | None = None, max_rounds: int = 4,
                 child_leases: RunLeases) -> None:
        self.store = store
        self.machine = machine
        self.assembler = assembler
        self.orchestrator = orchestrator
        self.policy = policy
        self.tools = tools
        self.hitl = hitl
        self.ledger = ledger
        #: refuses a callback this deployment cannot sign or does not allow (set by the composition root)
        self.check_callback = check_callback
        self.execution_limit_s = execution_limit_s
        #: the delegation budget of a Run whose caller gives none, and the most a caller may give (§4.1)
        self.chain_depth = chain_depth
        #: how many rounds a Run may plan (SPEC K2, rounds): a plan asking for more is refused by policy
        self.max_rounds = max_rounds
        self.limits = limits or RequestLimits()
        self.roles_of = roles_of  # the identity directory's roles for a request that names none
        self._context_lock = threading.Lock()
        #: drives a Run under its lease (the composition root sets a RunWorker's `execute`): every entry
        #: point that drives — `harness run`, a decision's resume, a child Run — holds the Run's lease and
        #: heartbeats it, so a second driver never starts while it lives (K5b, T6). It returns None when
        #: another live driver holds the lease.
        self.driver: Callable[[str], RunResult | None] | None = None
        #: child Runs (AgentInvoke): the parent's wait, and waking a parent whose child ended (T4)
        self.children = ChildRuns(self, child_leases)

    # ------------------------------------------------------------------ entry points

    def submit(self, raw: RunRequest | dict[str, Any]) -> tuple[RunRecord, bool]:
        """Validate and durably create a Run in CREATED (step ①); (run, created) — an idempotency key
        the caller (tenant and user) already used returns that Run with created False, or raises
        IdempotencyConflictError if it came with another request. A request over its limits
        (harness.pipeline.intake) creates nothing."""
        request = self._with_chain_budget(admit(parse_request(raw), self.limits, self.assembler.filter, self.roles_of))
        if request.callback is not None and self.check_callback is not None:
            self.check_callback(request)
        if request.retry_of is not None:
            self.store.get_run(request.retry_of)  # a retry must name a Run that exists
        return self.store.create_run(NewRun(
            tenant_id=request.tenant_id, user_id=request.user_id, session_id=request.session_id,
            request=request.model_dump(mode="json"), idempotency_key=request.idempotency_key,
            retry_of=request.retry_of, request_hash=body_hash(request),
        ))

    def _with_chain_budget(self, request: RunRequest) -> RunRequest:
        """The request with its delegation budget settled: the deployment's default when the caller gave
        none (stored with the Run, so a later change of the setting does not change a Run's budget)."""
        if request.chain_remaining is None:
            return request.model_copy(update={"chain_remaining": self.chain_depth})
        if request.chain_remaining > self.chain_depth:
            raise InvalidRequestError(
                f"invalid run request: chain_remaining: {request.chain_remaining} levels of child Runs is more "
                f"than this deployment allows ({self.chain_depth}, set by HARNESS_CHAIN_DEPTH)")
        return request

    def create_run(self, raw: RunRequest | dict[str, Any]) -> RunResult:
        """Submit and drive a Run until it is final or waits for a human."""
        run, created = self.submit(raw)
        return self.drive(run.run_id) if created else self.result(run.run_id)

    def drive(self, run_id: str, *, fence: Fence | None = None) -> RunResult:
        """Carry the Run forward from wherever it is; returns its result when it stops.

        Under a worker's `fence` (K5b) every transition carries the lease epoch and every side effect
        is preceded by a check that the lease is still held; a drive whose lease was taken over stops.
        Without a fence the Run's lease is taken first (see `driver`); when another live driver holds it,
        the Run is left to that driver and its current result returned.
        """
        if fence is None and self.driver is not None:
            leased = self.driver(run_id)
            return leased if leased is not None else self.result(run_id)
        token = _DRIVE.set(_Drive(run_id, fence))
        try:
            with self.children.driving(run_id):
                return self._drive(run_id)
        finally:
            _DRIVE.reset(token)

    def await_child(self, parent_id: str, child_id: str, until: float) -> ChildWait:
        """Drive or wait for a child Run of the Run this drive executes (AgentInvoke, T4)."""
        return self.children.await_child(parent_id, child_id, until, _fence_for(parent_id))

    def _drive(self, run_id: str) -> RunResult:
        run = self.store.get_run(run_id)
        request = RunRequest.model_validate(run.request)
        if run.state in TRANSIENT or run.state == S.TRACING:
            # a worker died between a failure (or success) and the close: finish the funnel
            self.machine.advance(run_id, run.state, lease_epoch=self._epoch(run_id))
            run = self.store.get_run(run_id)
        if run.state == S.CREATED:
            run = self._advance(run, S.CREATED, S.PREPARING, "request accepted",
                                _records(step_trace(run_id, 1, run.request, {"run_id": run_id}, 0.0)))
        if run.state == S.PREPARING:  # also a Run whose worker died here: steps ②③ are side-effect free (P1)
            run = self._prepare(run, request)
        # the main path, round after round (EXECUTING → PLANNING when a plan asks for another round);
        # it stops when the Run parks, closes, or did not move (a lost race, a fenced drive)
        for _ in range(3 * self.max_rounds + 3):
            before = (run.state, run.version)
            if run.state == S.PLANNING:
                run = self._plan(run, request)
            elif run.state == S.POLICY_CHECK:
                run = self._policy(run, request)
            elif run.state == S.EXECUTING:
                run = self._execute(run, request)
            if run.state not in (S.PLANNING, S.POLICY_CHECK, S.EXECUTING) or (run.state, run.version) == before:
                break
        # the result reaches the caller through the ResultSink the state machine calls inside every close
        # and park (harness.webhooks), whoever makes it: not from here, which only a drive passes through
        return self.result(run_id)

    def result(self, run_id: str) -> RunResult:
        """What the caller gets for a Run, in whatever state it is."""
        state, stored, path = self.store.outcome_of(run_id)
        stored = stored or {}
        pending = [r for r in self.hitl.for_run(run_id) if r.status == "pending"] \
            if state == S.AWAITING_HITL else []
        return RunResult(
            run_id=run_id, state=state.value, answer=stored.get("answer"),
            artifacts=stored.get("artifacts", {}), trace_id=run_id, error=stored.get("error"),
            approval_request_id=pending[-1].request_id if pending else None,
            path=tuple(s.value for s in path),
        )

    def assembled_context(self, run_id: str) -> AssembledContext:
        """The context assembled for the Run (step ②): from the RunContext until the plan is made, then
        from the recorded plan request. ContextError when the Run has none (it failed before or while
        assembling)."""
        context = self.store.get_run(run_id).context or {}
        if "context" in context:
            return AssembledContext.model_validate(context["context"])
        digest: str = context.get("plan_request_hash", "")
        text = BlobStore(self.store.engine).raw([digest]).get(digest) if digest else None
        if text is None or not BlobStore.verified(digest, text):
            raise ContextError(f"run {run_id} has no recorded assembled context")
        return AssembledContext.model_validate(json.loads(text)["context"])

    def prune_workdirs(self) -> list[str]:
        """Remove the working directories of final Runs whose close another process made (a sweeper
        elsewhere); this process's own closes remove theirs at once. Returns the Runs pruned."""
        return self.tools.prune(self.store.final_among)

    def cancel(self, run_id: str, *, by: str, reason: str = "cancelled by the user") -> RunResult:
        """Cancel a Run that has not finished: it ends CLOSED_CANCELLED, or CancelRefusedError says it had
        already begun to close (or closed) and the cancel took no effect. Never a success that changed
        nothing: a cancel that loses a race to a step of the Run (an approval, a plan, a step) tries again
        from the state the Run moved to. A call already in flight finishes and is traced; the Run's next
        step does not start, because every step checks the Run is still EXECUTING in the database."""
        state = self.store.state_of(run_id)
        for _ in range(_CANCEL_ATTEMPTS):
            if state in FINAL or state in TRANSIENT or state == S.TRACING:
                break
            if state == S.CREATED:  # CREATED has no edge to CANCELLED: accept the request, then cancel it
                outcome = self.machine.transition(run_id, S.CREATED, S.PREPARING, actor=by,
                                                  reason="request accepted (to be cancelled)")
            else:
                outcome = self.machine.transition(run_id, state, S.CANCELLED, actor=by, reason=reason,
                                                  also=lambda conn: self.hitl.cancel_pending(conn, run_id))
                if outcome.applied:
                    return self.result(run_id)
            state = self.store.state_of(run_id)
        # the cancel lost to whatever closed the Run first; the attempt is still on record
        self.store.audit(run_id, LOST_RACE, by, {"attempted_to": S.CANCELLED.value, "actual": state.value,
                                                 "reason": reason})
        raise CancelRefusedError(run_id, state.value)

    def decide(self, request_id: str, approver: CallerIdentity, decision: str, *, approved_hash: str | None = None,
               break_glass: bool = False, reason: str = "", resume: bool = True) -> tuple[Decision, RunResult]:
        """Record a human decision and the Run's move it causes in one transaction (G4: the decision is
        durable no later than its effect), then drive the approved Run on."""
        if decision not in ("approve", "reject"):
            raise InvalidRequestError(f"decision must be approve or reject, not {decision!r}")
        who = f"{approver.tenant_id}/{approver.user_id}"

        def move(conn: sa.Connection, request: HitlRequest, effect: str) -> TransitionResult:
            if effect == "approved":
                step = step_trace(request.run_id, 7, {"request_id": request.request_id}, {"approved_by": who}, 0.0)
                return self.machine.transition_in(
                    conn, request.run_id, S.AWAITING_HITL, S.EXECUTING, actor=who,
                    reason=f"approved ({request.level})" + (" by break-glass" if break_glass else ""),
                    records=_records(step))
            why = reason or "no reason given"
            return self.machine.transition_in(conn, request.run_id, S.AWAITING_HITL, S.REJECTED, actor=who,
                                              reason=f"rejected by an approver: {why}",
                                              result={"error": f"rejected by {who}: {why}"})

        verdict = self.hitl.decide(request_id, approver, decision,  # type: ignore[arg-type]
                                   approved_hash=approved_hash, break_glass=break_glass, reason=reason, move=move)
        run_id = verdict.request.run_id
        if verdict.transition is not None:
            self.machine.settle(verdict.transition)
            if verdict.effect == "approved" and resume:
                return verdict, self.drive(run_id)
        return verdict, self.result(run_id)

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
            with self.store.engine.begin() as conn:
                if self.store.lock_run(conn, request.run_id) != S.AWAITING_HITL:
                    continue
                outcome = self._carry_out(conn, request)
            self.store.audit(request.run_id, "hitl_decision_resumed", "zombie_sweeper",
                             {"request_id": request.request_id, "status": request.status})
            if outcome is not None:
                self.machine.settle(outcome, forced_by="zombie_sweeper")
                if outcome.target == S.EXECUTING:
                    to_drive.append(request.run_id)
        return to_drive

    def _carry_out(self, conn: sa.Connection, request: HitlRequest) -> TransitionResult | None:
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

    def _timeout_move(self, conn: sa.Connection, request: HitlRequest) -> TransitionResult:
        """AWAITING_HITL → TIMEOUT for a request past its deadline, inside the expiry's transaction."""
        trace = HITLTrace(run_id=request.run_id, request_id=request.request_id, event="timeout",
                          level=request.level, actions_hash=request.actions_hash,
                          waited_s=round(self.store.clock.now() - request.created_at, 3), timeout_action="reject",
                          reason="no decision before the deadline: default-deny")
        return self.machine.transition_in(conn, request.run_id, S.AWAITING_HITL, S.TIMEOUT, actor="gatekeeper",
                                          reason="approval timed out (default-deny)", records=_records(trace),
                                          result={"error": "approval timed out: default-deny"})

    def _timeout_lost(self, run_id: str, request_id: str) -> None:
        """A timeout found its request already decided or cancelled: record the losing attempt."""
        self.store.audit(run_id, "hitl_timeout_lost", "gatekeeper",
                         {"request_id": request_id, "status": self.hitl.get(request_id).status})

    # ------------------------------------------------------------------ steps

    def _advance(self, run: RunRecord, source: RunState, target: RunState, reason: str,
                 records: list[TraceRecordIn] | None = None, **kwargs: Any) -> RunRecord:
        """Make the transition; the Run as it now is, built locally rather than read back (hot path)."""
        outcome = self.machine.transition(run.run_id, source, target, actor=MANAGER, reason=reason,
                                          records=records or [], lease_epoch=self._epoch(run.run_id), **kwargs)
        if not outcome.applied:
            return self.store.get_run(run.run_id)
        changes: dict[str, Any] = {"state": target, "version": outcome.seq, "close_reason": outcome.close_reason,
                                   "last_state_change_at": self.store.clock.now()}
        for key in ("context", "result"):
            if key in kwargs:
                changes[key] = kwargs[key]
        return dataclasses.replace(run, **changes)

    def _epoch(self, run_id: str) -> int | None:
        """The lease epoch this process drives the Run under, if it drives it under a lease."""
        fence = _fence_for(run_id)
        return fence.epoch if fence is not None else None

    def _fenced(self, run_id: str) -> bool:
        """True when this drive's lease was taken over: no further side effect or write (K5b)."""
        fence = _fence_for(run_id)
        return fence is not None and not fence.holds()

    def _fail(self, run: RunRecord, source: RunState, step: int, code: str, exc: BaseException | str,
              target: RunState = S.FAILED, inputs: Any = None) -> RunRecord:
        message = str(exc)
        records = _records(step_trace(run.run_id, step, inputs, {"error": message}, 0.0, "error", message),
                           error_trace(run.run_id, step, code, exc))
        return self._advance(run, source, target, f"{code}: {message}", records,
                             result={"error": f"{code}: {message}"})

    def _prepare(self, run: RunRecord, request: RunRequest) -> RunRecord:
        if run.state != S.PREPARING:
            return run
        started = time.perf_counter()
        caller = request.caller
        try:
            skills = self.tools.visible_skills(caller, self.policy.may_call)
            specs = self.tools.tool_specs(skills)
            assembled = self.assembler.assemble(request, specs)
        except ContextError as exc:
            return self._fail(run, S.PREPARING, 2, exc.code, exc, inputs=run.request)
        elapsed = (time.perf_counter() - started) * 1000
        context = {
            "caller": caller.model_dump(mode="json"),
            "manifests": {s.id: {"version": s.manifest.version, "hash": s.manifest_hash} for s in skills},
            "visible_skills": [s.id for s in skills],
            "context": assembled.model_dump(mode="json"),
            "steps": {},
            "cost": {"input_tokens": 0, "output_tokens": 0, "usd": 0.0},
        }
        records = _records(
            step_trace(run.run_id, 2, run.request, context["context"], elapsed),
            step_trace(run.run_id, 3, caller.model_dump(mode="json"), context["manifests"], 0.0),
        ) + context_records(run.run_id, assembled)  # C2: a degraded recall is traced, never silent
        return self._advance(run, S.PREPARING, S.PLANNING, "context assembled, skills loaded", records,
                             context=context)

    def _plan(self, run: RunRecord, request: RunRequest) -> RunRecord:
        context = dict(run.context or {})
        round_no = rounds.number(context)
        # round 1 has the assembled context in the RunContext; a later round reads it back by hash
        assembled = AssembledContext.model_validate(context["context"]) if "context" in context \
            else self.assembled_context(run.run_id)
        specs = self.tools.tool_specs([s for s in (self.tools.registry.get(i) for i in context["visible_skills"])
                                       if s is not None])
        started = time.perf_counter()
        llm_input: dict[str, Any] = {"context": context.get("context") or assembled.model_dump(mode="json"),
                                     "tools": [s.model_dump(mode="json") for s in specs]}
        try:
            transcript = rounds.transcript(context, self._scrub)  # earlier results, secrets filtered (C4)
        except ContextError as exc:
            return self._fail(run, S.PLANNING, 4, exc.code, exc, inputs=request.task)
        if transcript:
            llm_input["rounds"] = [m.model_dump(mode="json") for m in transcript]
        try:
            outcome = self.orchestrator.plan(assembled, specs, rounds=transcript, taken=rounds.taken_names(context))
        except PlanError as exc:
            if isinstance(exc.response, LLMResponse):
                record_llm_call(self.store, run.run_id, "plan", llm_input,
                                response=exc.response.model_dump(mode="json"))
                self._record_cost(run, exc.response)
            return self._fail(run, S.PLANNING, 4, exc.code, exc, inputs=request.task)
        except ProviderError as exc:
            record_llm_call(self.store, run.run_id, "plan", llm_input,
                            error={"kind": exc.kind, "message": str(exc), "retryable": exc.retryable})
            target = S.TIMEOUT if exc.kind == "timeout" else S.FAILED
            return self._fail(run, S.PLANNING, 4, f"llm_{exc.kind}", exc, target=target, inputs=request.task)
        elapsed = (time.perf_counter() - started) * 1000
        usage = outcome.response.usage
        cost = self._cost(run, outcome.response)
        context["plan"] = outcome.plan.model_dump(mode="json", by_alias=True)
        context["flattened"] = outcome.flattened
        context["cost"] = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                           "usd": usage.cost_usd}
        detail = f"flattened to listed order: {outcome.dag_problem}" if outcome.flattened else ""
        records = _records(step_trace(run.run_id, 4, llm_input["context"], context["plan"], elapsed, detail=detail))
        if outcome.flattened:
            self.store.audit(run.run_id, "plan_flattened", "plan_orchestrator", {"problem": outcome.dag_problem})
        records.extend(_records(cost))
        llm_record, llm_values = llm_call_record(run.run_id, "plan", llm_input,
                                                 response=outcome.response.model_dump(mode="json"))
        records.append(llm_record)
        # the assembled context has served its purpose; it stays, by hash, in the plan request's blob
        # (A5), so the Run row rewritten at every later transition does not carry it (assembled_context)
        context.pop("context", None)
        context["plan_request_hash"] = llm_record.payload["request_hash"]

        def ledger_and_blobs(conn: sa.Connection) -> None:
            put(conn, contents_of(llm_values))
            self.ledger.insert(conn, cost)  # last: it locks the tenant's spend total until the commit

        what = f"plan with {len(outcome.plan.steps)} steps" if outcome.plan.steps else "a direct answer"
        return self._advance(run, S.PLANNING, S.POLICY_CHECK, what if round_no == 1 else f"round {round_no}: {what}",
                             records, context=context, also=ledger_and_blobs)

    def _scrub(self, text: str) -> str:
        """Text bound for a model with its secrets removed (C4); ContextError when the filter fails."""
        return self.assembler.filter.scrub(text).text

    def _cost(self, run: RunRecord, response: LLMResponse, purpose: str = "plan") -> CostTrace:
        usage = response.usage
        return CostTrace(run_id=run.run_id, source=f"llm:{response.provider}:{purpose}",
                         input_tokens=usage.input_tokens, output_tokens=usage.output_tokens, api_calls=1,
                         usd=usage.cost_usd, unit_price=unit_price(usage), priced=usage.priced,
                         model=response.model, tenant_id=run.tenant_id, user_id=run.user_id,
                         parent_run_id=run.parent_run_id)

    def _record_cost(self, run: RunRecord, response: LLMResponse, purpose: str = "plan") -> None:
        self.ledger.record(self._cost(run, response, purpose))

    def _policy(self, run: RunRecord, request: RunRequest) -> RunRecord:
        context = dict(run.context or {})
        plan = Plan.model_validate(context["plan"])
        caller = request.caller
        started = time.perf_counter()
        chain = self.chain_depth if request.chain_remaining is None else request.chain_remaining
        evaluation = self.policy.evaluate(plan, caller, run.run_id, chain_remaining=chain,
                                          round_no=rounds.number(context), max_rounds=self.max_rounds)
        decision = evaluation.decision
        elapsed = (time.perf_counter() - started) * 1000
        context["policy"] = {"decision": decision.decision, "level": decision.level}
        records = [t.to_record() for t in evaluation.traces]
        records += _records(step_trace(run.run_id, 5, context["plan"], decision.model_dump(mode="json"), elapsed))
        if decision.decision == "reject":
            reasons = "; ".join(f"{v.rule_id}: {v.reason}" for v in decision.rejecting)
            return self._advance(run, S.POLICY_CHECK, S.REJECTED, f"policy rejected: {reasons}", records,
                                 context=context, result={"error": f"rejected by policy: {reasons}"})
        if decision.decision == "await_hitl":
            most = self.hitl.settings.max_pending_per_requester
            if self.hitl.pending_count(caller.tenant_id, caller.user_id) >= most:
                reason = f"hitl.rate_limit: {caller.user_id} already has {most} approval requests waiting"
                return self._advance(run, S.POLICY_CHECK, S.REJECTED, reason, records, context=context,
                                     result={"error": f"rejected by policy: {reason}"})
            req = self.hitl.new_request(run.run_id, caller.tenant_id, caller.user_id, decision.level,
                                        plan_actions(plan))
            if run.deadline_at is not None and run.deadline_at < req.deadline_at:
                # a child's approval is useless once its parent stopped waiting (T4): due by then
                req = dataclasses.replace(req, deadline_at=run.deadline_at)
            context["approval"] = {"request_id": req.request_id, "actions_hash": req.actions_hash,
                                   "level": req.level}
            records += _records(HITLTrace(run_id=run.run_id, request_id=req.request_id, event="requested",
                                          level=req.level, actions_hash=req.actions_hash,
                                          reason=approvals_needed(req.required_approvals, req.deadline_at)))
            return self._advance(run, S.POLICY_CHECK, S.AWAITING_HITL, f"needs {decision.level} approval",
                                 records, context=context, also=lambda conn: self.hitl.insert(conn, req))
        return self._advance(run, S.POLICY_CHECK, S.EXECUTING, "every call passed policy at L1", records,
                             context=context)

    def _execute(self, run: RunRecord, request: RunRequest) -> RunRecord:
        context = dict(run.context or {})
        context["steps"] = dict(context.get("steps", {}))
        drive = _DRIVE.get()
        if drive is not None and drive.run_id == run.run_id:
            drive.context = context
        return self._execute_plan(run, request, context)

    def _execute_plan(self, run: RunRecord, request: RunRequest, context: dict[str, Any]) -> RunRecord:
        plan = Plan.model_validate(context["plan"])
        approved = self._approved_actions(run.run_id, context)
        outputs = {**rounds.earlier_outputs(context), **rounds.ok_outputs(context.get("steps", {}))}
        deadline = self._deadline(run, rounds.executing_spent(context))
        started = time.perf_counter()

        def run_step(step: PlanStep, available: dict[str, Any]) -> StepRun:
            return self._run_step(run, request, step, available, approved, deadline)

        report = self.orchestrator.execute(plan, bool(context.get("flattened")), outputs, run_step)
        elapsed = (time.perf_counter() - started) * 1000
        if report.failure is not None:
            failure = report.failure
            if failure.error_code == "superseded":
                now = self.store.get_run(run.run_id)
                if self._fenced(run.run_id):
                    return now  # a fenced worker writes nothing more, not even about itself (K5b)
                self.store.audit(run.run_id, LOST_RACE, MANAGER, {"attempted_to": "continue EXECUTING",
                                                                  "actual": now.state.value, "reason": failure.error})
                return now
            timed_out = failure.error_code in ("timeout", "run_time_limit", "child_run_timeout")
            target = S.TIMEOUT if timed_out else S.FAILED
            code = failure.error_code or "step_failed"
            detail = (failure.error or "").removeprefix(f"{code}: ")  # the code leads the message once
            return self._fail(self.store.get_run(run.run_id), S.EXECUTING, 6, code,
                              f"step {failure.step_id}: {detail}", target=target, inputs=context["plan"])
        if plan.then == "next_round":
            return self._next_round(run, context, outputs, elapsed)
        if plan.then == "answer":
            written = self._answer_from_results(run, request, outputs, deadline)
            if isinstance(written, RunRecord):
                return written
            answer: str | None = written
        else:
            try:
                answer = plan.answer or (render_template(plan.answer_template, outputs) if plan.answer_template
                                         else None)
            except KeyError as exc:
                return self._fail(run, S.EXECUTING, 6, "answer_template", f"answer template: {exc}")
        result = {"answer": answer, "artifacts": outputs}
        records = _records(step_trace(run.run_id, 6, context["plan"], outputs, elapsed),
                           step_trace(run.run_id, 8, {"run_id": run.run_id}, result, 0.0))
        return self._advance(run, S.EXECUTING, S.TRACING, "every step succeeded", records, result=result)

    def _next_round(self, run: RunRecord, context: dict[str, Any], outputs: dict[str, Any],
                    elapsed_ms: float) -> RunRecord:
        """EXECUTING → PLANNING: the round is complete and recorded (with the transition), so no drive
        repeats it; the model plans the next one from its results (SPEC K2, rounds)."""
        round_no = rounds.number(context)
        executing_s = max(0.0, self.store.clock.now() - run.last_state_change_at)
        records = _records(step_trace(run.run_id, 6, context["plan"], outputs, elapsed_ms,
                                      detail=f"round {round_no} done"))
        return self._advance(run, S.EXECUTING, S.PLANNING,
                             f"round {round_no} done: the model plans round {round_no + 1} from its results",
                             records, context=rounds.close_round(context, executing_s))

    def _answer_from_results(self, run: RunRecord, request: RunRequest, outputs: dict[str, Any],
                             deadline: float) -> str | RunRecord:
        """The final answer written by the model from the results: one LLM call through the tool
        controller (secrets filtered, costed), recorded for replay. The Run as it now is when the call
        could not be made or failed."""
        if self.store.state_of(run.run_id) != S.EXECUTING or self._fenced(run.run_id):
            return self.store.get_run(run.run_id)  # cancelled, swept or taken over: nothing leaves
        messages = rounds.answer_messages(request.task, outputs, self._scrub)
        system = self.assembled_context(run.run_id).system_prompt
        llm_input = {"purpose": "answer", "system": system, "messages": [m.model_dump(mode="json") for m in messages]}
        try:
            response = self.tools.compose_answer(system, messages, run_id=run.run_id, caller=request.caller,
                                                 deadline=deadline)
        except (ProviderError, ContextError, StepTimeoutError, ToolCallError) as exc:
            code = getattr(exc, "code", None) or (f"llm_{exc.kind}" if isinstance(exc, ProviderError) else "timeout")
            if isinstance(exc, ProviderError):
                record_llm_call(self.store, run.run_id, "answer", llm_input,
                                error={"kind": exc.kind, "message": str(exc), "retryable": exc.retryable})
            timed_out = isinstance(exc, StepTimeoutError) or (isinstance(exc, ProviderError) and exc.kind == "timeout")
            return self._fail(run, S.EXECUTING, 8, code, f"writing the answer from the results: {exc}",
                              target=S.TIMEOUT if timed_out else S.FAILED)
        record_llm_call(self.store, run.run_id, "answer", llm_input, response=response.model_dump(mode="json"))
        return response.content

    def _deadline(self, run: RunRecord, spent_s: float = 0.0) -> float:
        """time.monotonic() by which execution must end: the execution limit (T5) less what earlier rounds
        spent executing, counted from when the Run entered EXECUTING (so a drive resumed after a crash does
        not start the clock again), or sooner when the Run is a child whose parent gave it only what was
        left of its own budget (deadline_at, T4)."""
        now = self.store.clock.now()
        entered = run.last_state_change_at if run.state == S.EXECUTING else now
        remaining = self.execution_limit_s - spent_s - max(0.0, now - entered)
        if run.deadline_at is not None:
            remaining = min(remaining, run.deadline_at - now)
        return time.monotonic() + max(0.0, remaining)

    def _fallback_check(self, run: RunRecord, step: PlanStep,
                        arguments: dict[str, Any]) -> Callable[[Skill], bool]:
        """Whether this Run may switch the step to a fallback skill (T3): the fallback was visible to the
        caller and pinned at Run start (T1), and its guardrails pass these arguments (G1)."""
        pinned = (run.context or {}).get("manifests", {})

        def check(fallback: Skill) -> bool:
            if pinned.get(fallback.id, {}).get("hash") != fallback.manifest_hash:
                return False
            call = step.tool_call.model_copy(update={"skill": fallback.id})
            return self.policy.check_call(step.model_copy(update={"tool_call": call}), arguments) is None
        return check

    def _approved_actions(self, run_id: str, context: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
        """The exact actions a human approved for this Run, by step id; None when none was needed."""
        approval = context.get("approval")
        if approval is None:
            return None
        # the request the plan opened, or the escalation that replaced it: both bind these actions
        request = self.hitl.approved_for(run_id, approval["actions_hash"])
        if request is None:
            return {}
        return {a["step_id"]: a for a in request.actions}

    def _run_step(self, run: RunRecord, request: RunRequest, step: PlanStep, available: dict[str, Any],
                  approved: dict[str, dict[str, Any]] | None, deadline: float) -> StepRun:
        def fail(code: str, message: str) -> StepRun:
            return StepRun(step.id, step.output_key, False, error=message, error_code=code)

        if self.store.state_of(run.run_id) != S.EXECUTING:
            return fail("superseded", "the Run left EXECUTING (cancelled or swept)")
        if self._fenced(run.run_id):
            return fail("superseded", "this worker's lease on the Run was taken over (fenced)")
        if time.monotonic() > deadline:
            return fail("run_time_limit", f"the Run's execution limit of {self.execution_limit_s:.3g}s passed")
        if run.parent_run_id is not None and (gone := self._parent_gone(run)) is not None:
            return fail("superseded", gone)
        skill = self.tools.registry.get(step.tool_call.skill)
        action = {"step_id": step.id, "skill": step.tool_call.skill, "arguments": step.tool_call.arguments}
        if skill is None or (approved is not None and approved.get(step.id) != action):
            return self._refuse(run, step, "not_approved", f"step {step.id}: the call is not in the approved plan")
        pinned = (run.context or {}).get("manifests", {}).get(skill.id, {}).get("hash")
        if pinned != skill.manifest_hash:
            return self._refuse(run, step, "manifest_changed",
                                f"{skill.id}'s manifest changed since the Run started")
        try:
            arguments = resolve(step.tool_call.arguments, available)
        except KeyError as exc:
            return fail("unresolved_reference", str(exc))
        blocked = self.policy.check_call(step, arguments)
        if blocked is not None:
            return self._refuse(run, step, "policy_refused", f"{blocked.rule_id}: {blocked.reason}")
        earlier = (run.context or {}).get("steps", {}).get(step.id, {})
        # a child Run is found again by its key, never started twice: an AgentInvoke call re-attaches (T4)
        once_only = not skill.manifest.idempotent and skill.manifest.call_kind != "agent"
        if earlier.get("status") == "started" and once_only:
            # T6: a previous worker died during this call; running it again could repeat its side effect
            return self._refuse(run, step, "outcome_unknown",
                                f"outcome of {step.id} unknown: its worker died during the call and "
                                f"{skill.id} is not idempotent, so it is not run again")
        if once_only:
            refusal = self._mark_started(run.run_id, step)
            if refusal == "superseded":
                return fail("superseded", "the Run left EXECUTING (cancelled or swept) or its lease was taken over")
            if refusal is not None:
                return self._refuse(run, step, "outcome_unknown",
                                    f"outcome of {step.id} unknown: the database already records it as "
                                    f"{refusal} by another drive, so {skill.id} is not run again")
        call = self.tools.call(skill, arguments, run_id=run.run_id, step_id=step.id, output_key=step.output_key,
                               caller=request.caller, deadline=deadline,
                               may_fall_back=self._fallback_check(run, step, arguments))
        self._record_step(run.run_id, call.outcome.model_dump(mode="json"), [*call.traces] + (
            [error_trace(run.run_id, 6, call.trace.error_code or "error", call.exception, call.outcome.attempts - 1)]
            if call.exception is not None else []), values=(arguments, call.outcome.output))
        if call.exception is not None:
            return StepRun(step.id, step.output_key, False, error=call.outcome.error, error_code=call.trace.error_code)
        return StepRun(step.id, step.output_key, True, output=call.outcome.output)

    def _parent_gone(self, run: RunRecord) -> str | None:
        """For a child Run: why nobody waits for it any more (its parent left EXECUTING), after cancelling
        it; None while its parent waits. Checked before each step, so an approval that arrives after
        the parent was cancelled or swept starts nothing."""
        assert run.parent_run_id is not None
        try:
            state = self.store.state_of(run.parent_run_id).value
        except UnknownRunError:
            state = "gone"
        if state == S.EXECUTING.value:
            return None
        reason = f"its parent Run {run.parent_run_id} is {state}: nobody waits for its result"
        self.cancel(run.run_id, by=MANAGER, reason=reason)
        return reason

    def _refuse(self, run: RunRecord, step: PlanStep, code: str, message: str) -> StepRun:
        trace = ToolTrace(run_id=run.run_id, step_id=step.id, skill_id=step.tool_call.skill, skill_version="-",
                          manifest_hash="-", idempotency_key=f"{run.run_id}:{step.id}", arguments_hash="-",
                          result_hash=None, attempts=0, duration_ms=0.0, status="refused", error_code=code)
        self.store.record(_records(trace, error_trace(run.run_id, 6, code, message)))
        return StepRun(step.id, step.output_key, False, error=message, error_code=code)

    def _live_context(self, run_id: str) -> dict[str, Any]:
        """The RunContext this drive is executing with (kept in memory: under the lease nobody else writes
        it); read from the store when called outside an execution. Call with the context lock held."""
        drive = _DRIVE.get()
        context = drive.context if drive is not None and drive.run_id == run_id else None
        if context is None:
            context = dict(self.store.get_run(run_id).context or {})
            context["steps"] = dict(context.get("steps", {}))
        return context

    def _mark_started(self, run_id: str, step: PlanStep) -> str | None:
        """Record that a non-idempotent call is about to run, so a worker that takes over after a crash
        knows its outcome is unknown instead of repeating it (T6). The mark is a conditional write, judged
        in the database at this moment, not against the Run as read when this drive began: it is refused
        ("superseded") unless the Run is still EXECUTING under this drive's lease, or with the status the
        database already holds for the step when another drive got there first. None: marked."""
        with self._context_lock:
            context = self._live_context(run_id)
            entry = {"step_id": step.id, "output_key": step.output_key, "status": "started"}
            refusal = self.store.mark_step_started(run_id, step.id, {**context, "steps": {
                **context["steps"], step.id: entry}}, lease_epoch=self._epoch(run_id))
            if refusal is None:
                context["steps"][step.id] = entry
            return refusal

    def _record_step(self, run_id: str, outcome: dict[str, Any], traces: list[TraceModel],
                     values: tuple[Any, ...] = ()) -> None:
        """Persist a step's result with its traces before any dependent step starts (T6)."""
        if self._fenced(run_id):
            return  # the Run was taken over: its new worker owns the RunContext now
        with self._context_lock:
            context = self._live_context(run_id)
            context["steps"][outcome["step_id"]] = outcome
            # the contents behind the ToolTrace's argument/result hashes, for replay (A5)
            save_context_with_blobs(self.store, run_id, context, [t.to_record() for t in traces], values)
