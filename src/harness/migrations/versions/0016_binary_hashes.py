"""The chain's hashes as 32 bytes instead of 64 hex characters: trace_records.prev_hash and .hash, and
chain_head.hash. Half the size in every row, which at 18 chained records per Run is about 1.1 KB of a
PostgreSQL Run's 22 KB. Every value is converted in place, byte for byte the digest it was; a record's
hash is still computed over the hex (harness.domain.chain.record_bytes), so every chain written before
verifies unchanged, and exports, the API and `harness audit verify` still show hex.

The linear-chain trigger (0007) compares a new record's prev_hash with the hash at seq - 1 or the
genesis, so it is replaced with one whose genesis is bytes; the guards of 0014 are reinstalled where the
conversion had to lift them. Per backend:
- PostgreSQL: ALTER COLUMN ... TYPE bytea USING decode(..., 'hex'), which rewrites without firing triggers;
- MySQL/MariaDB: a character column cannot be cast to bytes it does not spell, so each column goes to
  VARBINARY(64) (the hex's own bytes), is UNHEX'ed by an UPDATE (with the UPDATE guard dropped for it,
  inside the migration), then narrowed to VARBINARY(32);
- SQLite: the tables are rebuilt (its recipe for a column's type) and the values converted on the copy,
  by a function the migration registers on its connection (SQLite 3.40 has no unhex()).
The whole migration runs in harness's migration transaction where the backend has transactional DDL
(PostgreSQL, SQLite); MySQL's DDL commits statement by statement, as in every earlier migration.

Revision ID: 0016_binary_hashes
Revises: 0015_sandbox_instances
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from harness.adapters.sql.prune_triggers import guarded_delete_ddl
from harness.adapters.sql.schema import digest_bytes, digest_hex
from harness.adapters.sql.triggers import drop_linear_chain_ddl, linear_chain_ddl

revision = "0016_binary_hashes"
down_revision = "0015_sandbox_instances"
branch_labels = None
depends_on = None

TRACE = "trace_records"
HEAD = "chain_head"
#: each table's hash columns
HASHES = {TRACE: ("prev_hash", "hash"), HEAD: ("hash",)}
#: the rebuilt table's name until the old one is dropped (SQLite)
REBUILT = "{}_rebuilt"
#: the SQLite function that turns a stored value into the other form, registered for the migration
CONVERT = "harness_convert_digest"


def upgrade() -> None:
    _convert(binary=True)


def downgrade() -> None:
    _convert(binary=False)


def _convert(*, binary: bool) -> None:
    dialect = op.get_bind().dialect.name
    _execute(drop_linear_chain_ddl(dialect))
    if dialect == "postgresql":
        for table, columns in HASHES.items():  # one ALTER per table: the table is rewritten once
            kind, using = ("bytea", "decode({}, 'hex')") if binary else ("varchar(64)", "encode({}, 'hex')")
            op.execute(f"ALTER TABLE {table} " + ", ".join(
                f"ALTER COLUMN {c} TYPE {kind} USING {using.format(c)}" for c in columns))
    elif dialect in ("mysql", "mariadb"):
        _execute([f"DROP TRIGGER IF EXISTS {TRACE}_no_update"])
        for table, columns in HASHES.items():
            convert = ", ".join(f"{c} = UNHEX({c})" if binary else f"{c} = LOWER(HEX({c}))" for c in columns)
            _modify(table, columns, "VARBINARY(64)")
            op.execute(f"UPDATE {table} SET {convert}")
            _modify(table, columns, "VARBINARY(32)" if binary else "VARCHAR(64)")
        _execute(guarded_delete_ddl(dialect, TRACE))
    elif dialect == "sqlite":
        _rebuild_sqlite(binary)
        _execute(guarded_delete_ddl(dialect, TRACE))
    else:
        raise NotImplementedError(f"no migration 0016 for dialect {dialect}")
    _execute(linear_chain_ddl(dialect, binary=binary))


def _modify(table: str, columns: tuple[str, ...], kind: str) -> None:
    op.execute(f"ALTER TABLE {table} " + ", ".join(f"MODIFY {c} {kind} NOT NULL" for c in columns))


def _rebuild_sqlite(binary: bool) -> None:
    """Rebuild both tables with the hash columns' new type, converting on the copy. Nothing references
    them; DROP TABLE takes trace_records' index and triggers with it, and the copy runs before any
    trigger is reinstalled (as in 0007)."""
    driver = op.get_bind().connection.driver_connection
    assert driver is not None  # a live migration connection
    driver.create_function(CONVERT, 1, digest_bytes if binary else digest_hex, deterministic=True)
    digest: Any = sa.LargeBinary(32) if binary else sa.String(64)
    tables: dict[str, list[sa.Column[Any]]] = {
        TRACE: [sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
                sa.Column("record_id", sa.String(64), nullable=False, unique=True),
                sa.Column("run_id", sa.String(64)),
                sa.Column("kind", sa.String(32), nullable=False),
                sa.Column("payload", sa.Text, nullable=False),
                sa.Column("prev_hash", digest, nullable=False),
                sa.Column("hash", digest, nullable=False)],
        HEAD: [sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
               sa.Column("seq", sa.BigInteger, nullable=False),
               sa.Column("hash", digest, nullable=False)],
    }
    for table, columns in tables.items():
        names = [c.name for c in columns]
        selected = ", ".join(f"{CONVERT}({n})" if n in HASHES[table] else n for n in names)
        op.create_table(REBUILT.format(table), *columns)
        op.execute(f"INSERT INTO {REBUILT.format(table)} ({', '.join(names)}) SELECT {selected} FROM {table}")
        op.drop_table(table)
        op.rename_table(REBUILT.format(table), table)
    op.create_index("ix_trace_records_run", TRACE, ["run_id"])


def _execute(statements: list[str]) -> None:
    for statement in statements:
        op.execute(statement)
