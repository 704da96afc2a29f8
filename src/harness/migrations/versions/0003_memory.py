"""Long-term memory with tenant/team/user/session scopes and its lexical index (SPEC C2, C5).

Revision ID: 0003_memory
Revises: 0002_gatekeeper
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003_memory"
down_revision = "0002_gatekeeper"
branch_labels = None
depends_on = None

ID = sa.String(64)
#: MySQL's TEXT holds only 64 KB
TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")

#: SQLite: an external-content FTS5 table kept in step with memory_entries by triggers
SQLITE_FTS = (
    "CREATE VIRTUAL TABLE memory_fts USING fts5(content, content='memory_entries', content_rowid='id', "
    "tokenize='porter unicode61')",
    "CREATE TRIGGER memory_fts_insert AFTER INSERT ON memory_entries BEGIN "
    "INSERT INTO memory_fts(rowid, content) VALUES (new.id, new.content); END",
    "CREATE TRIGGER memory_fts_delete AFTER DELETE ON memory_entries BEGIN "
    "INSERT INTO memory_fts(memory_fts, rowid, content) VALUES ('delete', old.id, old.content); END",
    "CREATE TRIGGER memory_fts_update AFTER UPDATE OF content ON memory_entries BEGIN "
    "INSERT INTO memory_fts(memory_fts, rowid, content) VALUES ('delete', old.id, old.content); "
    "INSERT INTO memory_fts(rowid, content) VALUES (new.id, new.content); END",
)
#: PostgreSQL: full-text search through an expression index (the query uses the same expression)
POSTGRES_FTS = (
    "CREATE INDEX ix_memory_fts ON memory_entries USING gin (to_tsvector('english'::regconfig, content))",
)


def upgrade() -> None:
    op.create_table(
        "memory_entries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("entry_id", ID, nullable=False, unique=True),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("team_id", sa.String(128)),
        sa.Column("user_id", sa.String(128)),
        sa.Column("session_id", sa.String(128)),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("content", TEXT, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("source_run_id", ID),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("embedding", sa.LargeBinary),
        sa.Column("embedding_model", sa.String(64)),
    )
    op.create_index("ix_memory_scope", "memory_entries", ["tenant_id", "scope", "user_id", "session_id"])
    op.create_index("ix_memory_team", "memory_entries", ["tenant_id", "team_id"])
    op.create_index("ix_memory_source_run", "memory_entries", ["source_run_id"])
    dialect = op.get_bind().dialect.name
    for statement in {"sqlite": SQLITE_FTS, "postgresql": POSTGRES_FTS}.get(dialect, ()):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for trigger in ("memory_fts_insert", "memory_fts_delete", "memory_fts_update"):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        op.execute("DROP TABLE IF EXISTS memory_fts")
    op.drop_table("memory_entries")
