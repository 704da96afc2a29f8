"""The one write path as the state machine sees it (SPEC K4): the store's compare-and-set, the reads a
close needs, and the chain's drain. The state machine adds the funnel and the closing rules on top."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from harness.domain.records import UNSET

if TYPE_CHECKING:
    from harness.domain.records import RunRecord, TraceRecordIn, TransitionResult, TransitionRow
    from harness.kernel.states import RunState
    from harness.ports import TraceBuffer, Tx


class TransitionStore(Protocol):
    """Where Run.state changes: each change its own row, audit event and chained records."""

    @property
    def trace_buffer(self) -> TraceBuffer | None:
        """What carries the outbox to the chain when not drained directly (None: drained directly)."""
        ...

    def transition(
        self, run_id: str, source: RunState, target: RunState, *, actor: str, reason: str,
        forced_by: str | None = None, lease_epoch: int | None = None, expected_version: int | None = None,
        records: Sequence[TraceRecordIn] = (), context: dict[str, Any] | None = UNSET,
        result: dict[str, Any] | None = UNSET, also: Callable[[Tx], object] | None = None,
    ) -> TransitionResult:
        """Compare-and-set Run.state source→target in its own transaction (or the drive's unit of work);
        `also` writes inside it once the compare-and-set has succeeded."""
        ...

    def transition_in(
        self, tx: Tx, run_id: str, source: RunState, target: RunState, *, actor: str, reason: str,
        lease_epoch: int | None = None, records: Sequence[TraceRecordIn] = (),
        context: dict[str, Any] | None = UNSET, result: dict[str, Any] | None = UNSET,
    ) -> TransitionResult:
        """The same compare-and-set inside the caller's transaction."""
        ...

    def get_run(self, run_id: str) -> RunRecord:
        """The Run as stored (UnknownRunError if there is none)."""
        ...

    def run_with_transitions(self, run_id: str) -> tuple[RunRecord, list[TransitionRow]]:
        """The Run and its state changes from one snapshot (what a close needs)."""
        ...

    def drain_within(self, tx: Tx, batch_size: int = 500, *, wait: bool = True) -> int:
        """Chain the outbox inside the caller's transaction (the close's); returns the records chained.
        `wait=False`: chain nothing when another drainer holds the chain now."""
        ...

    def drain_all(self, batch_size: int = 500) -> int:
        """Chain everything waiting in the outbox."""
        ...

    def after_commit(self, told: Callable[[], None]) -> None:
        """Run `told` once what was written so far has committed."""
        ...
