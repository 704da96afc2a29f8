"""The state machine service: the store's compare-and-set plus the kernel's automatic funnel (SPEC K3).

Components call `transition()`; when a Run lands in a transient state or in TRACING, the machine
moves it on by itself — transient → TRACING → the final state its close reason names — writing the
RunTrace and running the closing hooks inside the TRACING → final transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harness.audit.commitment import RUN_TRACE_VERSION
from harness.domain.chain import content_hash
from harness.domain.records import RUN_TRACE, UNSET, RunRecord, TraceRecordIn, TransitionResult, TransitionRow
from harness.kernel.states import FINAL, TRANSIENT, CloseReason, RunState
from harness.kernel.transitions import automatic_next, final_state_for
from harness.ports import Tx
from harness.ports.transitions import TransitionStore

#: called while a Run closes, with the Run (in TRACING) and the final state it is moving to; returns
#: extra trace records to write in the closing transaction (e.g. memory write-back on SUCCEEDED, C5)
ClosingHook = Callable[[RunRecord, RunState], Sequence[TraceRecordIn]]
#: told of every applied state change, after it committed: (run_id, source, target)
Listener = Callable[[str, RunState, RunState], None]
#: runs inside the transaction of every applied state change, after the compare-and-set: (connection,
#: run_id, source, target); for writes that must commit with the change or not at all (the webhook
#: outbox of SPEC P4 / N1). An exception rolls the change back.
TransactionHook = Callable[[Tx, str, RunState, RunState], None]


class StateMachine:
    """Drives Runs through the transition table; the only way components change Run.state."""

    def __init__(self, store: TransitionStore, *, drain_on_close: bool = True) -> None:
        self.store = store
        self.drain_on_close = drain_on_close
        #: False where something drains the outbox every few seconds anyway (the service's housekeeping): a
        #: close that finds another drainer on the chain head leaves its records to it, and to that
        #: periodic drain, instead of waiting for the head (under load, closes queued on it one by one)
        self.close_waits_for_chain = True
        self._closing_hooks: list[ClosingHook] = []
        self._listeners: list[Listener] = []
        self._as_applied: list[Listener] = []
        self._tx_hooks: list[TransactionHook] = []
        #: the total a RunTrace carries: the sums of the Run's CostTraces, its child Runs' included (set by
        #: the composition root to the cost ledger's); None: the RunContext's planning cost, as before
        self.cost_total: Callable[[RunRecord], dict[str, Any]] | None = None

    def in_transaction(self, hook: TransactionHook) -> None:
        """Register a hook that writes inside the transaction of every change this machine applies."""
        self._tx_hooks.append(hook)

    def _with_hooks(self, run_id: str, source: RunState, target: RunState,
                    also: Callable[[Tx], object] | None) -> Callable[[Tx], object] | None:
        if not self._tx_hooks:
            return also

        def both(conn: Tx) -> None:
            if also is not None:
                also(conn)
            for hook in self._tx_hooks:
                hook(conn, run_id, source, target)
        return both

    def subscribe(self, listener: Listener, *, at_commit: bool = True) -> None:
        """Be told of every state change this machine applies (live views, metrics, SSE): once it has
        committed, or with `at_commit=False` as soon as it is applied (inside a drive's unit of work, before
        its boundary commits it) — for followers of the drive itself (spans that time each step, a replay
        that re-applies outside events where they came) that never hand the change to anyone else."""
        (self._listeners if at_commit else self._as_applied).append(listener)

    def _notify(self, run_id: str, source: RunState, target: RunState) -> None:
        """Tell the listeners of a change once it has committed (inside a drive's unit of work, at its
        next boundary: a listener that wakes another thread or process must find the change there)."""
        for follower in self._as_applied:
            follower(run_id, source, target)
        if not self._listeners:
            return

        def tell() -> None:
            for listener in self._listeners:
                listener(run_id, source, target)
        self.store.after_commit(tell)

    def on_close(self, hook: ClosingHook) -> None:
        """Register a hook that runs in TRACING, just before the final state."""
        self._closing_hooks.append(hook)

    def transition(
        self,
        run_id: str,
        source: RunState,
        target: RunState,
        *,
        actor: str,
        reason: str,
        forced_by: str | None = None,
        lease_epoch: int | None = None,
        expected_version: int | None = None,
        records: Sequence[TraceRecordIn] = (),
        context: dict[str, Any] | None = UNSET,
        result: dict[str, Any] | None = UNSET,
        also: Callable[[Tx], object] | None = None,
    ) -> TransitionResult:
        """Move the Run source→target, then on through the funnel if target is transient or TRACING.

        Closing a Run from TRACING writes its RunTrace and runs the closing hooks, whoever asks.
        """
        if source == RunState.TRACING and target in FINAL:
            run, path = self.store.run_with_transitions(run_id)
            if run.state == source and run.close_reason is not None and target == final_state_for(run.close_reason):
                records = [*records, *self._closing_records(run, target, path, result)]
                # the RunTrace describes this version: if the Run moves meanwhile, the close is a lost race
                expected_version = run.version if expected_version is None else expected_version
        outcome = self.store.transition(
            run_id, source, target, actor=actor, reason=reason, forced_by=forced_by, lease_epoch=lease_epoch,
            expected_version=expected_version, records=records, context=context, result=result,
            also=self._with_hooks(run_id, source, target, also),
        )
        if outcome.applied:
            self._notify(run_id, source, target)
        if outcome.applied and (target in TRANSIENT or target == RunState.TRACING):
            self.advance(run_id, target, reason=outcome.close_reason, forced_by=forced_by, lease_epoch=lease_epoch)
        return outcome

    def transition_in(
        self,
        tx: Tx,
        run_id: str,
        source: RunState,
        target: RunState,
        *,
        actor: str,
        reason: str,
        lease_epoch: int | None = None,
        records: Sequence[TraceRecordIn] = (),
        context: dict[str, Any] | None = UNSET,
        result: dict[str, Any] | None = UNSET,
    ) -> TransitionResult:
        """The compare-and-set inside the caller's transaction (see SqlStore.transition_in), with the
        transaction hooks (`in_transaction`) like every other change. Nothing is told and nothing moves on
        until the caller has committed and calls `settle` with the outcome."""
        conn = tx
        outcome = self.store.transition_in(conn, run_id, source, target, actor=actor, reason=reason,
                                           lease_epoch=lease_epoch, records=records, context=context, result=result)
        if outcome.applied:
            for hook in self._tx_hooks:
                hook(conn, run_id, source, target)
        return outcome

    def settle(self, outcome: TransitionResult, *, forced_by: str | None = None) -> None:
        """After the transaction of `transition_in` committed: tell the listeners, and carry a Run that
        landed in a transient state on through the funnel."""
        if not outcome.applied:
            return
        self._notify(outcome.run_id, outcome.source, outcome.target)
        if outcome.target in TRANSIENT:
            self.advance(outcome.run_id, outcome.target, reason=outcome.close_reason, forced_by=forced_by)

    def advance(
        self,
        run_id: str,
        state: RunState,
        *,
        reason: CloseReason | None = None,
        forced_by: str | None = None,
        lease_epoch: int | None = None,
    ) -> RunState:
        """Carry a Run from a transient state or TRACING to its final state; returns where it stopped.

        Stops early, without error, when another writer moved the Run first.
        """
        drained = False
        while state in TRANSIENT or state == RunState.TRACING:
            records: list[TraceRecordIn] = []
            if state == RunState.TRACING:  # the Run and its path, for the RunTrace, in one round trip
                run, path = self.store.run_with_transitions(run_id)
            elif reason is None:
                run, path = self.store.get_run(run_id), []
            if reason is None or state == RunState.TRACING:
                if run.state != state:
                    return run.state
                reason = run.close_reason
            target = automatic_next(state, reason)
            assert target is not None
            if state == RunState.TRACING:
                records.extend(self._closing_records(run, target, path))
            why = "funnel into TRACING" if target == RunState.TRACING else f"closed: {reason}"
            # the close chains the outbox in its own transaction (under a savepoint): one commit fewer
            drain = self._close_drain() if self.drain_on_close and target in FINAL else None
            # closing is a compare-and-set on the version the close reason and the RunTrace were read at:
            # a Run that left TRACING and came back meanwhile (the sweeper's TRACING→FAILED→TRACING, ABA)
            # makes this a lost race, not a close on a stale reason (or an illegal attempt by the kernel)
            outcome = self.store.transition(
                run_id, state, target, actor="kernel", reason=why, forced_by=forced_by,
                lease_epoch=lease_epoch, expected_version=run.version if state == RunState.TRACING else None,
                records=records, also=self._with_hooks(run_id, state, target, drain),
            )
            if not outcome.applied:
                return outcome.actual
            drained = drained or (drain is not None and self.store.trace_buffer is None)
            self._notify(run_id, state, target)
            state, reason = target, outcome.close_reason
        if self.drain_on_close and not drained:
            self.store.drain_all()
        return state

    def _close_drain(self) -> Callable[[Tx], object]:
        if self.close_waits_for_chain:
            return self.store.drain_within
        return lambda tx: self.store.drain_within(tx, wait=False)

    def _closing_records(
        self, run: RunRecord, final: RunState, transitions: Sequence[TransitionRow],
        result: dict[str, Any] | None = UNSET,
    ) -> list[TraceRecordIn]:
        """The RunTrace and whatever the closing hooks add, for the TRACING → final transaction."""
        records = [self._run_trace(run, final, transitions, run.result if result is UNSET else result)]
        for hook in self._closing_hooks:
            records.extend(hook(run, final))
        return records

    def _run_trace(
        self, run: RunRecord, final: RunState, transitions: Sequence[TransitionRow], result: dict[str, Any] | None,
    ) -> TraceRecordIn:
        """The RunTrace main record (SPEC A1): final state, transition sequence, total cost, trace_hash.

        Version 2 adds the hash of the Run's result (what its callers are answered), and the store adds
        the ids of every other record of the Run (audit.commitment) in the closing transaction."""
        path: list[dict[str, Any]] = [
            {"seq": r.seq, "from": r.from_state, "to": r.to_state, "at": r.at} for r in transitions]
        path.append({"seq": run.version + 1, "from": RunState.TRACING.value, "to": final.value, "at": None})
        cost = self.cost_total(run) if self.cost_total is not None else (run.context or {}).get("cost", {})
        return TraceRecordIn(RUN_TRACE, {
            "run_id": run.run_id, "tenant_id": run.tenant_id, "user_id": run.user_id,
            "session_id": run.session_id, "final_state": final.value,
            "close_reason": run.close_reason.value if run.close_reason else None,
            "transitions": [p["to"] for p in path], "total_cost": cost, "retry_of": run.retry_of,
            "parent_run_id": run.parent_run_id,
            "trace_hash": content_hash(path),
            "v": RUN_TRACE_VERSION, "result_hash": None if result is None else content_hash(result),
        }, run.run_id)

