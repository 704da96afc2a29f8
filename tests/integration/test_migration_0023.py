"""Migration 0023 stores each memory entry's text search vector on PostgreSQL (`content_tsv`, a generated
column with the GIN index on it): entries written before it are found by recall after it, a changed
content (an erasure's redaction) changes its vector, and it reverts to the index on the expression and
re-applies. On SQLite and MariaDB it changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.memory import search
from harness.adapters.sql.migration import head_revision, migrate
from harness.memory.scope import MemoryScope

from .test_migration_0006 import _to, _version

BEFORE = "0022_sandbox_instance_provider"
AFTER = "0023_memory_tsvector"
ALICE = MemoryScope("t1", "alice", "s1")
ROW = {"entry_id": "m1", "tenant_id": "t1", "scope": "user", "user_id": "alice", "kind": "answer",
       "content": "Order A-1002 was shipped by parcel on Monday", "content_hash": "h1", "created_at": 1.0}


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def _found(engine: sa.Engine, words: str) -> list[str]:
    with engine.connect() as conn:
        return [row.entry_id for row, _ in search(conn, words, ALICE, 5)]


def _indexes(engine: sa.Engine, table: str = "memory_entries") -> set[str | None]:
    return {i["name"] for i in sa.inspect(engine).get_indexes(table)}


def _columns(engine: sa.Engine, table: str = "memory_entries") -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def test_entries_written_before_are_recalled_through_the_stored_vector_and_it_reverts(engine: sa.Engine) -> None:
    _to(engine, command.upgrade, BEFORE)
    with engine.begin() as conn:
        conn.execute(sa.table("memory_entries", *(sa.column(k) for k in ROW)).insert().values(**ROW))
    migrate(engine)
    head = head_revision()
    assert head is not None
    assert _version(engine) == head and head >= AFTER
    assert _found(engine, "where was my parcel shipped") == ["m1"]
    postgres = engine.dialect.name == "postgresql"
    assert ("content_tsv" in _columns(engine)) is postgres
    if not postgres:
        return
    assert "ix_memory_tsv" in _indexes(engine) and "ix_memory_fts" not in _indexes(engine)
    with engine.begin() as conn:  # what an erasure's redaction does: the vector follows the content
        conn.execute(sa.text("UPDATE memory_entries SET content = 'redacted note about a refund'"))
    assert _found(engine, "parcel shipped") == [] and _found(engine, "refund") == ["m1"]
    _to(engine, command.downgrade, BEFORE)
    assert "content_tsv" not in _columns(engine) and "ix_memory_fts" in _indexes(engine)
    migrate(engine)
    assert _found(engine, "refund") == ["m1"] and "ix_memory_tsv" in _indexes(engine)
