"""What every collaborator of the Run manager shares (seed 004 §3.1): the ports the steps write through,
the drive in progress (its fence and RunContext, per context), a Run's result, cancelling, and making a
step's transition.

The Run manager (run_manager) composes this core with three collaborators, each handed the core and the
few ports of its own job: the preparer (run_preparer: steps ② to ⑤, context, plan, policy), the executor
(run_executor: step ⑥, executing the plan) and the decider (run_decider: approvals, their timeouts and
the sweeper's carrying out of decisions)."""

from __future__ import annotations

import contextvars
import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

from harness.domain.contracts import AssembledContext, CallerIdentity, RunResult, effects_of
from harness.domain.errors import CancelRefusedError, ContextError
from harness.domain.llm import LLMRequest
from harness.domain.records import RunRecord, TraceRecordIn
from harness.domain.traces import TraceModel, error_trace, step_trace
from harness.drive.state_machine import StateMachine
from harness.kernel.events import LOST_RACE
from harness.kernel.states import FINAL, TRANSIENT, RunState
from harness.pipeline.call_budget import CallBudget
from harness.pipeline.context_assembler import ContextAssembler
from harness.policy.hitl import HitlDesk
from harness.ports import Fence
from harness.ports.runs import RunStore, RunWrites
from harness.ports.units import UnitOfWork

S = RunState
MANAGER = "run_manager"
#: a cancel that keeps losing races to the Run's own steps gives up after this many tries (each lost race
#: means the Run moved one step on, so a handful covers every path to a cancellable state)
_CANCEL_ATTEMPTS = 8
_CANCELLED = (S.CANCELLED, S.CLOSED_CANCELLED)


#: one step result waiting for the drive's next transaction: its trace records, the contents they reference,
#: and the RunContext as of it
WaitingResult = tuple[list[TraceRecordIn], tuple[Any, ...], dict[str, Any]]


@dataclasses.dataclass
class Waiting:
    """Step results waiting for one transaction, written together, once: each one's trace records and
    contents, and the RunContext as of it (the last one's is written)."""

    results: list[WaitingResult] = dataclasses.field(default_factory=list)
    #: guards `results` alone: taken when the wait ends, which may be inside a block holding other locks
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def add(self, records: list[TraceRecordIn], values: tuple[Any, ...], context: dict[str, Any]) -> None:
        with self.lock:
            self.results.append((records, values, context))

    def take(self) -> list[WaitingResult]:
        """What waits, emptied (nothing when an earlier result's turn took this one too)."""
        with self.lock:
            taken, self.results = self.results, []
        return taken


@dataclasses.dataclass
class Drive:
    """One drive of one Run: its fence (lease) and the RunContext it executes with. Held in a context
    variable, not keyed by run_id on the manager: two drives of the same Run in one process (a paused
    worker and the one that took over) must never see each other's lease."""

    run_id: str
    fence: Fence | None
    context: dict[str, Any] | None = None
    #: step results waiting for the drive's next transaction (calls that may run again)
    waiting: Waiting = dataclasses.field(default_factory=Waiting)
    #: this drive moved the Run into EXECUTING itself (under its lease) and has not executed a step since
    entered_executing: bool = False
    #: guards `context`, which the drive's parallel steps record their results into. One per drive, never
    #: one per process: a drive holding its open transaction (SQLite's one write lock) may wait for it, so
    #: a drive of another Run holding it while it waits for that write lock would deadlock the two
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


DRIVE: contextvars.ContextVar[Drive | None] = contextvars.ContextVar("harness_drive", default=None)


def fence_for(run_id: str) -> Fence | None:
    """The fence of this context's drive of Run `run_id` (None: not driving it, or driving it unleased)."""
    drive = DRIVE.get()
    return drive.fence if drive is not None and drive.run_id == run_id else None


def trace_records(*models: TraceModel) -> list[TraceRecordIn]:
    return [m.to_record() for m in models]


