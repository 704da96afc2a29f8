"""The Run's preparer, steps ② to ⑤ (seed 004 §3.2-3.4): assemble the context and load the skills, plan
(one round at a time), record the plan's cost, and check the plan against policy."""

from __future__ import annotations

import contextvars
import dataclasses
import time
from typing import Any

from harness.context.trace import context_records
from harness.domain.contracts import AssembledContext, RunRequest
from harness.domain.errors import BudgetExceededError, ContextError, PlanError, ProviderError
from harness.domain.llm import LLMResponse
from harness.domain.plans import Plan
from harness.domain.records import RunRecord
from harness.domain.traces import CostTrace, HITLTrace, step_trace, unit_price
from harness.pipeline import rounds
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.plan_orchestrator import PlanOrchestrator
from harness.pipeline.run_core import RunCore, S, trace_records
from harness.pipeline.tool_controller import ToolController
from harness.policy.hitl import plan_actions
from harness.ports import Tx
from harness.skills.manifests import Skill
from harness.timefmt import approvals_needed


@dataclasses.dataclass
class Prepared:
    """Steps ② and ③ done for a Run's request: the skills its caller may see and its assembled context, or
    the error that stopped the assembly, and how long that took; the request itself (it never changes,
    so the drive need not read it back); once the Run is accepted in this unit, the Run as its acceptance
    wrote it."""

    run_id: str
    request: RunRequest
    skills: list[Skill]
    assembled: AssembledContext | None
    failure: BaseException | None
    elapsed_ms: float
    accepted: RunRecord | None = None


#: steps ② and ③ done before the Run was accepted (`RunManager.create_run`), for its drive's PREPARING
PREPARED: contextvars.ContextVar[Prepared | None] = contextvars.ContextVar("harness_prepared", default=None)


