"""Table definitions (SQLAlchemy Core). The Alembic migrations in harness/migrations create them.

Times are seconds since the epoch (double). Trace, audit and transition tables are append-only,
enforced by triggers that the migration installs on every supported database.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()

ID = sa.String(64)
STATE = sa.String(32)


def digest_bytes(value: str | bytes) -> bytes:
    """A SHA-256 digest as the 32 bytes the chain's hash columns hold (0016), from its hex or its bytes."""
    return bytes.fromhex(value) if isinstance(value, str) else bytes(value)


def digest_hex(value: str | bytes | memoryview) -> str:
    """A stored digest as the lowercase hex everything above the store reads (exports, the API, verify);
    a chain not yet migrated to 0016 holds hex already."""
    return value if isinstance(value, str) else bytes(value).hex()


class Digest(sa.types.TypeDecorator[str]):
    """A SHA-256 digest stored as 32 bytes (migration 0016): half the hex's size in every row and index
    page of the chain. Python code sees lowercase hex, as before; a chained record's hash is computed
    over the hex, so chains written before 0016 verify unchanged."""

    impl = sa.LargeBinary(32)
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):  # BLOB would be MySQL's LargeBinary
            from sqlalchemy.dialects import mysql  # loaded by a MySQL engine already; never by the others

            return dialect.type_descriptor(mysql.VARBINARY(32))
        return super().load_dialect_impl(dialect)

    def process_bind_param(self, value: str | bytes | None, dialect: sa.Dialect) -> bytes | None:
        return None if value is None else digest_bytes(value)

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> str | None:
        return None if value is None else digest_hex(value)


class LongText(sa.types.TypeDecorator[str]):
    """Text, as LONGTEXT on MySQL and MariaDB (whose TEXT holds 64 KiB), as the migrations create it: the
    MySQL types are looked up when a MySQL engine compiles, so the other backends never import them."""

    impl = sa.Text
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects import mysql

            return dialect.type_descriptor(mysql.LONGTEXT())
        return super().load_dialect_impl(dialect)


runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("session_id", sa.String(128), nullable=False),
    sa.Column("state", STATE, nullable=False),
    sa.Column("close_reason", sa.String(32)),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("retry_of", ID),
    sa.Column("parent_run_id", ID),
    sa.Column("idempotency_key", sa.String(200)),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("last_state_change_at", sa.Double, nullable=False),
    sa.Column("deadline_at", sa.Double),
    sa.Column("lease_owner", sa.String(128)),
    sa.Column("lease_epoch", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_expires_at", sa.Double),
    sa.Column("stall_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("request", sa.Text, nullable=False),
    sa.Column("context", sa.Text),
    sa.Column("result", sa.Text),
    #: digest of the (filtered) request body an idempotency key was first used with (migration 0011)
    sa.Column("request_hash", sa.String(64)),
    #: the latest moment the Run may start, when it has a start deadline (migration 0017); what the sweeper
    #: closes a queued Run by. The driver reads the same deadline from the request it drives.
    sa.Column("start_by", sa.Double),
    #: 1 while the lease holder's drive waits on a call outside the process (migration 0020): a takeover
    #: then counts no stall
    sa.Column("lease_waiting", sa.SmallInteger, nullable=False, server_default="0"),
    sa.UniqueConstraint("tenant_id", "user_id", "idempotency_key", name="uq_runs_idempotency_user"),
    sa.Index("ix_runs_state_changed", "state", "last_state_change_at"),
    sa.Index("ix_runs_tenant_created", "tenant_id", "created_at"),
    sa.Index("ix_runs_parent", "parent_run_id"),  # 0012: a Run's child Runs, for its cost total
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("job_id", ID, primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("run_state_snapshot", STATE, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
)

transitions = sa.Table(
    "transitions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("from_state", STATE),
    sa.Column("to_state", STATE, nullable=False),
    sa.Column("actor", sa.String(128), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("forced_by", sa.String(64)),
    sa.Column("at", sa.Double, nullable=False),
    sa.UniqueConstraint("run_id", "seq", name="uq_transitions_run_seq"),
)

audit_events = sa.Table(
    "audit_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("event_id", ID, nullable=False, unique=True),
    sa.Column("run_id", ID),
    sa.Column("event", sa.String(64), nullable=False),
    sa.Column("actor", sa.String(128), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Index("ix_audit_events_event", "event"),
    sa.Index("ix_audit_events_run", "run_id"),
)

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("record_id", ID, nullable=False, unique=True),
    sa.Column("run_id", ID),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_outbox_run", "run_id"),  # 0013: a closing Run lists its pending records
)

#: the hash chain (SPEC A3). Neither hash column is UNIQUE (0006, 0007): a trigger refuses any record whose
#: prev_hash is not the hash at seq - 1 (triggers.linear_chain_ddl), which with the seq primary key
#: forbids forks, and `harness audit verify` recomputes every hash
trace_records = sa.Table(
    "trace_records",
    metadata,
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("record_id", ID, nullable=False, unique=True),
    sa.Column("run_id", ID),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("prev_hash", Digest, nullable=False),
    sa.Column("hash", Digest, nullable=False),
    sa.Index("ix_trace_records_run", "run_id"),
)

chain_head = sa.Table(
    "chain_head",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("hash", Digest, nullable=False),
)

#: the database's id (0013), one row written at creation: checkpoints name it (SPEC A3b)
database_identity = sa.Table(
    "database_identity",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("database_id", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

#: tables that only ever receive INSERTs; triggers refuse UPDATE and DELETE
APPEND_ONLY = ("transitions", "audit_events", "trace_records", "costs", "hitl_decisions", "hitl_approvals")

costs = sa.Table(
    "costs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("source", sa.String(64), nullable=False),
    sa.Column("input_tokens", sa.Integer, nullable=False),
    sa.Column("output_tokens", sa.Integer, nullable=False),
    sa.Column("usd", sa.Double, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    # 0012: the rest of a CostTrace's scope and measures (seed 004 §3.6)
    sa.Column("api_calls", sa.Integer, nullable=False, server_default="0"),
    sa.Column("sandbox_s", sa.Double, nullable=False, server_default="0"),
    sa.Column("skill_id", sa.String(128)),
    sa.Column("model", sa.String(128)),
    sa.Column("parent_run_id", ID),
    sa.Column("unit_price", sa.Text),
    sa.Column("priced", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Index("ix_costs_user", "tenant_id", "user_id"),
    sa.Index("ix_costs_run", "run_id"),
    sa.Index("ix_costs_tenant_at", "tenant_id", "at"),
)

#: running totals of `costs` (0008), per user and per tenant (user_id '': user ids are never empty), so a
#: budget check sums a few rows instead of the tenant's history. Each total is spread over up to 16 rows
#: (`shard`, 0025), a Run's costs always going to the same one, so that concurrent Runs of one tenant do
#: not queue on one row lock until each other's commits; a total is the sum of its rows. CostLedger.insert
#: adds each cost in the cost's own transaction; `costs` stays the source of truth and reconcile checks
#: the totals against its sums
spend_totals = sa.Table(
    "spend_totals",
    metadata,
    sa.Column("tenant_id", sa.String(128), primary_key=True),
    sa.Column("user_id", sa.String(128), primary_key=True),
    sa.Column("usd", sa.Double, nullable=False),
    sa.Column("cost_count", sa.BigInteger, nullable=False),
    sa.Column("shard", sa.SmallInteger, primary_key=True, server_default="0"),
)

hitl_requests = sa.Table(
    "hitl_requests",
    metadata,
    sa.Column("request_id", ID, primary_key=True),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("requester", sa.String(128), nullable=False),
    sa.Column("level", sa.String(4), nullable=False),
    sa.Column("required_approvals", sa.Integer, nullable=False),
    sa.Column("approver_roles", sa.Text, nullable=False),
    sa.Column("actions", sa.Text, nullable=False),
    sa.Column("actions_hash", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("deadline_at", sa.Double, nullable=False),
    sa.Column("decided_at", sa.Double),
    sa.Column("escalated_from", ID),
)

hitl_decisions = sa.Table(
    "hitl_decisions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("decision_id", ID, nullable=False, unique=True),
    sa.Column("request_id", ID, nullable=False),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("approver", sa.String(256), nullable=False),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("actions_hash", sa.String(64), nullable=False),
    sa.Column("break_glass", sa.Boolean, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("refusal", sa.Text),
    sa.Column("at", sa.Double, nullable=False),
)

#: one row per accepted approval (0009): UNIQUE(request_id, approver) makes "one person counts once" hold
#: in the decision's own transaction, against concurrent deciders in any process (SPEC G4)
hitl_approvals = sa.Table(
    "hitl_approvals",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("request_id", ID, nullable=False),
    sa.Column("approver", sa.String(256), nullable=False),
    sa.Column("decision_id", ID, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.UniqueConstraint("request_id", "approver", name="uq_hitl_approvals_person"),
)

#: long-term memory (SPEC C2, C5); the columns that define an entry's scope are set, the others NULL:
#: tenant (all of the tenant), team (team_id), user (user_id), session (user_id and session_id).
#: On SQLite the FTS5 table memory_fts mirrors `content` (triggers); on PostgreSQL the stored generated
#: column content_tsv (to_tsvector('english', content), GIN-indexed; migration 0023, not declared here: it
#: exists on PostgreSQL only) serves the lexical recall. `embedding` is float32, little-endian.
memory_entries = sa.Table(
    "memory_entries",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("entry_id", ID, nullable=False, unique=True),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("scope", sa.String(16), nullable=False),
    sa.Column("team_id", sa.String(128)),
    sa.Column("user_id", sa.String(128)),
    sa.Column("session_id", sa.String(128)),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("source_run_id", ID),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("embedding", sa.LargeBinary),
    sa.Column("embedding_model", sa.String(64)),
    sa.Index("ix_memory_scope", "tenant_id", "scope", "user_id", "session_id"),
    sa.Index("ix_memory_team", "tenant_id", "team_id"),
    sa.Index("ix_memory_source_run", "source_run_id"),
    sa.Index("ix_memory_content", "tenant_id", "content_hash"),
)


#: one row that /health updates to prove the database takes writes (migration 0011)
health_heartbeat = sa.Table(
    "health_heartbeat",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("prober", sa.String(128), nullable=False),
)

#: the webhook outbox (0012, SPEC P4 / N1): one row per event and endpoint, written with the state change it
#: tells about; delivery processes claim due rows under a lease, and a row ends delivered or dead
webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("delivery_id", ID, nullable=False, unique=True),
    sa.Column("event_id", ID, nullable=False),
    sa.Column("event_type", sa.String(64), nullable=False),
    sa.Column("run_id", ID),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("endpoint", sa.String(200), nullable=False),
    sa.Column("url", sa.String(2048), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", sa.Double, nullable=False),
    sa.Column("lease_owner", sa.String(128)),
    sa.Column("lease_expires_at", sa.Double),
    sa.Column("last_status", sa.Integer),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("delivered_at", sa.Double),
    sa.UniqueConstraint("event_id", "endpoint", name="uq_webhook_event_endpoint"),
    sa.Index("ix_webhook_due", "status", "next_attempt_at"),
    sa.Index("ix_webhook_tenant", "tenant_id", "status", "created_at"),
)

#: sandbox instances kept for a Run's skill (revision 0015); state: live, released, dead
sandbox_instances = sa.Table(
    "sandbox_instances",
    metadata,
    sa.Column("instance_id", ID, primary_key=True),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("skill_id", sa.String(128), nullable=False),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("host", sa.String(128), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("isolation", sa.String(16), nullable=False),
    sa.Column("pid", sa.Integer),
    sa.Column("pid_start", sa.BigInteger),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("ports", sa.String(400), nullable=False, server_default=""),
    sa.Column("generation", sa.Integer, nullable=False, server_default="1"),
    sa.Column("calls", sa.Integer, nullable=False, server_default="0"),
    sa.Column("persistent", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("held_s", sa.Double, nullable=False, server_default="0"),
    sa.Column("billed", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("used_at", sa.Double, nullable=False),
    sa.Column("lease_expires_at", sa.Double, nullable=False),
    sa.Column("ended_at", sa.Double),
    sa.Column("end_reason", sa.String(200)),
    sa.Column("provider", sa.String(16), nullable=False, server_default="local"),  # revision 0022
    sa.UniqueConstraint("run_id", "skill_id", name="uq_sandbox_instance_run_skill"),
    sa.Index("ix_sandbox_instances_state", "state", "host"),
)

#: scarce units (revision 0015): a port of a host's pool, a slot of a host's or a tenant's cap
sandbox_leases = sa.Table(
    "sandbox_leases",
    metadata,
    sa.Column("resource", sa.String(160), primary_key=True),
    sa.Column("unit", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("instance_id", ID, nullable=False),
    sa.Column("acquired_at", sa.Double, nullable=False),
    sa.Index("ix_sandbox_leases_instance", "instance_id"),
)

#: knowledge-base documents (revision 0021): one row per ingested file of a tenant's knowledge base, optionally
#: only for one agent or one team (NULL: every agent, every team of the tenant). `content_hash` is the hash of
#: the filtered text the chunks were cut from; `tags` is a JSON list.
kb_documents = sa.Table(
    "kb_documents",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("document_id", ID, nullable=False, unique=True),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("kb", sa.String(64), nullable=False),
    sa.Column("agent", sa.String(64)),
    sa.Column("team_id", sa.String(128)),
    sa.Column("title", sa.String(256), nullable=False),
    sa.Column("media_type", sa.String(64), nullable=False),
    sa.Column("tags", sa.String(1000), nullable=False, server_default="[]"),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("chunks", sa.Integer, nullable=False),
    sa.Column("chars", sa.Integer, nullable=False),
    sa.Column("filtered_secrets", sa.Integer, nullable=False, server_default="0"),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_kb_documents_tenant", "tenant_id", "kb"),
)

#: the chunks a document was cut into, with the document's scope columns repeated so a search is confined in
#: SQL without a join. On SQLite the FTS5 table kb_chunks_fts mirrors the section and `content` (triggers); on
#: PostgreSQL the stored generated column content_tsv (to_tsvector('english', section || ' ' || content),
#: GIN-indexed; migration 0024, not declared here: it exists on PostgreSQL only) serves the lexical search;
#: MySQL/MariaDB scan the scope's chunks.
kb_chunks = sa.Table(
    "kb_chunks",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("chunk_id", ID, nullable=False, unique=True),
    sa.Column("document_id", ID, nullable=False),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("kb", sa.String(64), nullable=False),
    sa.Column("agent", sa.String(64)),
    sa.Column("team_id", sa.String(128)),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("section", sa.String(256), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("embedding", sa.LargeBinary),
    sa.Column("embedding_model", sa.String(64)),
    sa.Index("ix_kb_chunks_scope", "tenant_id", "kb"),
    sa.Index("ix_kb_chunks_document", "document_id"),
)
