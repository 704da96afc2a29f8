"""Retention: archive segments, pruned-record tombstones, and one audited door in the append-only guards.

- `archive_segments` and `archived_runs`: which segment holds an archived Run and where it is stored.
- `pruned_records`: for every pruned trace record, its chain hash and Merkle leaf hash (64 bytes instead
  of the ~1 KB record), so the chain walk still links across the gap and every signed tree head can
  still be recomputed from the database; the records themselves, with their inclusion proofs, are in
  the segment. Append-only like the trace.
- `prune_grants`: the append-only tables' DELETE guards let a row go only while its Run holds a grant,
  which exists only inside the archiver's prune transaction (harness.adapters.sql.prune_triggers).
  UPDATE stays refused everywhere.

Revision ID: 0014_retention
Revises: 0013_database_id
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from harness.adapters.sql.prune_triggers import PRUNABLE, guarded_delete_ddl, plain_delete_ddl
from harness.adapters.sql.triggers import append_only_ddl, drop_append_only_ddl

revision = "0014_retention"
down_revision = "0013_database_id"
branch_labels = None
depends_on = None

ID = sa.String(64)


def upgrade() -> None:
    op.create_table("prune_grants", sa.Column("run_id", ID, primary_key=True),
                    sa.Column("segment_id", ID, nullable=False))
    op.create_table("pruned_records",
                    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
                    sa.Column("hash", sa.LargeBinary(32), nullable=False),
                    sa.Column("leaf", sa.LargeBinary(32), nullable=False))
    op.create_table("archive_segments",
                    sa.Column("segment_id", ID, primary_key=True),
                    sa.Column("location", sa.String(1024), nullable=False),
                    sa.Column("runs", sa.Integer, nullable=False),
                    sa.Column("records", sa.Integer, nullable=False),
                    sa.Column("digest", sa.String(64), nullable=False),
                    sa.Column("tree_size", sa.BigInteger, nullable=False),
                    sa.Column("checkpoint", sa.String(64), nullable=False),
                    sa.Column("created_at", sa.Double, nullable=False),
                    sa.Column("pruned_at", sa.Double))
    op.create_table("archived_runs",
                    sa.Column("run_id", ID, primary_key=True),
                    sa.Column("segment_id", ID, nullable=False),
                    sa.Column("tenant_id", sa.String(128), nullable=False),
                    sa.Column("state", sa.String(32), nullable=False),
                    sa.Column("created_at", sa.Double, nullable=False),
                    sa.Column("closed_at", sa.Double, nullable=False),
                    sa.Column("archived_at", sa.Double, nullable=False),
                    sa.Column("user_id", sa.String(128), nullable=False))
    op.create_index("ix_archived_runs_segment", "archived_runs", ["segment_id"])
    op.create_index("ix_archived_runs_user", "archived_runs", ["tenant_id", "user_id"])
    op.create_table("redacted_records",
                    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
                    sa.Column("hash", sa.LargeBinary(32), nullable=False),
                    sa.Column("leaf", sa.LargeBinary(32), nullable=False),
                    sa.Column("erase_id", ID, nullable=False))
    op.create_table("erasures",
                    sa.Column("erase_id", ID, primary_key=True),
                    sa.Column("subject", sa.String(128), nullable=False),
                    sa.Column("runs", sa.Integer, nullable=False),
                    sa.Column("records", sa.Integer, nullable=False),
                    sa.Column("memory_entries", sa.Integer, nullable=False),
                    sa.Column("archived_runs", sa.Integer, nullable=False),
                    sa.Column("at", sa.Double, nullable=False))
    op.create_table("erased_runs",
                    sa.Column("run_id", ID, primary_key=True),
                    sa.Column("erase_id", ID, nullable=False))
    dialect = op.get_bind().dialect.name
    for tombstones in ("pruned_records", "redacted_records"):
        for statement in append_only_ddl(dialect, tombstones):
            op.execute(statement)
    for table in PRUNABLE:
        for statement in guarded_delete_ddl(dialect, table):
            op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in PRUNABLE:
        for statement in plain_delete_ddl(dialect, table):
            op.execute(statement)
    for tombstones in ("pruned_records", "redacted_records"):
        for statement in drop_append_only_ddl(dialect, tombstones):
            op.execute(statement)
    op.drop_index("ix_archived_runs_user", table_name="archived_runs")
    op.drop_index("ix_archived_runs_segment", table_name="archived_runs")
    for table in ("erased_runs", "erasures", "redacted_records", "archived_runs", "archive_segments",
                  "pruned_records", "prune_grants"):
        op.drop_table(table)
