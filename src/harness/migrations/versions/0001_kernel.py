"""The RunState kernel: runs, legacy jobs, transitions, audit events, outbox and the hash-chained trace.

Revision ID: 0001_kernel
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from harness.adapters.sql.triggers import append_only_ddl, drop_append_only_ddl

revision = "0001_kernel"
down_revision = None
branch_labels = None
depends_on = None

APPEND_ONLY = ("transitions", "audit_events", "trace_records")
ID = sa.String(64)
STATE = sa.String(32)
#: MySQL's TEXT holds only 64 KB; payloads, contexts and results can be larger
TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    dialect = op.get_bind().dialect
    if dialect.name in ("mysql", "mariadb"):
        # binary, no-pad collation: ids, tenants and keys compare exactly, as on PostgreSQL and SQLite
        # (the default *_ci collation would merge "acme", "ACME" and "acme "); later tables inherit it
        collation = "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"
        op.execute(f"ALTER DATABASE CHARACTER SET utf8mb4 COLLATE {collation}")
    op.create_table(
        "runs",
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
        sa.Column("request", TEXT, nullable=False),
        sa.Column("context", TEXT),
        sa.Column("result", TEXT),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="uq_runs_idempotency"),
    )
    op.create_index("ix_runs_state_changed", "runs", ["state", "last_state_change_at"])
    op.create_index("ix_runs_tenant_created", "runs", ["tenant_id", "created_at"])
    op.create_table(
        "jobs",
        sa.Column("job_id", ID, primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("run_state_snapshot", STATE, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
    op.create_table(
        "transitions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("from_state", STATE),
        sa.Column("to_state", STATE, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("reason", TEXT, nullable=False),
        sa.Column("forced_by", sa.String(64)),
        sa.Column("at", sa.Double, nullable=False),
        sa.UniqueConstraint("run_id", "seq", name="uq_transitions_run_seq"),
    )
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_id", ID, nullable=False, unique=True),
        sa.Column("run_id", ID),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("detail", TEXT, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )
    op.create_index("ix_audit_events_event", "audit_events", ["event"])
    op.create_index("ix_audit_events_run", "audit_events", ["run_id"])
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("record_id", ID, nullable=False, unique=True),
        sa.Column("run_id", ID),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", TEXT, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
    )
    op.create_table(
        "trace_records",
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("record_id", ID, nullable=False, unique=True),
        sa.Column("run_id", ID),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", TEXT, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
    )
    op.create_index("ix_trace_records_run", "trace_records", ["run_id"])
    op.create_table(
        "chain_head",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.execute(sa.text("INSERT INTO chain_head (id, seq, hash) VALUES (1, 0, '" + "0" * 64 + "')"))
    for table in APPEND_ONLY:
        _install_append_only(table)


def _install_append_only(table: str) -> None:
    """Refuse UPDATE and DELETE on `table` inside the database itself (SPEC A2)."""
    for statement in append_only_ddl(op.get_bind().dialect.name, table):
        op.execute(statement)


def downgrade() -> None:
    for table in APPEND_ONLY:
        for statement in drop_append_only_ddl(op.get_bind().dialect.name, table):
            op.execute(statement)
    for table in ("chain_head", "trace_records", "outbox", "audit_events", "transitions", "jobs", "runs"):
        op.drop_table(table)
