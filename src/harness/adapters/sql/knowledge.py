"""The knowledge-base tables on SQLite, PostgreSQL and MySQL/MariaDB: the KnowledgeRows port.

Lexical search per backend: SQLite FTS5 with bm25, PostgreSQL full-text (a stored vector) with ts_rank_cd, and
on MySQL/MariaDB (or any other database) the scope's chunks holding a lightly stemmed term (LIKE) ranked by an
exact BM25 in Python. Not InnoDB's FULLTEXT: it scores a term over the whole table, and a term every row
holds is not matched at all, so a knowledge base of one document would find nothing. Query text becomes a
bag of plain word terms, so nothing a user types is ever read as query syntax by the database. Every read
of chunks is confined to the caller's scope in SQL.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import read_only, read_retried
from harness.adapters.sql.raw import statements_for
from harness.adapters.sql.units import guarded, joins
from harness.memory.lexical import bm25, stem, terms
from harness.ports.knowledge import KnowledgeScope

c = t.kb_chunks
d = t.kb_documents
_RANK = "rank"
#: how many chunks the LIKE scan scores at most
_SCAN_LIMIT = 2_000


@functools.cache
def scope_rule(any_agent: bool, any_team: bool, bases: int) -> sa.ColumnElement[bool]:
    """The scope rule as SQL, its values bound (`scope_values`): the tenant, its readable knowledge bases,
    every agent's or this agent's documents, every team's or this team's. One clause per shape of scope
    (an agent or not, a team or not, how many knowledge bases), built once."""
    agent = sa.bindparam("p_agent", type_=sa.String)
    team = sa.bindparam("p_team", type_=sa.String)
    return sa.and_(
        c.c.tenant_id == sa.bindparam("p_tenant", type_=sa.String),
        c.c.kb.in_([sa.bindparam(f"p_kb_{i}", type_=sa.String) for i in range(bases)]),
        c.c.agent.is_(None) if any_agent else sa.or_(c.c.agent.is_(None), c.c.agent == agent),
        c.c.team_id.is_(None) if any_team else sa.or_(c.c.team_id.is_(None), c.c.team_id == team))


def in_scope(scope: KnowledgeScope) -> sa.ColumnElement[bool]:
    """`scope_rule` for this scope's shape."""
    return scope_rule(scope.agent is None, scope.team_id is None, len(scope.bases))


def scope_values(scope: KnowledgeScope) -> dict[str, Any]:
    """The values of `in_scope(scope)`'s parameters."""
    values: dict[str, Any] = {"p_tenant": scope.tenant_id, **{f"p_kb_{i}": kb for i, kb in enumerate(scope.bases)}}
    if scope.agent is not None:
        values["p_agent"] = scope.agent
    if scope.team_id is not None:
        values["p_team"] = scope.team_id
    return values


def _columns() -> list[sa.ColumnElement[Any]]:
    return [c.c.chunk_id, c.c.document_id, c.c.tenant_id, c.c.kb, c.c.agent, c.c.team_id, c.c.section,
            c.c.content, c.c.content_hash, d.c.title]


def _joined() -> Any:
    return c.join(d, d.c.document_id == c.c.document_id)


def search(conn: sa.Connection, query: str, scope: KnowledgeScope, k: int) -> list[tuple[Any, float]]:
    """The best `k` (chunk row, score) pairs for `query` within `scope`; higher score is better."""
    words = terms(query)
    if not words or k <= 0 or not scope.bases:
        return []
    dialect = conn.dialect
    if dialect.name in ("sqlite", "postgresql"):
        # a search per Run: the statement is built and compiled once per shape, and runs on the cursor
        stmt = _ranked(dialect.name, scope.agent is None, scope.team_id is None, len(scope.bases))
        match = " OR ".join(f'"{w}"' for w in words) if dialect.name == "sqlite" else " | ".join(words)
        ranked = statements_for(dialect).fetchall(conn, stmt, {**scope_values(scope), "p_words": match, "p_k": k})
        return [(found, -float(found.rank)) for found in map(_Found._make, ranked)]
    like = sa.or_(*(sa.func.lower(column).like(f"%{stem(w)}%") for w in words for column in (c.c.section, c.c.content)))
    rows = conn.execute(sa.select(*_columns()).select_from(_joined()).where(in_scope(scope), like)
                        .limit(_SCAN_LIMIT), scope_values(scope)).all()
    texts = [_Searched(i, f"{row.section}\n{row.content}") for i, row in enumerate(rows)]
    return [(rows[found.position], score) for found, score in bm25(words, texts, k)]


class _Found(NamedTuple):
    """A chunk row of a ranked search, as `_columns()` reads it, with its rank (lower is better)."""

    chunk_id: str
    document_id: str
    tenant_id: str
    kb: str
    agent: str | None
    team_id: str | None
    section: str
    content: str
    content_hash: str
    title: str
    rank: float


