"""PostgreSQL: each memory entry's text search vector stored with it, `memory_entries.content_tsv`.

Lexical recall ranks every entry of the scope that matches one of the query's words. The GIN index on the
expression `to_tsvector('english', content)` found them, but ranking them (`ts_rank_cd`) parsed each
entry's content again, at every recall: with 5,000 matching entries a recall took ~180 ms of the server's
CPU, ten times the ~18 ms it takes over a stored vector, and it grew with every answer written back.
The vector is now a stored generated column, kept by the database whenever the content changes (an
erasure's redaction included), with the GIN index on it instead of on the expression. SQLite (FTS5) and
MySQL/MariaDB (BM25 in Python over the scope's rows) are unchanged. Adding the column computes it for every
existing entry: PostgreSQL rewrites the table under its lock while the migration runs, so a deployment
with a large memory migrates it in a quiet moment.

Revision ID: 0023_memory_tsvector
Revises: 0022_sandbox_instance_provider
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0023_memory_tsvector"
down_revision = "0022_sandbox_instance_provider"
branch_labels = None
depends_on = None

_VECTOR = "to_tsvector('english'::regconfig, content)"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"ALTER TABLE memory_entries ADD COLUMN content_tsv tsvector GENERATED ALWAYS AS ({_VECTOR}) STORED")
    op.execute("CREATE INDEX ix_memory_tsv ON memory_entries USING gin (content_tsv)")
    op.execute("DROP INDEX IF EXISTS ix_memory_fts")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"CREATE INDEX ix_memory_fts ON memory_entries USING gin ({_VECTOR})")
    op.execute("DROP INDEX IF EXISTS ix_memory_tsv")
    op.execute("ALTER TABLE memory_entries DROP COLUMN content_tsv")
