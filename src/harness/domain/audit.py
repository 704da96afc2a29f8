"""Audit values: what `harness audit verify` found (problems, each naming the record, or the table, row and
field, and warnings: what could not be checked, said loudly, without failing the check), and what the
database keeps of a record the archive pruned or an erasure redacted."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the trail. `seq`/`record_id` name the record, when one can be named;
    `table`/`row`/`field` name the operational row that disagrees with its chained record."""

    #: edited | deleted | inserted | reordered | forked | head_mismatch | run_trace_missing | row_* | checkpoint_*
    #: (invalid, mismatch, missing) | witness_unreadable
    kind: str
    seq: int | None
    record_id: str | None
    detail: str
    run_id: str | None = None
    table: str | None = None
    row: str | None = None
    field: str | None = None


@dataclass
class ChainReport:
    """The outcome of verify_chain; `first_bad` is the earliest problem in chain order."""

    records_checked: int = 0
    #: of those, records the archive pruned: only their hashes are in the database (their segment has them)
    records_pruned: int = 0
    #: of those, records whose payload an erasure request replaced (their hashes still hold the chain)
    records_redacted: int = 0
    chain_head: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    checkpoints_checked: int = 0
    outbox_backlog: int = 0
    limit: int = 20
    rows_checked: int = 0
    database_id: str | None = None
    #: what could not be verified (no checkpoint to check against, checkpoints of another database,
    #: Runs closed by a version that did not chain their result): not problems, but never silent
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong (a backlog in the outbox is not a problem)."""
        return self.problem_count == 0

    @property
    def first_bad(self) -> Problem | None:
        """The first problem found, the chain walk's before the cross-checks'."""
        return self.problems[0] if self.problems else None

    def add(self, problem: Problem) -> None:
        """Record a problem; only the first `limit` are kept, all are counted."""
        self.problem_count += 1
        if len(self.problems) < self.limit:
            self.problems.append(problem)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        doc = asdict(self)
        doc["ok"] = self.ok
        doc["first_bad"] = asdict(self.first_bad) if self.first_bad else None
        return doc


#: the kind of a chain position whose record an erasure redacted (its original hashes are kept)
REDACTED = "redacted"


@dataclass(frozen=True, slots=True)
class PrunedRecord:
    """A trace record the archive removed: what the database keeps of it."""

    seq: int
    hash: str
    leaf: bytes
    record_id: str | None = None
    run_id: str | None = None
    kind: str = "pruned"
