"""Content-addressed blobs: the recorded LLM answers, tool arguments and results that replay reads (SPEC A5).

A blob's key is the SHA-256 of its canonical JSON (harness.domain.chain.content_hash), the same hash
the trace records carry, so a record and its content meet without any other index. Blobs are
append-only like the trace that references them.

Revision ID: 0004_blobs
Revises: 0003_memory
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from harness.adapters.sql.triggers import append_only_ddl, drop_append_only_ddl

revision = "0004_blobs"
down_revision = "0003_memory"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("content", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=False),
    )
    for statement in append_only_ddl(op.get_bind().dialect.name, "blobs"):
        op.execute(statement)


def downgrade() -> None:
    for statement in drop_append_only_ddl(op.get_bind().dialect.name, "blobs"):
        op.execute(statement)
    op.drop_table("blobs")