class RunPreparer:
    """Steps ② to ⑤: PREPARING → PLANNING → POLICY_CHECK → EXECUTING, AWAITING_HITL or REJECTED."""

    def __init__(self, core: RunCore, *, tools: ToolController, policy: PolicyEngine, assembler: ContextAssembler,
                 orchestrator: PlanOrchestrator, chain_depth: int, max_rounds: int) -> None:
        self.core = core
        #: the skills a caller may see and their tool specs (a replay swaps it for its own)
        self.tools = tools
        self.policy = policy
        self.assembler = assembler
        self.orchestrator = orchestrator
        #: the delegation budget of a Run whose request gives none
        self.chain_depth = chain_depth
        #: how many rounds a Run may plan (SPEC K2, rounds): a plan asking for more is refused by policy
        self.max_rounds = max_rounds

    def preparation(self, run_id: str, request: RunRequest) -> Prepared:
        """Steps ② and ③ for `request`: they read (skills, memory) and write nothing, so they may run before
        the Run is accepted, holding no transaction. Any failure is kept for the drive to record."""
        started = time.perf_counter()
        skills: list[Skill] = []
        try:
            skills = self.tools.visible_skills(request.caller, self.policy.may_call)
            assembled = self.assembler.assemble(request, self.tools.tool_specs(skills))
        except Exception as exc:  # recorded (ContextError) or raised (anything else) where the drive is
            return Prepared(run_id, request, skills, None, exc, (time.perf_counter() - started) * 1000)
        return Prepared(run_id, request, skills, assembled, None, (time.perf_counter() - started) * 1000)

    def prepare(self, run: RunRecord, request: RunRequest) -> RunRecord:
        """PREPARING → PLANNING with the RunContext steps ② and ③ give (or FAILED: no context)."""
        if run.state != S.PREPARING:
            return run
        prepared = PREPARED.get()
        if prepared is None or prepared.run_id != run.run_id:
            # the lease and the acceptance commit before the context is assembled: a slow assembly (memory
            # recall, embeddings, the secret filter) must not hold the drive's transaction, or the lease's
            # heartbeat, which writes the same row, would wait behind it until the lease ran out. A Run
            # asked for and driven in one call had its context assembled before it was accepted: its
            # acceptance through PREPARING→PLANNING is one commit, before the model is called.
            self.core.units.release()
            prepared = self.preparation(run.run_id, request)
        caller = request.caller
        if isinstance(prepared.failure, ContextError):
            return self.core.fail(run, S.PREPARING, 2, prepared.failure.code, prepared.failure, inputs=run.request)
        if prepared.failure is not None:
            raise prepared.failure
        skills, assembled, elapsed = prepared.skills, prepared.assembled, prepared.elapsed_ms
        assert assembled is not None
        context = {
            "caller": caller.model_dump(mode="json"),
            "manifests": {s.id: {"version": s.manifest.version, "hash": s.manifest_hash} for s in skills},
            "visible_skills": [s.id for s in skills],
            "context": assembled.model_dump(mode="json"),
            "steps": {},
            "cost": {"input_tokens": 0, "output_tokens": 0, "usd": 0.0},
        }
        records = trace_records(
            step_trace(run.run_id, 2, run.request, context["context"], elapsed),
            step_trace(run.run_id, 3, caller.model_dump(mode="json"), context["manifests"], 0.0),
        ) + context_records(run.run_id, assembled)  # C2: a degraded recall is traced, never silent
        return self.core.advance(run, S.PREPARING, S.PLANNING, "context assembled, skills loaded", records,
                                 context=context)

    def plan(self, run: RunRecord, request: RunRequest) -> RunRecord:
        """Step ④, one round: PLANNING → POLICY_CHECK with the model's plan and its cost (or the failure)."""
        context = dict(run.context or {})
        round_no = rounds.number(context)
        # round 1 has the assembled context in the RunContext; a later round reads it back by hash
        assembled = AssembledContext.model_validate(context["context"]) if "context" in context \
            else self.core.assembled_context(run.run_id)
        specs = self.tools.tool_specs([s for s in (self.tools.registry.get(i) for i in context["visible_skills"])
                                       if s is not None])
        started = time.perf_counter()
        llm_input: dict[str, Any] = {"context": context.get("context") or assembled.model_dump(mode="json"),
                                     "tools": [s.model_dump(mode="json") for s in specs]}
        try:
            transcript = rounds.transcript(context, self.core.scrub)  # earlier results, secrets filtered (C4)
        except ContextError as exc:
            return self.core.fail(run, S.PLANNING, 4, exc.code, exc, inputs=request.task)
        if transcript:
            llm_input["rounds"] = [m.model_dump(mode="json") for m in transcript]
        failures: list[ProviderError] = []
        try:
            with self.core.units.effect():  # before the model is called, what led here is durable
                outcome = self.orchestrator.plan(assembled, specs, rounds=transcript,
                                                 taken=rounds.taken_names(context), failures=failures,
                                                 fit=self.core.fit(request.caller, run.run_id))
        except BudgetExceededError as exc:
            return self.core.fail(run, S.PLANNING, 4, exc.code, exc, inputs=request.task)
        except PlanError as exc:
            self._record_failed_attempts(run.run_id, llm_input, failures)
            if isinstance(exc.response, LLMResponse):
                self.core.writes.record_llm_call(run.run_id, "plan", llm_input,
                                                 response=exc.response.model_dump(mode="json"))
                self._record_cost(run, exc.response)
            return self.core.fail(run, S.PLANNING, 4, exc.code, exc, inputs=request.task)
        except ProviderError as exc:
            self._record_failed_attempts(run.run_id, llm_input, failures or [exc])
            target = S.TIMEOUT if exc.kind == "timeout" else S.FAILED
            return self.core.fail(run, S.PLANNING, 4, f"llm_{exc.kind}", exc, target=target, inputs=request.task,
                                  retries=max(len(failures), 1) - 1)
        self._record_failed_attempts(run.run_id, llm_input, failures)
        elapsed = (time.perf_counter() - started) * 1000
        usage = outcome.response.usage
        cost = self._cost(run, outcome.response)
        context["plan"] = outcome.plan.model_dump(mode="json", by_alias=True)
        context["flattened"] = outcome.flattened
        context["cost"] = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                           "usd": usage.cost_usd}
        notes = [f"flattened to listed order: {outcome.dag_problem}"] if outcome.flattened else []
        if failures:
            notes.append(f"planned after {len(failures)} failed provider attempt{'s' if len(failures) != 1 else ''}")
        detail = "; ".join(notes)
        records = trace_records(step_trace(run.run_id, 4, llm_input["context"], context["plan"], elapsed,
                                           detail=detail))
        if outcome.flattened:
            self.core.store.audit(run.run_id, "plan_flattened", "plan_orchestrator",
                                  {"problem": outcome.dag_problem})
        records.extend(trace_records(cost))
        llm_record, llm_contents = self.core.writes.llm_call(run.run_id, "plan", llm_input,
                                                             response=outcome.response.model_dump(mode="json"))
        records.append(llm_record)
        # the assembled context has served its purpose; it stays, by hash, in the plan request's blob
        # (A5), so the Run row rewritten at every later transition does not carry it (assembled_context)
        context.pop("context", None)
        context["plan_request_hash"] = llm_record.payload["request_hash"]

        def ledger_and_blobs(tx: Tx) -> None:
            self.core.writes.put_contents(tx, llm_contents, run.run_id)
            self.core.writes.insert_cost(tx, cost)  # last: it locks the tenant's spend total until the commit

        count = len(outcome.plan.steps)
        what = f"plan with {count} step{'s' if count != 1 else ''}" if count else "a direct answer"
        return self.core.advance(run, S.PLANNING, S.POLICY_CHECK,
                                 what if round_no == 1 else f"round {round_no}: {what}",
                                 records, context=context, also=ledger_and_blobs)

    def _record_failed_attempts(self, run_id: str, llm_input: dict[str, Any], failures: list[ProviderError]) -> None:
        """One "llm" record for each provider attempt at the plan that failed, numbered from 1 (retried
        ones included, so that every call made is visible)."""
        for number, exc in enumerate(failures, start=1):
            self.core.writes.record_llm_call(run_id, "plan", llm_input, error={
                "kind": exc.kind, "message": str(exc), "retryable": exc.retryable, "attempt": number})

    def _cost(self, run: RunRecord, response: LLMResponse, purpose: str = "plan") -> CostTrace:
        usage = response.usage
        return CostTrace(run_id=run.run_id, source=f"llm:{response.provider}:{purpose}",
                         input_tokens=usage.input_tokens, output_tokens=usage.output_tokens, api_calls=1,
                         usd=usage.cost_usd, unit_price=unit_price(usage), priced=usage.priced,
                         model=response.model, tenant_id=run.tenant_id, user_id=run.user_id,
                         parent_run_id=run.parent_run_id)

    def _record_cost(self, run: RunRecord, response: LLMResponse, purpose: str = "plan") -> None:
        self.core.writes.record_cost(self._cost(run, response, purpose))

    def check_policy(self, run: RunRecord, request: RunRequest) -> RunRecord:
        """Step ⑤: POLICY_CHECK → EXECUTING, AWAITING_HITL (an approval request opened) or REJECTED."""
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
        records += trace_records(step_trace(run.run_id, 5, context["plan"], decision.model_dump(mode="json"), elapsed))
        if decision.decision == "reject":
            reasons = "; ".join(f"{v.rule_id}: {v.reason}" for v in decision.rejecting)
            return self.core.advance(run, S.POLICY_CHECK, S.REJECTED, f"policy rejected: {reasons}", records,
                                     context=context, result={"error": f"rejected by policy: {reasons}"})
        if decision.decision == "await_hitl":
            hitl = self.core.hitl
            most = hitl.settings.max_pending_per_requester
            if hitl.pending_count(caller.tenant_id, caller.user_id) >= most:
                reason = f"hitl.rate_limit: {caller.user_id} already has {most} approval requests waiting"
                return self.core.advance(run, S.POLICY_CHECK, S.REJECTED, reason, records, context=context,
                                         result={"error": f"rejected by policy: {reason}"})
            req = hitl.new_request(run.run_id, caller.tenant_id, caller.user_id, decision.level, plan_actions(plan))
            if run.deadline_at is not None and run.deadline_at < req.deadline_at:
                # a child's approval is useless once its parent stopped waiting (T4): due by then
                req = dataclasses.replace(req, deadline_at=run.deadline_at)
            context["approval"] = {"request_id": req.request_id, "actions_hash": req.actions_hash,
                                   "level": req.level}
            records += trace_records(HITLTrace(run_id=run.run_id, request_id=req.request_id, event="requested",
                                               level=req.level, actions_hash=req.actions_hash,
                                               reason=approvals_needed(req.required_approvals, req.deadline_at)))
            return self.core.advance(run, S.POLICY_CHECK, S.AWAITING_HITL, f"needs {decision.level} approval",
                                     records, context=context, also=lambda conn: hitl.insert(conn, req))
        return self.core.advance(run, S.POLICY_CHECK, S.EXECUTING, "every call passed policy at L1", records,
                                 context=context)