class RunCore:
    """The ports every step writes through and the operations all the collaborators use: a transition
    made from a step, a failure, the drive's fence, the secret filter, a Run's result and its cancel."""

    def __init__(self, *, store: RunStore, writes: RunWrites, units: UnitOfWork, machine: StateMachine,
                 hitl: HitlDesk, assembler: ContextAssembler, call_budget: CallBudget | None = None) -> None:
        self.store = store
        self.writes = writes
        #: the drive's unit of work: its writes commit at the boundaries before each effect (ports.units)
        self.units = units
        self.machine = machine
        self.hitl = hitl
        #: its secret filter scrubs what goes to a model (read at each use: a test may swap it)
        self.assembler = assembler
        #: checks a model call's worst case against the budget caps before the call (None: no check)
        self.call_budget = call_budget

    @staticmethod
    def drive_of(run_id: str) -> Drive | None:
        """This context's drive of Run `run_id`, if it is driving that Run."""
        drive = DRIVE.get()
        return drive if drive is not None and drive.run_id == run_id else None

    def result(self, run_id: str) -> RunResult:
        """What the caller gets for a Run, in whatever state it is."""
        state, stored, path = self.store.outcome_of(run_id)
        stored = stored or {}
        pending = [r for r in self.hitl.for_run(run_id) if r.status == "pending"] \
            if state == S.AWAITING_HITL else []
        # a cancelled Run's answer says which calls with side effects had started before the cancel
        effects = effects_of(self.store.get_run(run_id).context) if state in _CANCELLED else ()
        return RunResult(
            run_id=run_id, state=state.value, answer=stored.get("answer"),
            artifacts=stored.get("artifacts", {}), files=tuple(stored.get("files", ())), trace_id=run_id,
            error=stored.get("error"),
            approval_request_id=pending[-1].request_id if pending else None,
            path=tuple(s.value for s in path), effects=effects,
        )

    def assembled_context(self, run_id: str) -> AssembledContext:
        """The context assembled for the Run (step ②): from the RunContext until the plan is made, then
        from the recorded plan request. ContextError when the Run has none (it failed before or while
        assembling)."""
        context = self.store.get_run(run_id).context or {}
        if "context" in context:
            return AssembledContext.model_validate(context["context"])
        digest: str = context.get("plan_request_hash", "")
        text = self.writes.verified_content(digest) if digest else None
        if text is None:
            raise ContextError(f"run {run_id} has no recorded assembled context")
        return AssembledContext.model_validate(json.loads(text)["context"])

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

    def advance(self, run: RunRecord, source: RunState, target: RunState, reason: str,
                records: list[TraceRecordIn] | None = None, **kwargs: Any) -> RunRecord:
        """Make the transition; the Run as it now is, built locally rather than read back (hot path)."""
        outcome = self.machine.transition(run.run_id, source, target, actor=MANAGER, reason=reason,
                                          records=records or [], lease_epoch=self.epoch(run.run_id), **kwargs)
        if not outcome.applied:
            return self.store.get_run(run.run_id)
        if target == S.EXECUTING and (drive := self.drive_of(run.run_id)) is not None:
            drive.entered_executing = True
        changes: dict[str, Any] = {"state": target, "version": outcome.seq, "close_reason": outcome.close_reason,
                                   "last_state_change_at": self.store.clock.now()}
        for key in ("context", "result"):
            if key in kwargs:
                changes[key] = kwargs[key]
        return dataclasses.replace(run, **changes)

    def epoch(self, run_id: str) -> int | None:
        """The lease epoch this process drives the Run under, if it drives it under a lease."""
        fence = fence_for(run_id)
        return fence.epoch if fence is not None else None

    def fenced(self, run_id: str) -> bool:
        """True when this drive's lease was taken over: no further side effect or write (K5b)."""
        fence = fence_for(run_id)
        return fence is not None and not fence.holds()

    def stopped(self, run_id: str) -> str | None:
        """Why this drive may not go on with an effect of the Run — "left" (it is no longer EXECUTING:
        cancelled, swept) or "fenced" (its lease was taken over) — or None when it may: one read of the
        Run's row, made before every step and the answer."""
        fence = fence_for(run_id)
        if fence is None:
            return None if self.store.state_of(run_id) == S.EXECUTING else "left"
        standing = fence.standing()
        if standing.state != S.EXECUTING:
            return "left"
        return None if standing.held else "fenced"

    def fit(self, caller: CallerIdentity, run_id: str) -> Callable[[LLMRequest], LLMRequest] | None:
        """The budget's check of a model call of this Run, made before the call (None without one)."""
        budget = self.call_budget
        if budget is None:
            return None
        return lambda request: budget.fit(request, caller, run_id)

    def fail(self, run: RunRecord, source: RunState, step: int, code: str, exc: BaseException | str,
             target: RunState = S.FAILED, inputs: Any = None, retries: int = 0) -> RunRecord:
        """End the Run from `source` (FAILED unless `target` says otherwise), the failed step traced."""
        message = str(exc)
        records = trace_records(step_trace(run.run_id, step, inputs, {"error": message}, 0.0, "error", message),
                                error_trace(run.run_id, step, code, exc, retries))
        return self.advance(run, source, target, f"{code}: {message}", records,
                            result={"error": f"{code}: {message}"})

    def scrub(self, text: str) -> str:
        """Text bound for a model with its secrets removed (C4); ContextError when the filter fails."""
        return self.assembler.filter.scrub(text).text
