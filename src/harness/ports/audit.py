"""The narrow read port of the audit (SPEC A3, A3b): what the checkpoint publisher, the exporter and the
verifier read from the Run store, and nothing more.

The verifier trusts nothing it reads: it recomputes every hash and link itself. So the port only hands
out what is stored (records, tombstones of pruned and redacted ones, the chain head, the rows that mirror
records) and never a judgement. `harness-verify` (harness.audit.standalone) reads exports and needs no
port at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.domain.audit import ChainReport, PrunedRecord
    from harness.domain.records import RunRecord, StoredTraceRecord
    from harness.ports import Clock


class ChainReads(Protocol):
    """The chain as stored, for checkpoints and exports."""

    @property
    def clock(self) -> Clock:
        """The store's clock (a checkpoint's timestamp)."""
        ...

    def database_id(self) -> str:
        """The database's id (StoreError for a schema before it had one)."""
        ...

    def drain_all(self) -> int:
        """Chain what the outbox still holds; how many records."""
        ...

    def chain_head(self) -> tuple[int, str]:
        """(seq, hash) of the last chained record; (0, genesis) for an empty chain."""
        ...

    def iter_chain(self) -> Iterator[StoredTraceRecord | PrunedRecord]:
        """Every position of the chain in seq order: the stored records, the tombstones of pruned ones, and
        for a record an erasure redacted, its original hashes (kind "redacted") in place of its content."""
        ...

    def get_run(self, run_id: str) -> RunRecord:
        """The Run (RunNotFoundError when there is none)."""
        ...

    def trace_of(self, run_id: str) -> list[StoredTraceRecord]:
        """The Run's chained records, in seq order."""
        ...

    def pending_of_run(self, run_id: str) -> int:
        """How many of the Run's records the outbox still holds."""
        ...

    def redactions_of(self, run_id: str) -> dict[int, dict[str, str]]:
        """seq -> {"erase_id", "leaf" (hex)} of each of the Run's records an erasure redacted."""
        ...


class AuditReads(ChainReads, Protocol):
    """What `harness audit verify` reads besides the chain."""

    def known_database_id(self) -> str | None:
        """The database's id; None for a database at a revision before it had one."""
        ...

    def outbox_backlog(self) -> int:
        """How many records wait in the outbox."""
        ...

    def seq_with_hash(self, digest: str) -> int | None:
        """The seq of the chained record whose hash is `digest` (a scan: only to explain a broken link)."""
        ...

    def seq_with_prev_hash(self, digest: str) -> int | None:
        """The seq of the chained record that links to `digest` (a scan: only to explain a broken link)."""
        ...

    def runs_with_untraced_transitions(self) -> list[tuple[str, int]]:
        """(run id, transition rows) of each Run with transition rows but no transition record, chained or
        in the outbox, by run id."""
        ...

    def runs_without_trace(self) -> list[str]:
        """The Runs with no record and no transition at all, by run id."""
        ...

    def check_mirrors(self, report: ChainReport) -> None:
        """Compare every row that mirrors a record with the record (chained or still in the outbox);
        differences go to `report`."""
        ...


class ReconcileSnapshot(Protocol):
    """The reads of one `harness audit reconcile`, on one connection."""

    def final_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(Runs per final state, audit events per final event)."""
        ...

    def offenders(self, check: str, limit: int) -> tuple[int, list[tuple[Any, ...]]]:
        """How many rows break the set-based check `check` (a name of harness.audit.reconcile.CHECKS), and
        the first `limit` of them, run id first; a tenant-wide spend total's user is None."""
        ...

    def tool_calls(self) -> Iterator[tuple[str, str]]:
        """(run id, payload JSON) of every ToolTrace, chained or in the outbox."""
        ...

    def run_traces(self, after: int, batch: int) -> list[tuple[int, str, str, float]]:
        """Up to `batch` chained RunTraces after seq `after`: (seq, run id, payload JSON, closed at)."""
        ...

    def family(self, run_ids: Sequence[str]) -> list[str]:
        """The Runs and all their child Runs, at any depth."""
        ...

    def costs_of(self, run_ids: Sequence[str]) -> list[Any]:
        """The cost rows of these Runs (run_id, at, input_tokens, output_tokens, api_calls, sandbox_s, usd,
        priced as attributes)."""
        ...

    def parents(self, run_ids: Sequence[str]) -> dict[str, str]:
        """child run id -> parent run id, for those of these Runs that have a parent."""
        ...


class ReconcileReads(Protocol):
    """Where `harness audit reconcile` reads."""

    def snapshot(self) -> AbstractContextManager[ReconcileSnapshot]:
        """The reads of one reconcile."""
        ...
