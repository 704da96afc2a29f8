"""The Run's executor, step ⑥ (seed 004 §3.5): execute the approved plan step by step under the drive's
fence, record each step's outcome in the RunContext, then answer, plan another round or fail."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.domain.contracts import RunRequest
from harness.domain.errors import (
    BudgetExceededError,
    ContextError,
    ProviderError,
    SkillsElsewhereError,
    UnknownRunError,
)
from harness.domain.plans import Plan, PlanStep, render_template
from harness.domain.records import RunRecord, TraceRecordIn
from harness.domain.traces import ToolTrace, TraceModel, error_trace, step_trace
from harness.kernel.events import LOST_RACE, TOOL_CALL_FAILED
from harness.pipeline import rounds
from harness.pipeline.artifacts import files_of
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.plan_orchestrator import PlanOrchestrator, StepRun, resolve
from harness.pipeline.run_core import MANAGER, RunCore, S, Waiting, WaitingResult, fence_for, trace_records
from harness.pipeline.tool_controller import ToolController
from harness.pipeline.tool_kinds import StepTimeoutError, ToolCallError
from harness.ports import Fence
from harness.skills.manifests import Skill


class RunExecutor:
    """Step ⑥: EXECUTING until the plan's steps are done, then an answer or another round."""

    def __init__(self, core: RunCore, *, tools: ToolController, policy: PolicyEngine,
                 orchestrator: PlanOrchestrator, execution_limit_s: float) -> None:
        self.core = core
        #: calls the skills and writes the answer (a replay swaps it for its own)
        self.tools = tools
        self.policy = policy
        self.orchestrator = orchestrator
        self.execution_limit_s = execution_limit_s

    def execute(self, run: RunRecord, request: RunRequest) -> RunRecord:
        """EXECUTING → TRACING (answered), PLANNING (another round), or the failure that stopped a step."""
        context = dict(run.context or {})
        context["steps"] = dict(context.get("steps", {}))
        drive = self.core.drive_of(run.run_id)
        if drive is not None:
            drive.context = context
        return self._execute_plan(run, request, context)

    def _execute_plan(self, run: RunRecord, request: RunRequest, context: dict[str, Any]) -> RunRecord:
        plan = Plan.model_validate(context["plan"])
        missing = sorted({step.tool_call.skill for step in plan.steps if self.tools.registry.get(step.tool_call.skill)
                          is None and step.id not in context["steps"]})
        if missing:  # another agent's Run (a decision recorded elsewhere, a re-drive): not this process's to fail
            raise SkillsElsewhereError(run.run_id, missing)
        approved = self._approved_actions(run.run_id, context)
        outputs = {**rounds.earlier_outputs(context), **rounds.ok_outputs(context.get("steps", {}))}
        deadline = self._deadline(run, rounds.executing_spent(context))
        started = time.perf_counter()

        # before the first tool call: the plan, its verdicts and the move to EXECUTING are durable
        self.core.units.boundary()
        # when this drive has just committed that move itself, under its lease, the Run's standing is known
        # as of that commit: the first step does not read it again (a cancel landing now is one landing
        # a moment after that read; the steps after it, and a non-idempotent call's mark, still check)
        known = [self._entered_executing(run.run_id)]

        def run_step(step: PlanStep, available: dict[str, Any]) -> StepRun:
            standing_known, known[0] = known[0], False
            return self._run_step(run, request, step, available, approved, deadline, standing_known)

        report = self.orchestrator.execute(plan, bool(context.get("flattened")), outputs, run_step,
                                           before_parallel=self.core.units.boundary)
        elapsed = (time.perf_counter() - started) * 1000
        if report.failure is not None:
            failure = report.failure
            if failure.error_code == "superseded":
                now = self.core.store.get_run(run.run_id)
                if self.core.fenced(run.run_id):
                    return now  # a fenced worker writes nothing more, not even about itself (K5b)
                self.core.store.audit(run.run_id, LOST_RACE, MANAGER, {
                    "attempted_to": "continue EXECUTING", "actual": now.state.value, "reason": failure.error})
                return now
            timed_out = failure.error_code in ("timeout", "run_time_limit", "child_run_timeout")
            target = S.TIMEOUT if timed_out else S.FAILED
            code = failure.error_code or "step_failed"
            detail = (failure.error or "").removeprefix(f"{code}: ")  # the code leads the message once
            return self.core.fail(self.core.store.get_run(run.run_id), S.EXECUTING, 6, code,
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
                return self.core.fail(run, S.EXECUTING, 6, "answer_template", f"answer template: {exc}")
        result: dict[str, Any] = {"answer": answer, "artifacts": outputs}
        with self._context_lock(run.run_id):
            files = files_of(self._live_context(run.run_id))
        if files:  # the files the Run's sandboxed calls wrote and kept, every round's
            result["files"] = [f.model_dump(mode="json") for f in files]
        records = trace_records(step_trace(run.run_id, 6, context["plan"], outputs, elapsed),
                                step_trace(run.run_id, 8, {"run_id": run.run_id}, result, 0.0))
        return self.core.advance(run, S.EXECUTING, S.TRACING, "every step succeeded", records, result=result)

    def _next_round(self, run: RunRecord, context: dict[str, Any], outputs: dict[str, Any],
                    elapsed_ms: float) -> RunRecord:
        """EXECUTING → PLANNING: the round is complete and recorded (with the transition), so no drive
        repeats it; the model plans the next one from its results (SPEC K2, rounds)."""
        round_no = rounds.number(context)
        executing_s = max(0.0, self.core.store.clock.now() - run.last_state_change_at)
        records = trace_records(step_trace(run.run_id, 6, context["plan"], outputs, elapsed_ms,
                                           detail=f"round {round_no} done"))
        return self.core.advance(run, S.EXECUTING, S.PLANNING,
                                 f"round {round_no} done: the model plans round {round_no + 1} from its results",
                                 records, context=rounds.close_round(context, executing_s))

    def _answer_from_results(self, run: RunRecord, request: RunRequest, outputs: dict[str, Any],
                             deadline: float) -> str | RunRecord:
        """The final answer written by the model from the results: one LLM call through the tool
        controller (secrets filtered, costed), recorded for replay. The Run as it now is when the call
        could not be made or failed."""
        if self.core.stopped(run.run_id) is not None:
            return self.core.store.get_run(run.run_id)  # cancelled, swept or taken over: nothing leaves
        messages = rounds.answer_messages(request.task, outputs, self.core.scrub)
        system = self.core.assembled_context(run.run_id).system_prompt
        llm_input = {"purpose": "answer", "system": system, "messages": [m.model_dump(mode="json") for m in messages]}
        try:
            with self.core.units.effect():  # before the model is called, what led here is durable
                response = self.tools.compose_answer(system, messages, run_id=run.run_id, caller=request.caller,
                                                     deadline=deadline, fit=self.core.fit(request.caller, run.run_id))
        except (ProviderError, ContextError, StepTimeoutError, ToolCallError, BudgetExceededError) as exc:
            code = getattr(exc, "code", None) or (f"llm_{exc.kind}" if isinstance(exc, ProviderError) else "timeout")
            if isinstance(exc, ProviderError):
                self.core.writes.record_llm_call(run.run_id, "answer", llm_input, error={
                    "kind": exc.kind, "message": str(exc), "retryable": exc.retryable})
            timed_out = isinstance(exc, StepTimeoutError) or (isinstance(exc, ProviderError) and exc.kind == "timeout")
            return self.core.fail(run, S.EXECUTING, 8, code, f"writing the answer from the results: {exc}",
                                  target=S.TIMEOUT if timed_out else S.FAILED)
        self.core.writes.record_llm_call(run.run_id, "answer", llm_input, response=response.model_dump(mode="json"))
        return response.content

    def _deadline(self, run: RunRecord, spent_s: float = 0.0) -> float:
        """time.monotonic() by which execution must end: the execution limit (T5) less what earlier rounds
        spent executing, counted from when the Run entered EXECUTING (so a drive resumed after a crash does
        not start the clock again), or sooner when the Run is a child whose parent gave it only what was
        left of its own budget (deadline_at, T4)."""
        now = self.core.store.clock.now()
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
        request = self.core.hitl.approved_for(run_id, approval["actions_hash"])
        if request is None:
            return {}
        return {a["step_id"]: a for a in request.actions}

    def _entered_executing(self, run_id: str) -> bool:
        """Whether this drive moved the Run into EXECUTING itself and has run no step since (cleared)."""
        drive = self.core.drive_of(run_id)
        if drive is None:
            return False
        entered, drive.entered_executing = drive.entered_executing, False
        return entered

    def _run_step(self, run: RunRecord, request: RunRequest, step: PlanStep, available: dict[str, Any],
                  approved: dict[str, dict[str, Any]] | None, deadline: float, standing_known: bool = False) -> StepRun:
        def fail(code: str, message: str) -> StepRun:
            return StepRun(step.id, step.output_key, False, error=message, error_code=code)

        stopped = None if standing_known else self.core.stopped(run.run_id)
        if stopped == "left":
            return fail("superseded", "the Run left EXECUTING (cancelled or swept)")
        if stopped == "fenced":
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
        # a call with side effects starts only once its mark is in the database while the Run is EXECUTING:
        # a cancel that commits first stops it, and one that commits after lists it (RunResult.effects)
        effect = skill.manifest.risk.access != "read" and skill.manifest.call_kind != "agent"
        if once_only or (effect and earlier.get("status") is None):
            refusal = self._mark_started(run.run_id, step, effect=effect)
            if refusal == "superseded":
                return fail("superseded", "the Run left EXECUTING (cancelled or swept) or its lease was taken over")
            if refusal is not None and once_only:
                return self._refuse(run, step, "outcome_unknown",
                                    f"outcome of {step.id} unknown: the database already records it as "
                                    f"{refusal} by another drive, so {skill.id} is not run again")
        # Before a call, what it depends on commits (`effect`): its "started" mark, and the results of
        # earlier calls. Only an idempotent, read-only, in-process call neither needs that nor leaves
        # anything to lose: nothing is held while it runs (`release`), and its result waits for the next
        # boundary (`defer`); a crash before that runs the call again, which is harmless.
        rides = skill.manifest.idempotent and skill.manifest.risk.access == "read" and \
            skill.manifest.call_kind == "local"
        if rides:
            self.core.units.release()
        with contextlib.nullcontext() if rides else self.core.units.effect():
            call = self.tools.call(skill, arguments, run_id=run.run_id, step_id=step.id,
                                   output_key=step.output_key, caller=request.caller, deadline=deadline,
                                   may_fall_back=self._fallback_check(run, step, arguments))
        self._record_step(run.run_id, call.outcome.recorded(), [*call.traces] + (
            [error_trace(run.run_id, 6, call.trace.error_code or "error", call.exception, call.outcome.attempts - 1,
                         message=(call.outcome.error or "").removeprefix(f"{call.trace.error_code}: ") or None)]
            if call.exception is not None else []), values=(arguments, call.outcome.output, *call.contents),
            later=rides)
        if call.exception is not None:
            if not self.core.fenced(run.run_id):  # a key event of its own, besides the Run's failure that may follow
                self.core.store.audit(run.run_id, TOOL_CALL_FAILED, "tool_controller", {
                    "step_id": step.id, "skill": call.trace.skill_id, "error_code": call.trace.error_code,
                    "attempts": call.outcome.attempts})
            return StepRun(step.id, step.output_key, False, error=call.outcome.error, error_code=call.trace.error_code)
        return StepRun(step.id, step.output_key, True, output=call.outcome.output)

    def _parent_gone(self, run: RunRecord) -> str | None:
        """For a child Run: why nobody waits for it any more (its parent left EXECUTING), after cancelling
        it; None while its parent waits. Checked before each step, so an approval that arrives after
        the parent was cancelled or swept starts nothing."""
        assert run.parent_run_id is not None
        try:
            state = self.core.store.state_of(run.parent_run_id).value
        except UnknownRunError:
            state = "gone"
        if state == S.EXECUTING.value:
            return None
        reason = f"its parent Run {run.parent_run_id} is {state}: nobody waits for its result"
        self.core.cancel(run.run_id, by=MANAGER, reason=reason)
        return reason

    def _refuse(self, run: RunRecord, step: PlanStep, code: str, message: str) -> StepRun:
        trace = ToolTrace(run_id=run.run_id, step_id=step.id, skill_id=step.tool_call.skill, skill_version="-",
                          manifest_hash="-", idempotency_key=f"{run.run_id}:{step.id}", arguments_hash="-",
                          result_hash=None, attempts=0, duration_ms=0.0, status="refused", error_code=code)
        self.core.store.record(trace_records(trace, error_trace(run.run_id, 6, code, message)))
        return StepRun(step.id, step.output_key, False, error=message, error_code=code)

    def _context_lock(self, run_id: str) -> threading.Lock:
        """The lock of the live RunContext of this drive of Run `run_id` (its parallel steps share it); outside
        a drive a lock of its own, as the RunContext is then read from the store, shared with no one."""
        drive = self.core.drive_of(run_id)
        return drive.lock if drive is not None else threading.Lock()

    def _live_context(self, run_id: str) -> dict[str, Any]:
        """The RunContext this drive is executing with (kept in memory: under the lease nobody else writes
        it); read from the store when called outside an execution. Call with the context lock held."""
        drive = self.core.drive_of(run_id)
        context = drive.context if drive is not None else None
        if context is None:
            context = dict(self.core.store.get_run(run_id).context or {})
            context["steps"] = dict(context.get("steps", {}))
        return context

    def _mark_started(self, run_id: str, step: PlanStep, *, effect: bool = False) -> str | None:
        """Record that a non-idempotent call, or one with side effects (`effect`, also listed in the
        RunContext's `effects`), is about to run, so a worker that takes over after a crash knows its
        outcome is unknown instead of repeating it (T6), and a cancel knows what had started. The mark is
        a conditional write, judged in the database at this moment, not against the Run as read when this
        drive began: it is refused
        ("superseded") unless the Run is still EXECUTING under this drive's lease, or with the status the
        database already holds for the step when another drive got there first. None: marked."""
        with self._context_lock(run_id):
            context = self._live_context(run_id)
            entry = {"step_id": step.id, "output_key": step.output_key, "status": "started"}
            effects = [*context.get("effects", []), {"step_id": step.id, "skill": step.tool_call.skill}] \
                if effect else context.get("effects")
            # taken before the mark opens the transaction they wait for: the RunContext it writes already
            # holds their results (the live one), so theirs is not written first only to be replaced. Only
            # in the drive's own unit, where the mark and their records commit together: a parallel step's
            # mark commits alone, and a crash after it would leave results in the RunContext without records
            waiting = self._waiting(run_id).take() if self.core.units.joined() else []
            marked = {**context, "steps": {**context["steps"], step.id: entry}}
            if effects is not None:
                marked["effects"] = effects
            refusal = self.core.store.mark_step_started(run_id, step.id, marked, lease_epoch=self.core.epoch(run_id))
            if refusal is None:
                context["steps"][step.id] = entry
                if effects is not None:
                    context["effects"] = effects
            if waiting:
                # marked: their records and contents, in the mark's transaction; refused (nothing written):
                # the RunContext as of the last of them too, fenced, as when no mark follows them
                self._save_waiting(run_id, fence_for(run_id), waiting, with_context=refusal is not None)
            return refusal

    def _record_step(self, run_id: str, outcome: dict[str, Any], traces: list[TraceModel],
                     values: tuple[Any, ...] = (), *, later: bool = False) -> None:
        """Persist a step's result with its traces before any step that depends on it leaves the process
        (T6, at effect boundaries): in the drive's transaction now, or `later`, with its next one (the
        result of a call that may run again). Results that wait for the same transaction are written
        together: their records and contents, and the RunContext as of the last of them, in one save."""
        fence = fence_for(run_id)
        if fence is not None and fence.lost:
            return  # the Run was taken over: its new worker owns the RunContext now
        records = [t.to_record() for t in traces]
        with self._context_lock(run_id):
            context = self._live_context(run_id)
            context["steps"][outcome["step_id"]] = outcome
            if not later:
                # the contents behind the ToolTrace's argument/result hashes, for replay (A5)
                self._save(run_id, fence, context, records, values)
                return
            waiting = self._waiting(run_id)
            # added under the context lock: the last result added is the one whose RunContext has them all
            waiting.add(records, values, {**context, "steps": dict(context["steps"])})

        def save_waiting() -> None:
            # run when the drive's next transaction opens, maybe under the context lock (a started mark,
            # which takes what waits itself first, leaving nothing here)
            if taken := waiting.take():
                self._save_waiting(run_id, fence, taken, with_context=True)

        self.core.units.defer(save_waiting)

    def _waiting(self, run_id: str) -> Waiting:
        """The results of this drive of Run `run_id` that wait for its next transaction (none outside one)."""
        drive = self.core.drive_of(run_id)
        return drive.waiting if drive is not None else Waiting()

    def _save_waiting(self, run_id: str, fence: Fence | None, taken: list[WaitingResult], *,
                      with_context: bool) -> None:
        """Write waiting results in one save: all their records and contents, with the RunContext as of the
        last of them, or without it when the transaction writes a later one (a started mark)."""
        records = [r for rs, _, _ in taken for r in rs]
        values = tuple(v for _, vs, _ in taken for v in vs)
        self._save(run_id, fence, taken[-1][2] if with_context else None, records, values)

    def _save(self, run_id: str, fence: Fence | None, context: dict[str, Any] | None,
              records: list[TraceRecordIn], values: tuple[Any, ...]) -> None:
        """Save step results: their records and contents, and the RunContext unless None. Fenced in the
        write itself: a lease taken over meanwhile writes nothing (its new worker owns the RunContext
        now), and this drive stops before its next effect. Without a RunContext the caller's transaction
        has just checked the fence (a started mark)."""
        epoch = fence.epoch if fence is not None and context is not None else None
        saved = self.core.writes.save_context(run_id, context, records, values, lease_epoch=epoch)
        if not saved and fence is not None:
            fence.lose()
