"""Ports: the small interfaces through which the pipeline reaches what varies.

They are written in domain types only (harness.domain, harness.kernel); the adapters under
harness.adapters implement them, and the composition root (harness.config) wires one to each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.domain.contracts import Notification, RunRequest, RunResult
    from harness.domain.leases import Standing
    from harness.domain.llm import LLMRequest, LLMResponse
    from harness.domain.records import PendingRecord
    from harness.domain.sandbox import Holder, SandboxJob, SandboxOutcome


class Tx(Protocol):
    """An open transaction of the Run store, handed back to the adapters that write within it.

    Opaque to everyone else: the pipeline only carries it from the store's `transaction()` to the calls
    that must commit together with a state change (results, notifications, approvals)."""


class Clock(Protocol):
    """Where time comes from; inject a FakeClock to test timeouts without sleeping."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class LLMProvider(Protocol):
    """A language model behind one interface (SPEC P3); errors are harness ProviderErrors."""

    name: str

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer one request."""
        ...


class ResultSink(Protocol):
    """Where a Run's result goes when it is final or parks waiting for a human (SPEC P4, seed 004 ⑱).

    The state machine calls it inside the transaction of that state change, whoever makes it (a worker,
    a decision, a cancel, an approval timeout, the sweeper): the result is handed over exactly when the
    change commits, never without it and never lost after it."""

    def deliver(self, tx: Tx, result: RunResult, request: RunRequest) -> None:
        """Hand the result of the Run created by `request` to its caller, within `tx`."""
        ...


class Notifier(Protocol):
    """Tells the Caller and the approvers about approval requests (SPEC P4 / N1, seed 004 ⑩): called
    inside the transaction of the change the notification describes; delivery happens later, at least
    once, under the notification's stable event id."""

    def notify(self, tx: Tx, notification: Notification) -> None:
        """Queue the notification within `tx`."""
        ...


class Sandbox(Protocol):
    """Runs one sandboxed skill call in an isolated process (SPEC T4); a failure, crash or escape
    attempt is described in the outcome, never raised. `isolation` names how strong the walls are.

    A sandbox may also have `provider` (where it runs: "local" when it has none, "remote" for a sandbox
    server) and `for_call(skill_id, tenant_id) -> Sandbox` (the provider a call uses, when the settings choose
    per skill or per tenant); the tool controller reads both when they are there."""

    @property
    def isolation(self) -> str:
        """How strong the walls are ("bwrap", or the weaker "rlimit")."""
        ...

    def run(self, job: SandboxJob) -> SandboxOutcome:
        """Run the call to its end or its limits."""
        ...

    def start_instance(self, job: SandboxJob) -> Holder:
        """Start a kept instance for the job's Run and skill (its first call, or a re-creation)."""
        ...

    def run_in(self, holder: Holder, job: SandboxJob) -> SandboxOutcome:
        """Run one call inside a kept instance."""
        ...


class ChainWriter(Protocol):
    """The part of the Run store a trace buffer needs: the outbox's pending records, and the chain."""

    def pending_records(self, limit: int) -> list[PendingRecord]:
        """Up to `limit` outbox records, oldest first."""
        ...

    def chain_records(self, records: Sequence[PendingRecord]) -> int:
        """Chain these records (idempotent by record id); returns how many were new."""
        ...

    def audit(self, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Write one audit event in its own transaction."""
        ...


class TraceBuffer(Protocol):
    """A buffer between the outbox and the hash chain, such as Redis Streams (SPEC A4, D2).

    Its own outage never raises: the records then stay in the outbox, which commits with the state
    change, and are carried on once the buffer is back. Chaining is idempotent by record id.
    """

    def drain(self, store: ChainWriter, batch_size: int) -> int:
        """Carry one batch outbox → buffer → chain; returns how many records were chained."""
        ...

    def drain_all(self, store: ChainWriter, batch_size: int) -> int:
        """Carry batches until nothing moves; returns how many records were chained."""
        ...

    def close(self) -> None:
        """Release the buffer's connections."""
        ...


class Fence(Protocol):
    """A worker's proof that it still holds a Run's lease (SPEC K5b)."""

    @property
    def epoch(self) -> int:
        """The lease epoch every transition of the drive carries."""
        ...

    def holds(self) -> bool:
        """Whether the lease is still this worker's; checked before every side effect."""
        ...

    def standing(self) -> Standing:
        """The Run's state and whether the lease is still this worker's, in one read."""
        ...

    @property
    def lost(self) -> bool:
        """Whether this worker already knows its lease was taken over (no read)."""
        ...

    def lose(self) -> None:
        """Note that the lease was taken over (a fenced write found it so): no further side effect."""
        ...
