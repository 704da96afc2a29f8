"""An index on memory entries' content hash: write-back looks up whether the caller's scope already
remembers the same content before storing it again (SPEC C5).

Revision ID: 0005_memory_content
Revises: 0004_blobs
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0005_memory_content"
down_revision = "0004_blobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_memory_content", "memory_entries", ["tenant_id", "content_hash"])


def downgrade() -> None:
    op.drop_index("ix_memory_content", table_name="memory_entries")
