"""Run manager (step ①, seed 004 §3.1): owns a Run's lifecycle from request to ResultSink.

`create_run` validates the request, makes the Run durable in CREATED, then `drive` carries it through
the pipeline until it is final or parks in AWAITING_HITL. Every step writes its StepTrace inside the
transition that ends it. A Run parked for approval holds nothing in memory: `decide` persists the
decision and `drive` resumes from the persisted RunContext, skipping completed steps (G6, T6).

No Run is left silent: an exception a step did not expect (a provider's KeyError, a bug) ends the Run
FAILED at once, with an ErrorTrace naming the exception's type and its stack's hash, instead of leaving
it where it was for the sweeper. Errors that are not the Run's failure still propagate: the database's
(StoreError, a lease taken over), a Run that moved on first or belongs to another process's agent
(ConflictError, SkillsElsewhereError), and bad input (BadInputError).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import ValidationError

from harness.domain.contracts import (
    DEFAULT_CHAIN_DEPTH,
    DEFAULT_MAX_ROUNDS,
    AssembledContext,
    CallerIdentity,
    RunRequest,
    RunResult,
)
from harness.domain.errors import (
    BadInputError,
    ConflictError,
    InvalidRequestError,
    InvalidTransitionError,
    StoreError,
    UnknownRunError,
)
from harness.domain.ids import ordered_id
from harness.domain.limits import RequestLimits
from harness.domain.records import NewRun, RunRecord
from harness.domain.traces import error_trace, step_trace
from harness.drive.state_machine import StateMachine
from harness.kernel.states import TRANSIENT
from harness.kernel.thresholds import DEFAULT_EXECUTION_LIMIT_S
from harness.pipeline.call_budget import CallBudget
from harness.pipeline.child_runs import ChildRuns
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.intake import RolesOf, admit, body_hash
from harness.pipeline.plan_orchestrator import PlanOrchestrator
from harness.pipeline.queue import QueueLimits, close_not_started, is_late, start_deadline, with_start_by
from harness.pipeline.run_core import DRIVE, Drive, RunCore, S, fence_for, trace_records
from harness.pipeline.run_decider import RunDecider
from harness.pipeline.run_executor import RunExecutor
from harness.pipeline.run_preparer import PREPARED, RunPreparer
from harness.pipeline.tool_controller import ToolController
from harness.pipeline.tool_kinds import ChildWait
from harness.policy.hitl import Decision, HitlDesk
from harness.ports import Fence
from harness.ports.leases import RunLeases
from harness.ports.ledger import CostLedger
from harness.ports.runs import RunStore, RunWrites
from harness.ports.units import UnitOfWork

#: what a drive raises that is not its Run's failure: left to the caller, as before
NOT_THE_RUNS_FAILURE = (StoreError, ConflictError, BadInputError, InvalidTransitionError)
#: the step a Run in each main-path state is at (the states an unexpected failure ends from)
_STEP_OF = {S.PREPARING: 2, S.PLANNING: 4, S.POLICY_CHECK: 5, S.EXECUTING: 6}


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


class RunManager:
    """Creates Runs and carries each along its one path: accepted, prepared (the preparer: context, plan,
    policy), executed (the executor: the plan's steps), round after round, then closed; a Run parked for
    approval moves on a human's decision (the decider). The collaborators share a core (the ports, the
    drive's fence, a step's transition) and are each handed only what their job needs."""

    def __init__(self, *, store: RunStore, writes: RunWrites, machine: StateMachine, assembler: ContextAssembler,
                 orchestrator: PlanOrchestrator, policy: PolicyEngine, tools: ToolController, hitl: HitlDesk,
                 ledger: CostLedger, execution_limit_s: float = DEFAULT_EXECUTION_LIMIT_S,
                 chain_depth: int = DEFAULT_CHAIN_DEPTH,
                 limits: RequestLimits | None = None, roles_of: RolesOf | None = None,
                 check_callback: Callable[[RunRequest], None] | None = None,
                 max_rounds: int = DEFAULT_MAX_ROUNDS,
                 child_leases: RunLeases, units: UnitOfWork, queue: QueueLimits | None = None,
                 system_history: bool = False, call_budget: CallBudget | None = None) -> None:
        self.store = store
        self.writes = writes
        self.units = units
        self.machine = machine
        self.assembler = assembler
        self.orchestrator = orchestrator
        self.policy = policy
        self.hitl = hitl
        self.ledger = ledger
        #: refuses a callback this deployment cannot sign or does not allow (set by the composition root)
        self.check_callback = check_callback
        #: whether a caller's history may speak as the system (the agent's `system_history`)
        self.system_history = system_history
        #: checks a model call's worst case against the budget caps before the call (None: no check)
        self.call_budget = call_budget
        self.execution_limit_s = execution_limit_s
        #: the delegation budget of a Run whose caller gives none, and the most a caller may give (§4.1)
        self.chain_depth = chain_depth
        #: how many rounds a Run may plan (SPEC K2, rounds): a plan asking for more is refused by policy
        self.max_rounds = max_rounds
        self.limits = limits or RequestLimits()
        #: the queue of Runs not yet started: its bound (admission control) and the default start deadline
        self.queue = queue or QueueLimits()
        self.roles_of = roles_of  # the identity directory's roles for a request that names none
        self.core = RunCore(store=store, writes=writes, units=units, machine=machine, hitl=hitl, assembler=assembler,
                            call_budget=call_budget)
        self.preparer = RunPreparer(self.core, tools=tools, policy=policy, assembler=assembler,
                                    orchestrator=orchestrator, chain_depth=chain_depth, max_rounds=max_rounds)
        self.executor = RunExecutor(self.core, tools=tools, policy=policy, orchestrator=orchestrator,
                                    execution_limit_s=execution_limit_s)
        self.decider = RunDecider(store=store, writes=writes, machine=machine, hitl=hitl, registry=tools.registry)
        self._tools = tools
        #: drives a Run under its lease (the composition root sets a RunWorker's `execute`): every entry
        #: point that drives — `harness run`, a decision's resume, a child Run — holds the Run's lease and
        #: heartbeats it, so a second driver never starts while it lives (K5b, T6). It returns None when
        #: another live driver holds the lease.
        self.driver: Callable[[str], RunResult | None] | None = None
        #: child Runs (AgentInvoke): the parent's wait, and waking a parent whose child ended (T4)
        self.children = ChildRuns(self, child_leases)

    @property
    def tools(self) -> ToolController:
        """The tool controller the preparer and the executor use."""
        return self._tools

    @tools.setter
    def tools(self, tools: ToolController) -> None:
        # replaced in both (a replay wraps it to answer every call from its recording)
        self._tools = self.preparer.tools = self.executor.tools = tools

    # ------------------------------------------------------------------ a Run's path

    def create_run(self, raw: RunRequest | dict[str, Any]) -> RunResult:
        """Submit and drive a Run until it is final or waits for a human.

        Its caller gets its id only with its result, so the Run's acceptance commits with what its drive
        writes up to the model's call (its lease, CREATED→PREPARING→PLANNING): in one transaction, not
        three. Its context is assembled first, before anything is written (steps ② and ③ only read), so
        that transaction is never held while the assembly runs. A crash before that commit leaves
        nothing, as if the Run had never been asked for, and nobody holds its id."""
        run_id = ordered_id()
        request = self._admitted(raw)
        prepared = self.preparer.preparation(run_id, request)
        token = PREPARED.set(prepared)
        try:
            with self.units.unit(run_id):
                run, created = self._accept(request, run_id)
                if created:
                    prepared.accepted = run  # nobody else sees it before this unit commits: its drive starts here
                    return self.drive(run_id)
        finally:
            PREPARED.reset(token)
        return self.result(run.run_id)

    def submit(self, raw: RunRequest | dict[str, Any], *, run_id: str | None = None) -> tuple[RunRecord, bool]:
        """Validate and durably create a Run in CREATED (step ①), under `run_id` when given; (run, created)
        — an idempotency key the caller (tenant and user) already used returns that Run with created
        False, or raises IdempotencyConflictError if it came with another request. A request over its
        limits (harness.pipeline.intake), or one that finds the queue of Runs waiting to start full
        (BacklogFullError, harness.pipeline.queue), creates nothing."""
        return self._accept(self._admitted(raw), run_id or ordered_id())

    def _admitted(self, raw: RunRequest | dict[str, Any]) -> RunRequest:
        """The request as it will be stored, or the error that refuses it (nothing is written). Every way a
        Run is asked for passes here — the CLI, the HTTP API, `Harness` — so the queue's bound is checked
        once, last: a request that is wrong is told so before it is told to come back later."""
        request = self._with_chain_budget(admit(parse_request(raw), self.limits, self.assembler.filter, self.roles_of))
        if not self.system_history:
            for i, message in enumerate(request.history):
                if message.role == "system":
                    raise InvalidRequestError(
                        f"invalid run request: history.{i}.role: a caller's history may not hold system messages "
                        "(the agent's own instructions are the system's; an agent allows them with "
                        "system_history: true)")
        if request.callback is not None and self.check_callback is not None:
            self.check_callback(request)
        if request.retry_of is not None:
            self.store.get_run(request.retry_of)  # a retry must name a Run that exists
        self.queue.start_by(request, self.store.clock.now())  # a deadline already passed is bad input
        self.queue.admit(self.store)
        return request

    def _accept(self, request: RunRequest, run_id: str) -> tuple[RunRecord, bool]:
        # the start deadline is settled now (the default filled in), but the idempotency key stays bound to
        # the request as the caller sent it: a repeated submit a second later is the same request
        start_by = self.queue.start_by(request, self.store.clock.now())
        return self.store.create_run(NewRun(
            tenant_id=request.tenant_id, user_id=request.user_id, session_id=request.session_id,
            request=with_start_by(request, start_by).model_dump(mode="json"),
            idempotency_key=request.idempotency_key, retry_of=request.retry_of, request_hash=body_hash(request),
            run_id=run_id, start_by=start_by,
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

    @contextlib.contextmanager
    def prepared_ahead(self, run_id: str) -> Iterator[None]:
        """Around a drive that has yet to take the Run's lease: a Run still in CREATED (accepted, never
        driven) has its context assembled now, before anything is written or locked (steps ② and ③ only
        read, and a request never changes), so its lease, CREATED→PREPARING and PREPARING→PLANNING are one
        commit, before the model is called, instead of two. A Run anywhere else is driven as it is; so is
        one another worker moved on meanwhile (its drive reads the Run again under the lease and finds
        it past CREATED, leaving the work done here unused)."""
        ahead = PREPARED.get()
        if ahead is not None and ahead.run_id == run_id:  # create_run's own
            yield
            return
        try:
            run = self.store.get_run(run_id)
        except UnknownRunError:
            run = None  # the drive says so, as it always has
        if run is None or run.state != S.CREATED:
            yield
            return
        request = RunRequest.model_validate(run.request)
        if is_late(start_deadline(request), self.store.clock.now()):
            yield  # not worth preparing: its drive closes it without starting it
            return
        token = PREPARED.set(self.preparer.preparation(run_id, request))
        try:
            yield
        finally:
            PREPARED.reset(token)

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
        token = DRIVE.set(Drive(run_id, fence))
        try:
            with self.children.driving(run_id):
                try:
                    with self.units.unit(run_id):  # its end commits the park or the close
                        self._drive(run_id)
                except NOT_THE_RUNS_FAILURE:
                    raise
                except Exception as exc:  # unexpected: the Run fails now, named, not later by the sweeper
                    self._fail_unexpected(run_id, exc)
                return self.result(run_id)
        finally:
            DRIVE.reset(token)

    def _drive(self, run_id: str) -> None:
        """The path of a Run from wherever it stands: accepted (CREATED → PREPARING), prepared (steps ② and
        ③, the preparer), then round after round planned and checked (④ ⑤, the preparer) and executed (⑥,
        the executor), until it parks, closes, or did not move (a lost race, a fenced drive)."""
        run, request = self._to_drive(run_id)
        if run.state in TRANSIENT or run.state == S.TRACING:
            # a worker died between a failure (or success) and the close: finish the funnel
            self.machine.advance(run_id, run.state, lease_epoch=self.core.epoch(run_id))
            run = self.store.get_run(run_id)
        if run.state == S.CREATED and self._closed_late(run, request):
            return
        if run.state == S.CREATED:
            run = self.core.advance(run, S.CREATED, S.PREPARING, "request accepted",
                                    trace_records(step_trace(run_id, 1, run.request, {"run_id": run_id}, 0.0)))
        if run.state == S.PREPARING:  # also a Run whose worker died here: steps ②③ are side-effect free (P1)
            run = self.preparer.prepare(run, request)
        # the main path, round after round (EXECUTING → PLANNING when a plan asks for another round)
        for _ in range(3 * self.max_rounds + 3):
            before = (run.state, run.version)
            if run.state == S.PLANNING:
                run = self.preparer.plan(run, request)
            elif run.state == S.POLICY_CHECK:
                run = self.preparer.check_policy(run, request)
            elif run.state == S.EXECUTING:
                run = self.executor.execute(run, request)
            if run.state not in (S.PLANNING, S.POLICY_CHECK, S.EXECUTING) or (run.state, run.version) == before:
                break
        # the close: the executor's last move (TRACING, or a failure) is carried to the final state by the
        # state machine, which calls the ResultSink inside every close and park (harness.webhooks), whoever
        # makes it: the result reaches the caller from there, not from here, which only a drive passes through

    def _to_drive(self, run_id: str) -> tuple[RunRecord, RunRequest]:
        """The Run and its request, as this drive starts: prepared ahead in this context, or read."""
        prepared = PREPARED.get()
        if prepared is None or prepared.run_id != run_id:
            run = self.store.get_run(run_id)
            return run, RunRequest.model_validate(run.request)
        if prepared.accepted is not None:
            # accepted in this unit, not yet committed: the Run is as its acceptance wrote it (the drive reads
            # none of its lease columns: its fence holds the lease)
            run, prepared.accepted = prepared.accepted, None
            return run, prepared.request
        # read under the lease: another worker may have moved it on since it was prepared
        return self.store.get_run(run_id), prepared.request

    def _closed_late(self, run: RunRecord, request: RunRequest) -> bool:
        """Close a queued Run whose start deadline passed instead of starting it late; True when it was
        late (closed by this drive, or by whoever moved it first)."""
        deadline = start_deadline(request)
        if deadline is None or not is_late(deadline, self.store.clock.now()):
            return False
        close_not_started(self.store, self.machine, run.run_id, version=run.version, deadline=deadline,
                          created_at=run.created_at, noticed_by="driver", lease_epoch=self.core.epoch(run.run_id))
        return True

    def _fail_unexpected(self, run_id: str, exc: Exception) -> None:
        """End a Run whose drive raised `exc`, which no step expected: FAILED from the step it was in,
        with an ErrorTrace naming the exception's type and its stack's hash (the drive's unit was rolled
        back: this is a unit of its own). When that cannot be written either (the database is down, the
        lease was lost), `exc` propagates as before."""
        try:
            with self.units.unit(run_id):
                run = self.store.get_run(run_id)
                step = _STEP_OF.get(run.state)
                if step is None or self.core.fenced(run_id):
                    raise exc
                code = f"unexpected_{type(exc).__name__}"
                try:
                    said = self.core.scrub(str(exc))
                except Exception:  # the message cannot be filtered: it is not kept
                    said = "(message withheld)"
                message = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
                records = trace_records(step_trace(run_id, step, None, {"error": message}, 0.0, "error", message),
                                        error_trace(run_id, step, code, exc, message=message))
                self.core.advance(run, run.state, S.FAILED, f"{code}: {message}", records,
                                  result={"error": f"{code}: {message}"})
        except Exception as failing:
            if failing is exc:
                raise
            raise exc from failing

    # ------------------------------------------------------------------ decisions, cancels, results

    def decide(self, request_id: str, approver: CallerIdentity, decision: str, *, approved_hash: str | None = None,
               break_glass: bool = False, reason: str = "", resume: bool = True,
               driven_here: bool | None = None) -> tuple[Decision, RunResult]:
        """Record a human decision and the Run's move it causes in one transaction (G4: the decision is
        durable no later than its effect), then drive the approved Run on unless `resume` is false.

        An approval that this process drives (`driven_here`, by default `resume`) is refused before
        anything is recorded when the process lacks a skill the approved steps call, as the Run pinned it
        (SkillsUnavailableError): the Run stays parked for a process that runs its agent."""
        verdict = self.decider.decide(request_id, approver, decision, approved_hash=approved_hash,
                                      break_glass=break_glass, reason=reason,
                                      check_skills=resume if driven_here is None else driven_here)
        run_id = verdict.request.run_id
        if verdict.transition is not None and verdict.effect == "approved" and resume:
            return verdict, self.drive(run_id)
        return verdict, self.result(run_id)

    def check_skills_for(self, request_id: str) -> None:
        """Refuse (SkillsUnavailableError) to approve a request whose steps call a skill this process lacks."""
        self.decider.check_skills_for(request_id)

    def expire_approvals(self) -> list[str]:
        """Apply every due approval timeout (default-deny); the requests handled."""
        return self.decider.expire_approvals()

    def resume_decisions(self, older_than_s: float) -> list[str]:
        """Carry out decisions whose Run did not move; the Runs moved to EXECUTING, for a driver to resume."""
        return self.decider.resume_decisions(older_than_s)

    def cancel(self, run_id: str, *, by: str, reason: str = "cancelled by the user") -> RunResult:
        """Cancel a Run that has not finished (CLOSED_CANCELLED), or CancelRefusedError: see RunCore.cancel."""
        return self.core.cancel(run_id, by=by, reason=reason)

    def result(self, run_id: str) -> RunResult:
        """What the caller gets for a Run, in whatever state it is."""
        return self.core.result(run_id)

    def assembled_context(self, run_id: str) -> AssembledContext:
        """The context assembled for the Run (step ②); ContextError when it has none."""
        return self.core.assembled_context(run_id)

    def await_child(self, parent_id: str, child_id: str, until: float) -> ChildWait:
        """Drive or wait for a child Run of the Run this drive executes (AgentInvoke, T4)."""
        return self.children.await_child(parent_id, child_id, until, fence_for(parent_id))

    def prune_workdirs(self) -> list[str]:
        """Remove the working directories of final Runs whose close another process made (a sweeper
        elsewhere); this process's own closes remove theirs at once. Returns the Runs pruned."""
        return self.tools.prune(self.store.final_among)
