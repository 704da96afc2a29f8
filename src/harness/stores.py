"""The read side of the composition root: the store, and the views over it that a command reads through
(a Run's approvals, its cost, where an archived Run is, the audit's and a replay's reads, the listings and
the contents by hash), without loading the pipeline, the policy engine or the model adapters. `harness runs
show` starts on this alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.adapters.sql import database, migration
from harness.adapters.sql import store as sql_store
from harness.adapters.sql.approvals import SqlApprovals
from harness.adapters.sql.ledger import CostLedger

# the views a command reads a Run through (its approvals, its cost) are imported here; the others (the
# audit's, a replay's, the listings, the blobs, the webhook outbox, the sandbox instances) by their factory,
# so that `runs show` and `approvals` load none of them
if TYPE_CHECKING:
    from harness.adapters.sql.replay_reads import ReplayReads
    from harness.adapters.sql.webhooks import WebhookOutbox
    from harness.domain.retention import ArchivedRun
    from harness.knowledge.base import KnowledgeBase
    from harness.ports import Clock
    from harness.ports.approvals import ApprovalRows
    from harness.ports.audit import AuditReads, ReconcileReads
    from harness.ports.contents import StoredContents
    from harness.ports.queries import ReadModel
    from harness.ports.sandboxes import SandboxInstances
    from harness.settings import Settings

#: the store the composition root opens, lent to the shells (which may not import harness.adapters): they
#: name it in signatures where they hand a store on to code typed against it, and never build one themselves
SqlStore = sql_store.SqlStore

#: the store's database error (SQLAlchemy's, as the adapters raise it)
DatabaseError = database.DatabaseError

#: whether a database failure is an outage (down, locked, read-only: a retry later may succeed) rather than a
#: bug (the shells answer 503 or exit 2)
is_outage = database.is_outage


def open_store(db: str | None = None, clock: Clock | None = None, *, migrate_schema: bool = True) -> SqlStore:
    """The store named by `db` (a database URL or SQLite file path), HARNESS_DATABASE_URL or the default;
    created and migrated on first use unless `migrate_schema` is false."""
    return SqlStore.open(db, clock, migrate_schema=migrate_schema)


def prepare_schema(db: str | None = None) -> None:
    """Bring the schema of the database named by `db` up to date now, before a long-running command starts
    its processes: an unreachable database, or a schema a newer harness-kernel migrated (StoreError), is one
    error before anything starts, not a failure of each process as it builds its runtime."""
    engine = database.create_engine(database.resolve_url(db))
    try:
        migration.migrate(engine)
    finally:
        engine.dispose()


def open_existing_store(db: str | None) -> SqlStore:
    """The store named by `db`, refusing to create a new SQLite file (InvalidRequestError)."""
    return sql_store.open_existing(db)


def read_model(store: SqlStore) -> ReadModel:
    """The read model (listings, the change feed, counts) over a store."""
    from harness.adapters.sql.run_queries import RunQueries

    return RunQueries(store)


def stored_contents(store: SqlStore) -> StoredContents:
    """The contents the trace references by hash (files a sandboxed skill kept among them), over a store."""
    from harness.adapters.sql.blobs import BlobStore

    return BlobStore(store.engine)


def cost_ledger(store: SqlStore) -> CostLedger:
    """The cost ledger over a store (spend by Run, tenant, user, skill, day)."""
    return CostLedger(store)


def approval_rows(store: SqlStore) -> ApprovalRows:
    """The approval requests and decisions over a store, as stored (no desk: nothing is judged)."""
    return SqlApprovals(store)


def archived_run(store: SqlStore, run_id: str) -> ArchivedRun | None:
    """Where an archived Run is (segment, location, checkpoint), when it was archived."""
    from harness.adapters.sql.retention import RetentionStore

    return RetentionStore(store).archived(run_id)


def audit_reads(store: SqlStore) -> AuditReads:
    """The audit's read port over a store: what the verifier, checkpoints and exports read."""
    from harness.adapters.sql.audit_reads import SqlAuditReads

    return SqlAuditReads(store)


def reconcile_reads(store: SqlStore) -> ReconcileReads:
    """What `harness audit reconcile` reads, over a store."""
    from harness.adapters.sql.reconcile_reads import SqlReconcileReads

    return SqlReconcileReads(store)


def replay_reads(store: SqlStore) -> ReplayReads:
    """What a replay reads of a recorded Run beyond the store's reads (outbox, blobs, decisions, history)."""
    from harness.adapters.sql.replay_reads import ReplayReads

    return ReplayReads(store)


def set_deadline(store: SqlStore, run_id: str, deadline_at: float) -> None:
    """Give a replayed Run the deadline its recorded original had (the one write a replay makes itself)."""
    from harness.adapters.sql.replay_reads import set_deadline as _set_deadline

    _set_deadline(store, run_id, deadline_at)


def sandbox_instances(store: SqlStore) -> SandboxInstances:
    """The sandbox instances of every host, over a store."""
    from harness.adapters.sql.sandbox_instances import InstanceTable

    return InstanceTable(store)


def webhook_outbox(store: SqlStore) -> WebhookOutbox:
    """The webhook deliveries waiting, done and dead, over a store."""
    from harness.adapters.sql.webhooks import WebhookOutbox

    return WebhookOutbox(store)


def knowledge_base(store: SqlStore, settings: Settings | None = None) -> KnowledgeBase:
    """The knowledge bases over a store, for ingestion and listing: searched and embedded as the settings say
    (HARNESS_KNOWLEDGE=semantic embeds each chunk as it is added; off still lets documents be managed)."""
    from harness.adapters.sql.knowledge import SqlKnowledgeRows
    from harness.context.secrets import SecretFilter
    from harness.knowledge.base import open_knowledge
    from harness.settings import Settings

    mode = (settings or Settings.from_env()).knowledge
    found = open_knowledge("lexical" if mode == "off" else mode, SqlKnowledgeRows(store.engine), store.clock,
                           SecretFilter())
    assert found is not None
    return found
