"""Ports of the Run store as the pipeline sees it: reads of a Run, and what the Run manager writes beside its
transitions. Its leases are `harness.ports.leases.RunLeases`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.domain.records import NewRun, QueuedRun, RunRecord, StuckRun, TraceRecordIn, TransitionRow
    from harness.domain.traces import CostTrace
    from harness.kernel.states import RunState
    from harness.ports import Clock, Tx


class RunReads(Protocol):
    """Where a Run stands, read outside any transaction."""

    def state_of(self, run_id: str) -> RunState:
        """The Run's current state (UnknownRunError if there is no such Run)."""
        ...

    def transitions_of(self, run_id: str) -> list[TransitionRow]:
        """The Run's state changes, oldest first."""
        ...


class RunStore(RunReads, Protocol):
    """The Run store as the Run manager uses it outside a transaction it opens itself."""

    @property
    def clock(self) -> Clock:
        """The store's clock (the one every transition is stamped with)."""
        ...

    def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Create the Run in CREATED; (run, created) — False when its idempotency key found it."""
        ...

    def stuck_runs(self, state: RunState, cutoff: float, limit: int) -> list[StuckRun]:
        """Runs in `state` unchanged since before `cutoff`, oldest first."""
        ...

    def get_run(self, run_id: str) -> RunRecord:
        """The Run as stored (UnknownRunError if there is none)."""
        ...

    def backlog(self, bound: int) -> int:
        """How many accepted Runs wait to start (CREATED) in the whole database, counted up to `bound`."""
        ...

    def overdue_unstarted(self, now: float, limit: int) -> list[QueuedRun]:
        """Runs still in CREATED whose start deadline is before `now`, the most overdue first."""
        ...

    def audited(self, run_ids: Sequence[str], event: str) -> set[str]:
        """Which of these Runs already have an audit event named `event`."""
        ...

    def final_among(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these Runs are final."""
        ...

    def outcome_of(self, run_id: str) -> tuple[RunState, dict[str, Any] | None, list[RunState]]:
        """The Run's state, its stored result and the states it went through."""
        ...

    def audit(self, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Write one audit event in its own transaction."""
        ...

    def record(self, records: Sequence[TraceRecordIn]) -> None:
        """Append trace records in their own transaction."""
        ...

    def mark_step_started(self, run_id: str, step_id: str, context: dict[str, Any], *,
                          lease_epoch: int | None) -> str | None:
        """Note in the RunContext that a step started; a refusal when it may not (None: it may)."""
        ...


class RunWrites(Protocol):
    """What the Run manager writes beside transitions: LLM exchanges with their contents (by hash), the
    cost ledger, RunContexts with their step contents, and the transactions it opens itself."""

    def transaction(self) -> AbstractContextManager[Tx]:
        """Open a transaction of the Run store; it commits when the block ends without an error."""
        ...

    def lock_run(self, tx: Tx, run_id: str) -> RunState:
        """Lock the Run's row within `tx`; its current state."""
        ...

    def record_llm_call(self, run_id: str, purpose: str, request: Any, *, response: dict[str, Any] | None = None,
                        error: dict[str, Any] | None = None) -> None:
        """Trace one LLM exchange with its contents, in its own transaction."""
        ...

    def llm_call(self, run_id: str, purpose: str, request: Any, *,
                 response: dict[str, Any]) -> tuple[TraceRecordIn, dict[str, str]]:
        """The "llm" trace record of one exchange and the contents it references (to be put within the
        transaction that appends the record)."""
        ...

    def put_contents(self, tx: Tx, contents: Mapping[str, str], run_id: str) -> None:
        """Store contents by hash within `tx`, noting that `run_id` references them."""
        ...

    def insert_cost(self, tx: Tx, cost: CostTrace) -> None:
        """Book an LLM call's cost within `tx` (it locks the tenant's spend total until the commit)."""
        ...

    def record_cost(self, cost: CostTrace) -> None:
        """Book a cost in its own transaction."""
        ...

    def save_context(self, run_id: str, context: dict[str, Any] | None, records: Sequence[TraceRecordIn],
                     values: Iterable[Any], *, lease_epoch: int | None = None) -> bool:
        """Save the RunContext, its trace records and the contents they reference, in one transaction;
        with `lease_epoch`, only while the Run's lease is at that epoch (False, nothing written, if not).
        A None context saves the records and contents alone, within a transaction that writes the
        RunContext itself and has checked the lease (so `lease_epoch` must then be None)."""
        ...

    def verified_content(self, digest: str) -> str | None:
        """The content stored under `digest` if it is there and matches it; None otherwise."""
        ...
