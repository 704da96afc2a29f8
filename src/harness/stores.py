"""The read side of the composition root: the store, and the views over it that a command reads through
(a Run's approvals, its cost, where an archived Run is), without loading the pipeline, the policy engine or
the model adapters. `harness runs show` starts on this alone; harness.config re-exports each of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.adapters.sql import database
from harness.adapters.sql.approvals import SqlApprovals
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.retention import RetentionStore
from harness.adapters.sql.store import SqlStore

if TYPE_CHECKING:
    from harness.domain.retention import ArchivedRun
    from harness.ports import Clock
    from harness.ports.approvals import ApprovalRows

#: the store's database error (SQLAlchemy's, as the adapters raise it)
DatabaseError = database.DatabaseError


def open_store(db: str | None = None, clock: Clock | None = None, *, migrate_schema: bool = True) -> SqlStore:
    """The store named by `db` (a database URL or SQLite file path), HARNESS_DATABASE_URL or the default;
    created and migrated on first use unless `migrate_schema` is false."""
    return SqlStore.open(db, clock, migrate_schema=migrate_schema)


def cost_ledger(store: SqlStore) -> CostLedger:
    """The cost ledger over a store (spend by Run, tenant, user, skill, day)."""
    return CostLedger(store)


def approval_rows(store: SqlStore) -> ApprovalRows:
    """The approval requests and decisions over a store, as stored (no desk: nothing is judged)."""
    return SqlApprovals(store)


def archived_run(store: SqlStore, run_id: str) -> ArchivedRun | None:
    """Where an archived Run is (segment, location, checkpoint), when it was archived."""
    return RetentionStore(store).archived(run_id)
