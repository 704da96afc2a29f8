"""Lexical recall per backend: SQLite FTS5 with bm25, PostgreSQL full-text with ts_rank_cd, and an
exact BM25 in Python over the scope's rows for any other database (MySQL/MariaDB).

Query text becomes a bag of plain word terms joined with OR, so nothing a user types is ever
interpreted as query syntax by the database.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.memory.scope import MemoryScope

MAX_TERMS = 24
_WORD = re.compile(r"[A-Za-z0-9]+")
_STOP = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "can", "do", "does", "for", "from", "had", "has",
    "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "no", "not", "of", "on", "or",
    "our", "please", "so", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this",
    "to", "was", "we", "were", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your"))
_RANK = "rank"


def terms(text: str) -> list[str]:
    """Distinct lower-case word terms of `text`, stop words removed, at most MAX_TERMS."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if word not in _STOP and (len(word) > 1 or word.isdigit()):
            seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def _columns() -> list[sa.ColumnElement[Any]]:
    m = t.memory_entries
    return [m.c.entry_id, m.c.tenant_id, m.c.scope, m.c.team_id, m.c.user_id, m.c.session_id, m.c.content,
            m.c.source_run_id]


def sqlite_query(scope: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """FTS5 MATCH joined back to the entries, ranked by bm25 (lower is better); binds p_match, p_limit."""
    m = t.memory_entries
    fts = sa.table("memory_fts", sa.column("rowid"))
    rank = sa.func.bm25(sa.literal_column("memory_fts")).label(_RANK)
    return (sa.select(*_columns(), rank).select_from(fts.join(m, m.c.id == fts.c.rowid))
            .where(sa.literal_column("memory_fts").op("MATCH")(sa.bindparam("p_match", type_=sa.String)), scope)
            .order_by(rank).limit(sa.bindparam("p_limit", type_=sa.Integer)))


def postgres_query(scope: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """to_tsvector @@ to_tsquery on the indexed expression, ranked by ts_rank_cd (higher is better); binds
    p_match, p_limit."""
    m = t.memory_entries
    config: sa.ColumnElement[Any] = sa.literal_column("'english'::regconfig")
    vector = sa.func.to_tsvector(config, m.c.content)
    query = sa.func.to_tsquery(config, sa.bindparam("p_match", type_=sa.String))
    rank = (-sa.func.ts_rank_cd(vector, query)).label(_RANK)
    return (sa.select(*_columns(), rank).where(vector.op("@@")(query), scope).order_by(rank)
            .limit(sa.bindparam("p_limit", type_=sa.Integer)))


def scan_query(scope: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """Every row of the scope, for the Python BM25 fallback."""
    return sa.select(*_columns()).where(scope)


#: (builder, scope clause) -> statement: built once, so a recall only binds values
_BUILT: dict[tuple[Any, int], sa.Select[Any]] = {}


def _built(build: Any, scope: sa.ColumnElement[bool]) -> sa.Select[Any]:
    key = (build, id(scope))
    if key not in _BUILT:
        _BUILT[key] = build(scope)
    return _BUILT[key]


def stem(word: str) -> str:
    """A light English suffix stripper (plurals, -ing, -ed, final e, doubled consonants), so "refunds" finds
    "refund" here as it does with FTS5's porter tokenizer and PostgreSQL's english configuration."""
    if word.endswith("ss") or len(word) <= 3:
        return word
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: len(word) - len(suffix)] + keep
            break
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeioulsz":
        word = word[:-1]
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def bm25(query_terms: Sequence[str], rows: Sequence[Any], k: int, k1: float = 1.2, b: float = 0.75) -> list[
        tuple[Any, float]]:
    """Okapi BM25 over the rows' content, lightly stemmed; the best `k` (row, score) pairs scoring above 0."""
    docs = [Counter(stem(w) for w in _WORD.findall(r.content.lower())) for r in rows]
    query_terms = list(dict.fromkeys(stem(q) for q in query_terms))
    if not docs or not query_terms:
        return []
    avg = sum(sum(d.values()) for d in docs) / len(docs)
    df = {q: sum(1 for d in docs if q in d) for q in query_terms}
    scored = []
    for row, doc in zip(rows, docs, strict=True):
        length = sum(doc.values())
        score = 0.0
        for q in query_terms:
            if doc[q]:
                idf = math.log(1 + (len(docs) - df[q] + 0.5) / (df[q] + 0.5))
                score += idf * doc[q] * (k1 + 1) / (doc[q] + k1 * (1 - b + b * length / max(avg, 1e-9)))
        if score > 0:
            scored.append((row, score))
    scored.sort(key=lambda pair: -pair[1])
    return scored[:k]


def search(conn: sa.Connection, query: str, scope: MemoryScope, k: int) -> list[tuple[Any, float]]:
    """The best `k` (row, score) pairs for `query` within `scope`; higher score is better."""
    words = terms(query)
    if not words or k <= 0:
        return []
    dialect = conn.dialect.name
    params = scope.params()
    if dialect in ("sqlite", "postgresql"):
        build, match = ((sqlite_query, " OR ".join(f'"{w}"' for w in words)) if dialect == "sqlite"
                        else (postgres_query, " | ".join(words)))
        rows = conn.execute(_built(build, scope.clause()), {**params, "p_match": match, "p_limit": k})
        return [(row, -float(row.rank)) for row in rows]
    return bm25(words, conn.execute(_built(scan_query, scope.clause()), params).all(), k)
