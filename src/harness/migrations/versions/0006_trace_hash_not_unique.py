"""trace_records.hash is no longer UNIQUE: prev_hash's UNIQUE already forbids forks (SPEC A3), the
primary key orders the chain and `harness audit verify` recomputes every hash, so the index on random
64-character hex only cost disk space (~2 KB per Run) and a random-page write per chained record.

PostgreSQL and MySQL/MariaDB drop the constraint by the name the database gave it. SQLite cannot drop
a column constraint: the table is rebuilt, rows copied unchanged, inside the migration's transaction,
with its index and append-only triggers (SPEC A2) recreated.

Revision ID: 0006_trace_hash_not_unique
Revises: 0005_memory_content
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from harness.adapters.sql.triggers import append_only_ddl

revision = "0006_trace_hash_not_unique"
down_revision = "0005_memory_content"
branch_labels = None
depends_on = None

TABLE = "trace_records"
#: the rebuilt table's name until the old one is dropped (SQLite)
REBUILT = "trace_records_rebuilt"
COLUMNS = "seq, record_id, run_id, kind, payload, prev_hash, hash"


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(hash_unique=False)
        return
    inspector = sa.inspect(op.get_bind())
    constraints = {c["name"] for c in inspector.get_unique_constraints(TABLE) if c["column_names"] == ["hash"]}
    # MySQL reports each unique key both as a constraint and as a unique index, under one name
    indexes = {i["name"] for i in inspector.get_indexes(TABLE)
               if i["unique"] and i["column_names"] == ["hash"]} - constraints
    for name in constraints:
        assert name is not None  # only SQLite leaves column constraints unnamed
        op.drop_constraint(name, TABLE, type_="unique")
    for name in indexes:
        assert name is not None  # an index always has a name
        op.drop_index(name, table_name=TABLE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(hash_unique=True)
        return
    # unnamed, so the database names it as 0001's column constraint was named
    op.create_unique_constraint(None, TABLE, ["hash"])


def _rebuild_sqlite(*, hash_unique: bool) -> None:
    """Rebuild trace_records as 0001 created it, with or without UNIQUE on hash (SQLite's recipe for
    changing a table: create the new one, copy, drop the old, rename). Harness runs migrations in one
    BEGIN IMMEDIATE transaction, so a failure leaves the old table as it was. Nothing references
    trace_records, so the connection's foreign_keys=ON (which cannot change inside a transaction) has
    nothing to check; DROP TABLE removes the triggers before its implicit delete, so they do not fire.
    """
    op.create_table(
        REBUILT,
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("record_id", sa.String(64), nullable=False, unique=True),
        sa.Column("run_id", sa.String(64)),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("hash", sa.String(64), nullable=False, unique=hash_unique),
    )
    op.execute(f"INSERT INTO {REBUILT} ({COLUMNS}) SELECT {COLUMNS} FROM {TABLE} ORDER BY seq")
    op.drop_table(TABLE)  # with its index and its triggers
    op.rename_table(REBUILT, TABLE)
    op.create_index("ix_trace_records_run", TABLE, ["run_id"])
    for statement in append_only_ddl("sqlite", TABLE):
        op.execute(statement)
