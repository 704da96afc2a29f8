"""Knowledge bases: documents of a tenant (optionally of one agent or one team), cut into chunks that the
context assembler searches and gives the model (seed 004 §3.2).

- `kb_documents`: one row per ingested file: tenant, knowledge base, optional agent and team, title, media
  type, tags, the hash of its (secret-filtered) text and how many chunks it was cut into.
- `kb_chunks`: the chunks, with the document's scope columns repeated (the search is confined in SQL without
  a join), their content hash (what a Run's trace names) and, with the semantic extra, their embedding.

Lexical search per backend: SQLite FTS5 (an external-content table kept in step by triggers), PostgreSQL
full-text (a GIN expression index); MySQL/MariaDB scan the scope's chunks that hold a term (no FULLTEXT index:
InnoDB scores a term over the whole table, and one that every row holds is not matched at all, so a knowledge
base of one document would find nothing).

Revision ID: 0021_knowledge
Revises: 0020_lease_waiting
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0021_knowledge"
down_revision = "0020_lease_waiting"
branch_labels = None
depends_on = None

ID = sa.String(64)
#: MySQL's TEXT holds only 64 KB
TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")

#: SQLite: an external-content FTS5 table over a chunk's section (its heading path) and its text
SQLITE_FTS = (
    "CREATE VIRTUAL TABLE kb_chunks_fts USING fts5(section, content, content='kb_chunks', content_rowid='id', "
    "tokenize='porter unicode61')",
    "CREATE TRIGGER kb_chunks_fts_insert AFTER INSERT ON kb_chunks BEGIN "
    "INSERT INTO kb_chunks_fts(rowid, section, content) VALUES (new.id, new.section, new.content); END",
    "CREATE TRIGGER kb_chunks_fts_delete AFTER DELETE ON kb_chunks BEGIN "
    "INSERT INTO kb_chunks_fts(kb_chunks_fts, rowid, section, content) "
    "VALUES ('delete', old.id, old.section, old.content); END",
    "CREATE TRIGGER kb_chunks_fts_update AFTER UPDATE OF section, content ON kb_chunks BEGIN "
    "INSERT INTO kb_chunks_fts(kb_chunks_fts, rowid, section, content) "
    "VALUES ('delete', old.id, old.section, old.content); "
    "INSERT INTO kb_chunks_fts(rowid, section, content) VALUES (new.id, new.section, new.content); END",
)
#: PostgreSQL: the same expression the search uses, over the section and the text
POSTGRES_FTS = (
    "CREATE INDEX ix_kb_chunks_fts ON kb_chunks "
    "USING gin (to_tsvector('english'::regconfig, section || ' ' || content))",
)


def upgrade() -> None:
    op.create_table(
        "kb_documents",
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
    )
    op.create_index("ix_kb_documents_tenant", "kb_documents", ["tenant_id", "kb"])
    op.create_table(
        "kb_chunks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("chunk_id", ID, nullable=False, unique=True),
        sa.Column("document_id", ID, nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("kb", sa.String(64), nullable=False),
        sa.Column("agent", sa.String(64)),
        sa.Column("team_id", sa.String(128)),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("section", sa.String(256), nullable=False),
        sa.Column("content", TEXT, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("embedding", sa.LargeBinary),
        sa.Column("embedding_model", sa.String(64)),
    )
    op.create_index("ix_kb_chunks_scope", "kb_chunks", ["tenant_id", "kb"])
    op.create_index("ix_kb_chunks_document", "kb_chunks", ["document_id"])
    dialect = op.get_bind().dialect.name
    for statement in {"sqlite": SQLITE_FTS, "postgresql": POSTGRES_FTS}.get(dialect, ()):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for trigger in ("kb_chunks_fts_insert", "kb_chunks_fts_delete", "kb_chunks_fts_update"):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        op.execute("DROP TABLE IF EXISTS kb_chunks_fts")
    op.drop_table("kb_chunks")
    op.drop_table("kb_documents")
