"""Migration 0024 stores each knowledge-base chunk's text search vector on PostgreSQL (`content_tsv`, a
generated column over the section and the text, with the GIN index on it): chunks written before it are
found after it, a changed text (an erasure's redaction) or section changes its vector, and it reverts to
the index on the expression and re-applies. On SQLite and MariaDB it changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.knowledge import search
from harness.adapters.sql.migration import head_revision, migrate
from harness.knowledge.scope import KnowledgeScope

from .test_migration_0006 import _to, _version
from .test_migration_0023 import _columns, _indexes

BEFORE = "0023_memory_tsvector"
AFTER = "0024_knowledge_tsvector"
SCOPE = KnowledgeScope("t1", ("handbook",))
DOCUMENT = {"document_id": "d1", "tenant_id": "t1", "kb": "handbook", "title": "Shipping",
            "media_type": "text/markdown", "content_hash": "h", "chunks": 1, "chars": 44, "created_at": 1.0}
CHUNK = {"chunk_id": "c1", "document_id": "d1", "tenant_id": "t1", "kb": "handbook", "seq": 0, "section": "Parcels",
         "content": "Order A-1002 was shipped by parcel on Monday", "content_hash": "h1", "created_at": 1.0}


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def _found(engine: sa.Engine, words: str) -> list[str]:
    with engine.connect() as conn:
        return [row.chunk_id for row, _ in search(conn, words, SCOPE, 5)]


def test_chunks_written_before_are_found_through_the_stored_vector_and_it_reverts(engine: sa.Engine) -> None:
    _to(engine, command.upgrade, BEFORE)
    with engine.begin() as conn:
        conn.execute(sa.table("kb_documents", *(sa.column(k) for k in DOCUMENT)).insert().values(**DOCUMENT))
        conn.execute(sa.table("kb_chunks", *(sa.column(k) for k in CHUNK)).insert().values(**CHUNK))
    migrate(engine)
    head = head_revision()
    assert head is not None
    assert _version(engine) == head and head >= AFTER
    assert _found(engine, "where was my parcel shipped") == ["c1"]
    assert _found(engine, "parcels") == ["c1"]  # the section is searched with the text
    postgres = engine.dialect.name == "postgresql"
    assert ("content_tsv" in _columns(engine, "kb_chunks")) is postgres
    if not postgres:
        return
    indexes = _indexes(engine, "kb_chunks")
    assert "ix_kb_chunks_tsv" in indexes and "ix_kb_chunks_fts" not in indexes
    with engine.begin() as conn:  # what an erasure's redaction does: the vector follows the text
        conn.execute(sa.text("UPDATE kb_chunks SET content = 'redacted note about a refund', section = 'Money'"))
    assert _found(engine, "parcel shipped") == [] and _found(engine, "refund") == ["c1"]
    assert _found(engine, "money") == ["c1"]
    _to(engine, command.downgrade, BEFORE)
    assert "content_tsv" not in _columns(engine, "kb_chunks") and "ix_kb_chunks_fts" in _indexes(engine, "kb_chunks")
    migrate(engine)
    assert _found(engine, "refund") == ["c1"] and "ix_kb_chunks_tsv" in _indexes(engine, "kb_chunks")
