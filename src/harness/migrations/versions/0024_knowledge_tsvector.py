"""PostgreSQL: each knowledge-base chunk's text search vector stored with it, `kb_chunks.content_tsv`.

A search ranks every chunk of the scope that matches one of the query's words. The GIN index on the
expression `to_tsvector('english', section || ' ' || content)` found them, but ranking them parsed each
matching chunk's section and text again at every search, as the memory's recall did before 0023: the
cost grew with the knowledge base. The vector is now a stored generated column, kept by the database
whenever the section or the text changes (an erasure's redaction included), with the GIN index on it
instead of on the expression. SQLite (FTS5) and MySQL/MariaDB (BM25 in Python) are unchanged. Adding the
column computes it for every existing chunk: PostgreSQL rewrites the table under its lock while the
migration runs, so a deployment with a large knowledge base migrates it in a quiet moment.

Revision ID: 0024_knowledge_tsvector
Revises: 0023_memory_tsvector
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0024_knowledge_tsvector"
down_revision = "0023_memory_tsvector"
branch_labels = None
depends_on = None

_VECTOR = "to_tsvector('english'::regconfig, (section)::text || ' ' || content)"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"ALTER TABLE kb_chunks ADD COLUMN content_tsv tsvector GENERATED ALWAYS AS ({_VECTOR}) STORED")
    op.execute("CREATE INDEX ix_kb_chunks_tsv ON kb_chunks USING gin (content_tsv)")
    op.execute("DROP INDEX IF EXISTS ix_kb_chunks_fts")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("CREATE INDEX ix_kb_chunks_fts ON kb_chunks "
               "USING gin (to_tsvector('english'::regconfig, section || ' ' || content))")
    op.execute("DROP INDEX IF EXISTS ix_kb_chunks_tsv")
    op.execute("ALTER TABLE kb_chunks DROP COLUMN content_tsv")
