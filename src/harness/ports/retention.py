"""Ports of retention (SPEC A6): the archive's reads and its one prune, and an erasure's reads and writes.

Written in domain types only; the SQL adapters are harness.adapters.sql.retention (RetentionStore) and
harness.adapters.sql.erasure (ErasureStore), and the composition root (harness.config) wires them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.domain.records import StoredTraceRecord
    from harness.domain.retention import ArchivedRun, LiveErasure, PruneResult
    from harness.ports.audit import ChainReads


class ArchiveRows(Protocol):
    """What an archive pass reads and writes in the Run store."""

    @property
    def chain(self) -> ChainReads:
        """The chain as checkpoints read it (the pass publishes the checkpoint that proves its segment)."""
        ...

    def audit(self, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Write a run-less audit event (and its record) in its own transaction."""
        ...

    def eligible_runs(self, default_cutoff: float | None, tenant_cutoffs: Mapping[str, float | None],
                      limit: int) -> list[str]:
        """Final Runs older than their tenant's cutoff (None: kept forever), oldest first, whole families."""
        ...

    def pending_of(self, run_ids: Sequence[str]) -> set[str]:
        """The Runs among `run_ids` with records still waiting in the outbox."""
        ...

    def bundle(self, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Per Run: its row (`run`), legacy job (`job`), rows by table (`tables`), chained records
        (`records`) and the original hashes of redacted ones by seq (`redacted`)."""
        ...

    def manifest_record(self, after_seq: int, segment_id: str) -> StoredTraceRecord | None:
        """The chained manifest record (audit `archive_segment`) of `segment_id`, chained after `after_seq`."""
        ...

    def add_segment(self, segment_id: str, location: str, runs: int, records: int, digest: str, tree_size: int,
                    checkpoint: str) -> None:
        """Note a stored segment (not yet pruned)."""
        ...

    def prune(self, segment_id: str, archived: Mapping[str, Sequence[StoredTraceRecord]], tree_size: int,
              leaf: Callable[[int], bytes], actor: str, batch: int = 500) -> PruneResult:
        """Delete the archived Runs whose stored records are exactly the segment's, leaving tombstones."""
        ...

    def archived(self, run_id: str) -> ArchivedRun | None:
        """Where an archived Run is, or None when the Run was never archived."""
        ...


class ErasureRows(Protocol):
    """What an erasure request reads and writes in the Run store."""

    def runs_of(self, tenant_id: str, user_id: str) -> tuple[list[str], list[str]]:
        """(final, not final) Runs the person owns in the database."""
        ...

    def archived_of(self, tenant_id: str, user_id: str) -> dict[str, list[str]]:
        """segment_id -> the person's archived Runs in it."""
        ...

    def segment_locations(self) -> dict[str, str]:
        """segment_id -> where the segment is stored now."""
        ...

    def erase_live(self, erase_id: str, salt: bytes, tenant_id: str, user_id: str, subject: str,
                   run_ids: Sequence[str]) -> LiveErasure:
        """Redact the Runs' records and rows, delete the person's memory, re-key their spend totals."""
        ...

    def erase_contents(self, run_ids: Sequence[str], hashes: set[str]) -> int:
        """Delete the stored contents (blobs) of the Runs that no other Run references; how many went."""
        ...

    def file_locations(self, run_ids: Sequence[str]) -> list[str]:
        """Where the files the Runs' sandboxed skills kept in a file store are (the locations their stored
        contents name); each is the Runs' own, written for one call."""
        ...

    def reclaim(self, *, vacuum: bool = True, vacuum_full: bool = False) -> list[str]:
        """Overwrite or give back the space the erasure freed; what was done."""
        ...

    def archived_erased(self, run_ids: Sequence[str], subject: str, segment_id: str, location: str) -> None:
        """The person's archived Runs now carry the pseudonym, and their segment its new location."""
        ...

    def note(self, erase_id: str, subject: str, counts: dict[str, Any], actor: str) -> None:
        """The erasure's own row and its audit event (naming the pseudonym, never the person)."""
        ...
