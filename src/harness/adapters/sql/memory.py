"""The memory table on SQLite, PostgreSQL and MySQL/MariaDB (SPEC C2, C5): the MemoryRows port.

Lexical recall per backend: SQLite FTS5 with bm25, PostgreSQL full-text with ts_rank, and an exact
BM25 in Python (harness.memory.lexical) over the scope's rows for any other database. Query text
becomes a bag of plain word terms joined with OR, so nothing a user types is ever interpreted as query
syntax by the database. Every read is confined to the caller's scope in SQL: the scope rule, plus an
entry written by a Run counts only once that Run SUCCEEDED (C5).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import read_only, read_retried
from harness.adapters.sql.raw import RawStatements, statements_for
from harness.adapters.sql.units import guarded, joins
from harness.memory.lexical import bm25_of, counted, counted_before, terms
from harness.ports.memory import MemoryScope

m = t.memory_entries
_RANK = "rank"
_SCOPE_COLUMNS = ("team_id", "user_id", "session_id")
_ENTRY_EXISTS = sa.select(m.c.id).where(m.c.entry_id == sa.bindparam("p_entry_id"))
#: one prebuilt statement per pattern of NULL scope columns (`= NULL` matches nothing in SQL)
_SAME_CONTENT: dict[tuple[bool, ...], sa.Select[Any]] = {}


@functools.cache
def scope_clause(with_team: bool) -> sa.ColumnElement[bool]:
    """The scope rule as SQL; its values are bound parameters (`scope_params`), so the clause is built
    once per shape, not per recall."""
    return sa.and_(in_scope(with_team), recallable(m.c.source_run_id))


@functools.cache
def in_scope(with_team: bool, table: sa.FromClause = m) -> sa.ColumnElement[bool]:
    """The scope rule without the condition on the entry's Run (`recallable`), on `table` (the entries, or
    an alias of them)."""
    c = table.c
    user: sa.BindParameter[str] = sa.bindparam("p_scope_user")
    session: sa.BindParameter[str] = sa.bindparam("p_scope_session")
    visible = [c.scope == "tenant",
               sa.and_(c.scope == "user", c.user_id == user),
               sa.and_(c.scope == "session", c.user_id == user, c.session_id == session)]
    if with_team:
        visible.append(sa.and_(c.scope == "team", c.team_id == sa.bindparam("p_scope_team")))
    return sa.and_(c.tenant_id == sa.bindparam("p_scope_tenant"), sa.or_(*visible))


#: how many of a scope's newest entries a recall ranks (those of them that share a word with the query):
#: what one recall costs is bounded, not grown with every summary written back (HARNESS_MEMORY_RECALL_WINDOW)
DEFAULT_RECALL_WINDOW = 1000
_NEWEST = m.alias("newest")


@functools.cache
def window_floor(with_team: bool) -> sa.ColumnElement[Any]:
    """The id of the scope's `p_window_skip + 1`-th newest entry (0 when it has fewer): a recall ranks the
    entries from there on. Uncorrelated, so it is evaluated once per recall. It reads ids newest first
    (PostgreSQL walks the primary key backwards, skipping other scopes' rows): where other users' entries
    far outnumber the caller's, this read grows with them (8.7 ms past 45,000 other entries, measured),
    though it reads ids only and ranks nothing."""
    floor = (sa.select(_NEWEST.c.id).where(in_scope(with_team, _NEWEST)).order_by(_NEWEST.c.id.desc())
             .limit(1).offset(sa.bindparam("p_window_skip", type_=sa.Integer)).scalar_subquery())
    return sa.func.coalesce(floor, 0)


def recallable(source_run_id: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    """An entry counts once its Run SUCCEEDED (an entry of no Run always does)."""
    succeeded = sa.exists().where(t.runs.c.run_id == source_run_id, t.runs.c.state == "SUCCEEDED")
    return sa.or_(source_run_id.is_(None), succeeded)


def scope_params(scope: MemoryScope) -> dict[str, str]:
    """The values of `scope_clause`'s parameters."""
    values = {"p_scope_tenant": scope.tenant_id, "p_scope_user": scope.user_id,
              "p_scope_session": scope.session_id}
    if scope.team_id is not None:
        values["p_scope_team"] = scope.team_id
    return values


def _columns() -> list[sa.ColumnElement[Any]]:
    return [m.c.entry_id, m.c.tenant_id, m.c.scope, m.c.team_id, m.c.user_id, m.c.session_id, m.c.content,
            m.c.source_run_id]


def sqlite_query(with_team: bool) -> sa.Select[Any]:
    """FTS5 MATCH joined back to the entries within the window, ranked by bm25 (lower is better); binds
    p_match, p_limit, p_window_skip. The window is a rowid bound, which FTS5 applies as it reads."""
    fts = sa.table("memory_fts", sa.column("rowid"))
    rank = sa.func.bm25(sa.literal_column("memory_fts")).label(_RANK)
    return (sa.select(*_columns(), rank).select_from(fts.join(m, m.c.id == fts.c.rowid))
            .where(sa.literal_column("memory_fts").op("MATCH")(sa.bindparam("p_match", type_=sa.String)),
                   fts.c.rowid >= window_floor(with_team), scope_clause(with_team))
            .order_by(rank).limit(sa.bindparam("p_limit", type_=sa.Integer)))


def postgres_query(with_team: bool) -> sa.Select[Any]:
    """The best `p_limit` of the window's matching entries by rank, each with whether it is recallable;
    binds p_match, p_limit, p_window_skip. The window's stored vectors (`content_tsv`,
    to_tsvector('english', content); its GIN index, from 0023, is not read: the window is read by id)
    @@ to_tsquery, ranked by ts_rank (higher is better):
    ranking it does not parse each matching entry's content again (ten times the server's CPU with
    thousands of matches). ts_rank (how often the entry has the query's words), not ts_rank_cd (how close
    together): a third of the cost an entry, and the same recall@5 on the labelled set of
    benchmarks/bench_context.py (1.0 for queries sharing words, both). Whether an entry's Run SUCCEEDED
    is asked of the ranked few only: asked of every match, PostgreSQL read the whole runs table at each
    recall (a hashed subplan), which grew with every Run (53 ms a recall at 5,000 Runs)."""
    config: sa.ColumnElement[Any] = sa.literal_column("'english'::regconfig")
    vector: sa.ColumnElement[Any] = sa.literal_column("memory_entries.content_tsv")
    # the query parsed once per recall (a subquery without correlation: an InitPlan): written as a function
    # of the parameter, the plan psycopg's prepared statement settles on after five calls (a generic plan)
    # parsed it again for every entry, in the filter and in the rank (6.4 against 3.7 ms, window of 1,000)
    query = sa.select(sa.func.to_tsquery(config, sa.bindparam("p_match", type_=sa.String))).scalar_subquery()
    # the window is read first, by id (MATERIALIZED: the planner may not fold the match into it): with the
    # query's value unknown to it, the planner guessed the match selective and read every matching entry of
    # the whole table through the GIN index before bounding them by id, a read that grew with the memory
    # (5.7 ms a recall over 50,000 summaries, 1.1 ms reading the window first)
    # it holds ids and vectors only: the best few entries' other columns are read after ranking, by id
    # (carrying every entry's content through the window cost a third of the recall: 4.5 -> 3.1 ms,
    # 5,000 summaries of one user, window of 1,000)
    recent = (sa.select(m.c.id, vector.label("tsv"))
              .where(m.c.id >= window_floor(with_team), in_scope(with_team))
              .cte("recent").prefix_with("MATERIALIZED"))
    rank = (-sa.func.ts_rank(recent.c.tsv, query)).label(_RANK)
    # every Run's summary matches the next Run's task, so a recall ranks the window's matches: 1,000 ranked
    # with ts_rank_cd 3.7 ms, with ts_rank 1.2 ms (quiet server, 5,000 summaries)
    best = (sa.select(recent.c.id, rank)
            .where(recent.c.tsv.op("@@")(query))
            .order_by(rank).limit(sa.bindparam("p_limit", type_=sa.Integer)).subquery("best"))
    return (sa.select(*_columns(), best.c[_RANK], recallable(m.c.source_run_id).label("recallable"))
            .select_from(best.join(m, m.c.id == best.c.id)).order_by(best.c[_RANK]))


def scan_query(with_team: bool) -> sa.Select[Any]:
    """The window's entries as (id, key: the first 32 hex digits of its content hash), in id order, for the
    Python BM25 fallback; binds p_window_skip."""
    return sa.select(m.c.id, sa.func.substr(m.c.content_hash, 1, 32)).where(*_in_window(with_team)).order_by(m.c.id)


def _in_window(with_team: bool) -> tuple[sa.ColumnElement[bool], ...]:
    """The scope's entries that count, from the window's first one on (binds p_window_skip)."""
    return m.c.id >= window_floor(with_team), scope_clause(with_team)


#: `scan_query`'s entries as one row on MySQL/MariaDB: how many, and each one's `<id> <key>` joined by commas
#: (the session's group_concat_max_len, set as it connects, holds ~100,000 of them)
_LISTED: sa.ColumnElement[Any] = sa.literal_column(
    "GROUP_CONCAT(memory_entries.id, ' ', SUBSTR(memory_entries.content_hash, 1, 32) ORDER BY memory_entries.id "
    "SEPARATOR ',')")


def listed_query(with_team: bool) -> sa.Select[Any]:
    """`scan_query` in one row (count, list). PyMySQL reads each row of a result in Python, ~5 µs a row: the
    window's 1,000 rows cost more than ranking them, one row of ~42 KB almost nothing."""
    return sa.select(sa.func.count(), _LISTED).where(*_in_window(with_team))


def _window(conn: sa.Connection, raw: RawStatements, team: bool, params: dict[str, Any]) -> list[tuple[int, str]]:
    """The window's (id, key) pairs, read as one row where the database can list them, else row by row (a
    list longer than group_concat_max_len comes back cut short: its count then says so)."""
    if conn.dialect.name in ("mysql", "mariadb"):
        count, listed = raw.fetchone(conn, _built(listed_query, team), params)
        pairs = [entry.split(" ", 1) for entry in listed.split(",")] if listed else []
        if len(pairs) == count and all(len(pair) == 2 for pair in pairs):
            return [(int(entry_id), key) for entry_id, key in pairs]
    return [(int(entry_id), str(key)) for entry_id, key in raw.fetchall(conn, _built(scan_query, team), params)]


#: the texts of the window's entries whose term counts this process does not hold yet
_CONTENTS = sa.select(m.c.id, m.c.content).where(m.c.id.in_(sa.bindparam("p_ids", expanding=True)))


def rows_query(with_team: bool) -> sa.Select[Any]:
    """The ranked entries' rows, by id, still within the scope; binds p_ids."""
    return sa.select(m.c.id, *_columns()).where(m.c.id.in_(sa.bindparam("p_ids", expanding=True)),
                                               scope_clause(with_team))


def _ranked_here(conn: sa.Connection, raw: RawStatements, words: list[str], scope: MemoryScope,
                 params: dict[str, Any], k: int) -> list[tuple[Any, float]]:
    """The Python BM25 over the window (MySQL/MariaDB), in up to three reads: the window's ids and content
    hashes (`_window`); the texts of those entries whose term counts the process does not hold yet
    (`TermCounts`, kept by content hash: the same hash, the same text), none once it has ranked them before;
    and the rows of the best `k`. Reading the whole window's rows with their texts at every recall was most
    of its cost once the counts were kept (7 of ~10 ms for 1,000 entries on MariaDB, measured). An entry
    erased between the reads is left out."""
    team = scope.team_id is not None
    window = _window(conn, raw, team, params)
    keys = [key.encode() for _, key in window]
    docs = counted_before(keys)
    missing = [entry[0] for entry, doc in zip(window, docs, strict=True) if doc is None]
    if missing:
        texts = dict(conn.execute(_CONTENTS, {"p_ids": missing}).all())
        for i, entry in enumerate(window):
            if docs[i] is None and entry[0] in texts:
                docs[i] = counted(keys[i], texts[entry[0]])
    present = [(entry[0], doc) for entry, doc in zip(window, docs, strict=True) if doc is not None]
    best = bm25_of([doc for _, doc in present], words, k)
    if not best:
        return []
    ids = [present[position][0] for position, _ in best]
    rows = {row.id: row for row in conn.execute(_built(rows_query, team), {**scope_params(scope), "p_ids": ids})}
    return [(rows[present[position][0]], score) for position, score in best if present[position][0] in rows]


#: (builder, with a team?) -> statement: built once, so a recall only binds values
_BUILT: dict[tuple[Any, bool], sa.Select[Any]] = {}


def _built(build: Any, with_team: bool) -> sa.Select[Any]:
    key = (build, with_team)
    if key not in _BUILT:
        _BUILT[key] = build(with_team)
    return _BUILT[key]


class Ranked(NamedTuple):
    """A ranked entry as the full-text reads return it: `_columns()`, then its rank."""

    entry_id: str
    tenant_id: str
    scope: str
    team_id: str | None
    user_id: str | None
    session_id: str | None
    content: str
    source_run_id: str | None
    rank: float


def search(conn: sa.Connection, query: str, scope: MemoryScope, k: int,
           window: int = DEFAULT_RECALL_WINDOW) -> list[tuple[Any, float]]:
    """The best `k` (row, score) pairs for `query` within `scope`; higher score is better. Only the scope's
    newest `window` entries are ranked (those of them that share a word with the query), on every backend."""
    words = terms(query)
    if not words or k <= 0:
        return []
    dialect = conn.dialect.name
    team = scope.team_id is not None
    params = {**scope_params(scope), "p_window_skip": window - 1}
    raw = statements_for(conn.dialect)
    # on the DBAPI cursor (SQLAlchemy's execution path costs more than the read): the statements'
    # parameters are plain strings and ints
    if dialect == "sqlite":
        found = raw.fetchall(conn, _built(sqlite_query, team),
                             {**params, "p_match": " OR ".join(f'"{w}"' for w in words), "p_limit": k})
        return [(row, -float(row.rank)) for row in map(Ranked._make, found)]
    if dialect == "postgresql":
        # the best entries of the scope, then those of them that count: more are ranked while the ones
        # that do not count (their Run still running, or failed) leave fewer than k
        statement, wanted = _built(postgres_query, team), max(2 * k, 16)
        while True:
            found = raw.fetchall(conn, statement, {**params, "p_match": " | ".join(words), "p_limit": wanted})
            counted = [Ranked._make(row[:-1]) for row in found if row[-1]]
            if len(counted) >= k or len(found) < wanted:
                return [(row, -float(row.rank)) for row in counted[:k]]
            wanted *= 4
    return _ranked_here(conn, raw, words, scope, params, k)


def _same_content_query(nulls: tuple[bool, ...]) -> sa.Select[Any]:
    scope = [m.c[c].is_(None) if null else m.c[c] == sa.bindparam(f"p_{c}")
             for c, null in zip(_SCOPE_COLUMNS, nulls, strict=True)]
    succeeded = sa.exists().where(t.runs.c.run_id == m.c.source_run_id, t.runs.c.state == "SUCCEEDED")
    return (sa.select(m.c.entry_id)
            .where(m.c.tenant_id == sa.bindparam("p_tenant_id"), m.c.content_hash == sa.bindparam("p_content_hash"),
                   m.c.scope == sa.bindparam("p_scope"), *scope,
                   sa.or_(m.c.source_run_id.is_(None), succeeded))
            .order_by(m.c.id).limit(1))


class SqlMemoryRows:
    """The MemoryRows port on the harness database."""

    def __init__(self, engine: sa.Engine, *, recall_window: int = DEFAULT_RECALL_WINDOW) -> None:
        self.engine = engine
        #: how many of a scope's newest entries a lexical recall ranks (`search`)
        self.recall_window = recall_window
        #: the same pool for reads: on SQLite a recall or a lookup does not queue for the write lock
        self.reader = read_only(engine)
        self._raw = RawStatements(engine.dialect)  # the write-back's lookups on the DBAPI cursor (issue 9)

    def same_content(self, rows: Sequence[dict[str, Any]]) -> list[str | None]:
        """Per row: the entry itself if already stored (a repeated write-back), else an entry of the same
        scope with the same content that recall can see (its Run, if any, SUCCEEDED), else None. An entry
        of a Run that never succeeded does not count: it is never recalled."""
        # both reads of every row at once: on PostgreSQL one round trip for them all
        queries = [query for row in rows for query in self._same_content_reads(row)]
        with guarded(self.reader, write=False) as conn:
            found = self._raw.fetch_each(conn, *queries)
        out: list[str | None] = []
        for row, itself, same in zip(rows, found[0::2], found[1::2], strict=True):
            out.append(str(row["entry_id"]) if itself else str(same[0][0]) if same else None)
        return out

    @staticmethod
    def _same_content_reads(row: dict[str, Any]) -> tuple[tuple[Any, dict[str, Any]], tuple[Any, dict[str, Any]]]:
        """The row's own entry, and an entry of its scope with its content that recall can see."""
        nulls = tuple(row[c] is None for c in _SCOPE_COLUMNS)
        query = _SAME_CONTENT.get(nulls)
        if query is None:
            query = _SAME_CONTENT[nulls] = _same_content_query(nulls)
        return ((_ENTRY_EXISTS, {"p_entry_id": row["entry_id"]}),
                (query, {"p_tenant_id": row["tenant_id"], "p_content_hash": row["content_hash"],
                         "p_scope": row["scope"], **{f"p_{c}": row[c] for c in _SCOPE_COLUMNS if row[c] is not None}}))

    def insert_new(self, rows: Sequence[dict[str, Any]]) -> None:
        with guarded(self.engine, write=True) as conn:
            existing = set(conn.execute(sa.select(m.c.entry_id).where(
                m.c.entry_id.in_([r["entry_id"] for r in rows]))).scalars())
            fresh = [r for r in rows if r["entry_id"] not in existing]
            if fresh:
                conn.execute(m.insert(), fresh)

    def lexical(self, scope: MemoryScope, query: str, k: int) -> list[tuple[Any, float]]:
        if joins(self.reader):  # in a drive's open transaction: under a savepoint, a failure undoes only itself
            with guarded(self.reader, write=False) as conn:
                return search(conn, query, scope, k, self.recall_window)
        # on its own: checked out without a ping round trip, run again if its connection was dead
        return read_retried(self.reader, lambda conn: search(conn, query, scope, k, self.recall_window))

    def embedded(self, scope: MemoryScope, model: str) -> list[Any]:
        with guarded(self.reader, write=False) as conn:
            return list(conn.execute(
                sa.select(m.c.entry_id, m.c.tenant_id, m.c.scope, m.c.team_id, m.c.user_id, m.c.session_id,
                          m.c.content, m.c.source_run_id, m.c.embedding)
                .where(scope_clause(scope.team_id is not None), m.c.embedding_model == model,
                       m.c.embedding.is_not(None)),
                scope_params(scope)).all())

    def backfill(self, batch: int, embed: Callable[[list[str]], list[bytes]], model: str) -> int:
        with self.engine.begin() as conn:
            rows = conn.execute(sa.select(m.c.id, m.c.content).where(m.c.embedding.is_(None)).limit(batch)).all()
            if not rows:
                return 0
            for row, blob in zip(rows, embed([r.content for r in rows]), strict=True):
                conn.execute(m.update().where(m.c.id == row.id).values(embedding=blob, embedding_model=model))
        return len(rows)

    def entries_of_run(self, run_id: str) -> list[str]:
        with self.reader.connect() as conn:
            return list(conn.execute(sa.select(m.c.entry_id).where(m.c.source_run_id == run_id)
                                     .order_by(m.c.id)).scalars())

    def forget_user(self, tenant_id: str, user_id: str) -> int:
        with self.engine.begin() as conn:
            deleted = conn.execute(m.delete().where(m.c.tenant_id == tenant_id, m.c.user_id == user_id))
        return int(deleted.rowcount)