@functools.cache
def _ranked(dialect: str, any_agent: bool, any_team: bool, bases: int) -> sa.Select[Any]:
    """The ranked search of SQLite (FTS5, bm25) or PostgreSQL (the stored vector, ts_rank_cd) for a scope of
    this shape, its values bound: the scope's (`scope_values`), `p_words` (the query, in the database's
    syntax) and `p_k`."""
    where = scope_rule(any_agent, any_team, bases)
    words = sa.bindparam("p_words", type_=sa.String)
    if dialect == "sqlite":
        fts = sa.table("kb_chunks_fts", sa.column("rowid"))
        rank: sa.ColumnElement[Any] = sa.func.bm25(sa.literal_column("kb_chunks_fts")).label(_RANK)
        return (sa.select(*_columns(), rank).select_from(fts.join(_joined(), c.c.id == fts.c.rowid))
                .where(sa.literal_column("kb_chunks_fts").op("MATCH")(words), where)
                .order_by(rank).limit(sa.bindparam("p_k", type_=sa.Integer)))
    config: sa.ColumnElement[Any] = sa.literal_column("'english'::regconfig")
    # the stored vector of a section with its text (0024, GIN-indexed): ranking does not parse each
    # matching chunk again; the query is parsed once per search (an uncorrelated subquery), in a
    # prepared statement's generic plan too, where a function of the parameter is evaluated per row
    vector: sa.ColumnElement[Any] = sa.literal_column("kb_chunks.content_tsv")
    tsquery = sa.select(sa.func.to_tsquery(config, words)).scalar_subquery()
    rank = (-sa.func.ts_rank_cd(vector, tsquery)).label(_RANK)
    return (sa.select(*_columns(), rank).select_from(_joined()).where(vector.op("@@")(tsquery), where)
            .order_by(rank).limit(sa.bindparam("p_k", type_=sa.Integer)))


class _Searched(NamedTuple):
    """What BM25 scores of a chunk: its section with its text, and where the chunk's row is."""

    position: int
    content: str


class SqlKnowledgeRows:
    """The KnowledgeRows port on the harness database."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        #: the same pool for reads: on SQLite a search does not queue for the write lock
        self.reader = read_only(engine)

    def same_document(self, tenant_id: str, kb: str, title: str, content_hash: str) -> str | None:
        with self.reader.connect() as conn:
            found = conn.execute(sa.select(d.c.document_id).where(
                d.c.tenant_id == tenant_id, d.c.kb == kb, d.c.title == title, d.c.content_hash == content_hash)
                .order_by(d.c.id).limit(1)).scalar()
        return None if found is None else str(found)

    def insert_document(self, document: dict[str, Any], chunks: Sequence[dict[str, Any]]) -> None:
        with self.engine.begin() as conn:
            conn.execute(d.insert(), [document])
            if chunks:
                conn.execute(c.insert(), list(chunks))

    def documents(self, tenant_id: str, kb: str | None = None, tag: str | None = None) -> list[Any]:
        query = sa.select(d).where(d.c.tenant_id == tenant_id).order_by(d.c.id)
        if kb is not None:
            query = query.where(d.c.kb == kb)
        if tag is not None:  # tags are names (no quote can occur in one): the JSON list holds it quoted
            query = query.where(d.c.tags.like(f'%"{tag}"%'))
        with self.reader.connect() as conn:
            return list(conn.execute(query).all())

    def remove_document(self, tenant_id: str, document_id: str) -> int | None:
        with self.engine.begin() as conn:
            gone = conn.execute(d.delete().where(d.c.tenant_id == tenant_id, d.c.document_id == document_id))
            if not gone.rowcount:
                return None
            chunks = conn.execute(c.delete().where(c.c.tenant_id == tenant_id, c.c.document_id == document_id))
            return int(chunks.rowcount)

    def lexical(self, scope: KnowledgeScope, query: str, k: int) -> list[tuple[Any, float]]:
        if joins(self.reader):  # in a drive's open transaction: under a savepoint, a failure undoes only itself
            with guarded(self.reader, write=False) as conn:
                return search(conn, query, scope, k)
        return read_retried(self.reader, lambda conn: search(conn, query, scope, k))

    def embedded(self, scope: KnowledgeScope, model: str) -> list[Any]:
        if not scope.bases:
            return []
        with guarded(self.reader, write=False) as conn:
            return list(conn.execute(
                sa.select(*_columns(), c.c.embedding).select_from(_joined())
                .where(in_scope(scope), c.c.embedding_model == model, c.c.embedding.is_not(None)),
                scope_values(scope)).all())

    def chunks(self, tenant_id: str, chunk_ids: Sequence[str]) -> list[Any]:
        if not chunk_ids:
            return []
        with self.reader.connect() as conn:
            return list(conn.execute(sa.select(*_columns(), c.c.seq).select_from(_joined())
                                     .where(c.c.tenant_id == tenant_id, c.c.chunk_id.in_(list(chunk_ids)))
                                     .order_by(c.c.id)).all())
