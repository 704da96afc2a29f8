"""trace_records keeps one linear chain by a trigger instead of UNIQUE(prev_hash): an INSERT is refused
unless the record's prev_hash is the hash of the record at seq - 1 (GENESIS_HASH at seq 1). With seq the
primary key that forbids forks (SPEC A3) as the UNIQUE did, and also refuses gaps and wrong links. Its
lookup probes the primary key at the table's right edge, where every insert writes anyway, while the
UNIQUE index on random 64-character hex dirtied a random page per chained record (~18% of the pages a
Run writes, ~1.3 KB per Run on disk).

The trigger goes in first, so the chain is never unguarded; existing rows are not re-checked (that is
`harness audit verify`'s work). PostgreSQL and MySQL/MariaDB then drop the constraint by the name the
database gave it. SQLite cannot drop a column constraint: the table is rebuilt, rows copied unchanged,
inside the migration's transaction, with its index, append-only triggers (SPEC A2) and the new trigger.

Revision ID: 0007_linear_chain
Revises: 0006_trace_hash_not_unique
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from harness.adapters.sql.triggers import append_only_ddl, drop_linear_chain_ddl, linear_chain_ddl

revision = "0007_linear_chain"
down_revision = "0006_trace_hash_not_unique"
branch_labels = None
depends_on = None

TABLE = "trace_records"
#: the rebuilt table's name until the old one is dropped (SQLite)
REBUILT = "trace_records_rebuilt"
COLUMNS = "seq, record_id, run_id, kind, payload, prev_hash, hash"


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        _rebuild_sqlite(prev_hash_unique=False)
        return
    _execute(linear_chain_ddl(dialect, binary=False))
    inspector = sa.inspect(op.get_bind())
    constraints = {c["name"] for c in inspector.get_unique_constraints(TABLE) if c["column_names"] == ["prev_hash"]}
    # MySQL reports each unique key both as a constraint and as a unique index, under one name
    indexes = {i["name"] for i in inspector.get_indexes(TABLE)
               if i["unique"] and i["column_names"] == ["prev_hash"]} - constraints
    for name in constraints:
        assert name is not None  # only SQLite leaves column constraints unnamed
        op.drop_constraint(name, TABLE, type_="unique")
    for name in indexes:
        assert name is not None  # an index always has a name
        op.drop_index(name, table_name=TABLE)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        _rebuild_sqlite(prev_hash_unique=True)
        return
    # unnamed, so the database names it as 0001's column constraint was named; before the trigger goes
    op.create_unique_constraint(None, TABLE, ["prev_hash"])
    _execute(drop_linear_chain_ddl(dialect))


def _execute(statements: list[str]) -> None:
    for statement in statements:
        op.execute(statement)


def _rebuild_sqlite(*, prev_hash_unique: bool) -> None:
    """Rebuild trace_records as 0006 left it: with UNIQUE on prev_hash (downgrade), or without it and
    with the linear-chain trigger (upgrade). SQLite's recipe for changing a table: create the new one,
    copy, drop the old, rename. Harness runs migrations in one BEGIN IMMEDIATE transaction, so a failure
    leaves the old table as it was. Nothing references trace_records, so the connection's
    foreign_keys=ON has nothing to check; DROP TABLE removes the triggers (the linear-chain one too)
    before its implicit delete, so they do not fire, and the copy runs before any trigger is installed.
    """
    op.create_table(
        REBUILT,
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("record_id", sa.String(64), nullable=False, unique=True),
        sa.Column("run_id", sa.String(64)),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False, unique=prev_hash_unique),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.execute(f"INSERT INTO {REBUILT} ({COLUMNS}) SELECT {COLUMNS} FROM {TABLE} ORDER BY seq")
    op.drop_table(TABLE)  # with its index and its triggers
    op.rename_table(REBUILT, TABLE)
    op.create_index("ix_trace_records_run", TABLE, ["run_id"])
    _execute(append_only_ddl("sqlite", TABLE))
    if not prev_hash_unique:
        _execute(linear_chain_ddl("sqlite", binary=False))
