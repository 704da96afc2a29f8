"""The statements of one backend are built from that backend's SQLAlchemy dialect only when that backend
runs them (a SQLite process never imports the PostgreSQL or MySQL dialect packages), and compile to the
same SQL as when they were built at import."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.schema import CreateTable

from harness.adapters.sql import blobs, ledger
from harness.adapters.sql import schema as t
from harness.adapters.sql import statements as q

#: PostgreSQL's default dialect (psycopg2's), whose constructor SQLAlchemy leaves unannotated
_postgresql = cast("Callable[[], sa.Dialect]", postgresql.dialect)


def sql(statement: sa.ClauseElement, dialect: sa.Dialect) -> str:
    """`statement` as `dialect` compiles it."""
    return str(statement.compile(dialect=dialect))


def test_blob_contents_are_longtext_on_mysql_and_text_elsewhere() -> None:
    """The blobs table's content column is LONGTEXT on MySQL and MariaDB, TEXT on the others (as migrated)."""
    assert "content LONGTEXT NOT NULL" in sql(CreateTable(blobs.blobs), mysql.dialect())
    assert "content TEXT NOT NULL" in sql(CreateTable(blobs.blobs), _postgresql())
    assert "content TEXT NOT NULL" in sql(CreateTable(blobs.blobs), sqlite.dialect())


def test_digests_are_varbinary_on_mysql() -> None:
    """A chain digest column is VARBINARY(32) on MySQL, bytes elsewhere."""
    assert "hash VARBINARY(32)" in sql(CreateTable(t.trace_records), mysql.dialect())
    assert "hash BYTEA" in sql(CreateTable(t.trace_records), _postgresql())


def test_insert_unless_present_per_dialect() -> None:
    """Blobs are inserted unless present: ON CONFLICT DO NOTHING on SQLite and PostgreSQL, INSERT IGNORE on
    MySQL; one statement object per dialect and table (their compiled forms are cached by it)."""
    keys = ("hash",)
    for name, dialect in (("sqlite", sqlite.dialect()), ("postgresql", _postgresql())):
        built = blobs._insert_new(name, blobs.blobs, keys)
        assert built is blobs._insert_new(name, blobs.blobs, keys)
        assert sql(built, dialect).endswith("ON CONFLICT (hash) DO NOTHING")
    assert sql(blobs._insert_new("mysql", blobs.blobs, keys), mysql.dialect()).startswith(
        "INSERT IGNORE INTO blobs")


def test_totals_upsert_per_dialect() -> None:
    """The spend totals' upsert is ON DUPLICATE KEY UPDATE on MySQL, ON CONFLICT DO UPDATE elsewhere, on the
    key of a total's row (its shard included)."""
    assert "ON DUPLICATE KEY UPDATE" in sql(ledger._add_to_totals("mysql"), mysql.dialect())
    for name, dialect in (("sqlite", sqlite.dialect()), ("postgresql", _postgresql())):
        assert "ON CONFLICT (tenant_id, user_id, shard) DO UPDATE" in sql(ledger._add_to_totals(name), dialect)


def test_postgresql_batch_statements_take_an_array() -> None:
    """The chain's batch statements on PostgreSQL compare with = ANY of one array parameter, built once."""
    assert q.chained_ids_any() is q.chained_ids_any()
    assert "= ANY (%(p_ids)s::VARCHAR[])" in sql(q.chained_ids_any(), _postgresql())
    assert "outbox.id = ANY (%(p_ids)s::INTEGER[])" in sql(q.outbox_delete_any(), _postgresql())
