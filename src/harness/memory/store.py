"""The memory store: scoped long-term memory in the harness database (SPEC C2, C5).

Writes go through `add`, which scrubs secrets before anything is stored (C4 applies to memory too)
and is idempotent by entry id. Recall is lexical by default; with an embedder (the `[semantic]`
extra) it fuses lexical and vector rankings (reciprocal rank fusion), so entries stored before the
extra was installed are still found. Every recall is confined to the caller's scope in SQL and
checked row by row afterwards (ScopeViolationError). Any other failure is a RecallError, which the
assembler turns into "no memory", traced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import read_only
from harness.adapters.sql.raw import RawStatements
from harness.context.errors import RecallError, ScopeViolationError
from harness.context.secrets import SecretFilter
from harness.domain.chain import content_hash
from harness.domain.errors import InvalidRequestError
from harness.domain.ids import ordered_id
from harness.memory import lexical
from harness.memory.scope import LEVELS, MemoryScope, ScopeLevel
from harness.memory.semantic import Embedder, to_blob, top_k
from harness.ports import Clock

Mode = Literal["lexical", "vector", "hybrid"]
#: reciprocal rank fusion constant (the usual 60): rank matters, raw scores of two rankers do not mix
RRF_K = 60
#: how many rows per wanted entry recall reads at most while skipping copies of the same content
MAX_FETCH_FACTOR = 32


@dataclass(frozen=True)
class NewMemory:
    """An entry to store; the scope's own columns must be given (user for user scope, and so on)."""

    tenant_id: str
    scope: ScopeLevel
    content: str
    user_id: str | None = None
    session_id: str | None = None
    team_id: str | None = None
    kind: str = "note"
    source_run_id: str | None = None
    entry_id: str | None = None


@dataclass(frozen=True)
class Recalled:
    """One recalled entry, with its score under the ranking used."""

    entry_id: str
    tenant_id: str
    scope: str
    user_id: str | None
    session_id: str | None
    team_id: str | None
    content: str
    source_run_id: str | None
    score: float


def _columns_for(entry: NewMemory) -> dict[str, str | None]:
    """Only the columns that define the scope are kept; a missing one is a programming error."""
    if entry.scope not in LEVELS:
        raise ValueError(f"unknown memory scope {entry.scope!r}")
    need = {"tenant": (), "team": ("team_id",), "user": ("user_id",),
            "session": ("user_id", "session_id")}[entry.scope]
    values: dict[str, str | None] = {"team_id": None, "user_id": None, "session_id": None}
    for column in need:
        value = getattr(entry, column)
        if not value:
            raise ValueError(f"a {entry.scope}-scoped memory entry needs {column}")
        values[column] = value
    return values


class MemoryStore:
    """Scoped memory on SQLite, PostgreSQL or MySQL/MariaDB."""

    def __init__(self, engine: sa.Engine, clock: Clock, secret_filter: SecretFilter,
                 embedder: Embedder | None = None) -> None:
        self.engine = engine
        #: the same pool for reads: on SQLite a recall or a lookup does not queue for the write lock
        self.reader = read_only(engine)
        self._raw = RawStatements(engine.dialect)  # the write-back's lookups on the DBAPI cursor (issue 9)
        self.clock = clock
        self.filter = secret_filter
        self.embedder = embedder

    @property
    def mode(self) -> Mode:
        """The default ranking: hybrid with an embedder, lexical without."""
        return "hybrid" if self.embedder is not None else "lexical"

    def add(self, entries: Sequence[NewMemory]) -> list[str]:
        """Store entries (secrets removed, embedded if an embedder is set); returns the id under which each
        entry can be recalled.

        An entry id that already exists is skipped, so a repeated write-back stores nothing twice. An entry
        whose scrubbed content the same scope already holds (and recalls) is not stored again either: its
        id is the existing entry's. A user who asks the same thing every day keeps one memory of the
        answer, not one per day crowding every other memory out of recall.
        """
        rows = [self._row(e) for e in entries]
        if not rows:
            return []
        ids: list[str] = []
        fresh: list[dict[str, Any]] = []
        with self.reader.connect() as conn:  # read first: embedding must not hold the database's write lock
            kept: dict[tuple[Any, ...], str] = {}  # (scope, content hash) -> id, for this call's own entries
            for row in rows:
                key = (*_scope_key(row), row["content_hash"])
                same = kept.get(key) or _same_content(conn, self._raw, row)
                if same is None:
                    fresh.append(row)
                    same = kept[key] = row["entry_id"]
                ids.append(same)
        if fresh and self.embedder is not None:
            for row, vector in zip(fresh, self.embedder.embed([r["content"] for r in fresh]), strict=True):
                row.update(embedding=to_blob(vector), embedding_model=self.embedder.name)
        if fresh:
            with self.engine.begin() as conn:
                existing = set(conn.execute(sa.select(t.memory_entries.c.entry_id).where(
                    t.memory_entries.c.entry_id.in_([r["entry_id"] for r in fresh]))).scalars())
                fresh = [r for r in fresh if r["entry_id"] not in existing]
                if fresh:
                    conn.execute(t.memory_entries.insert(), fresh)
        return ids

    def _row(self, entry: NewMemory) -> dict[str, Any]:
        content = self.filter.scrub(entry.content).text
        return {"entry_id": entry.entry_id or ordered_id(), "tenant_id": entry.tenant_id,
                "scope": entry.scope, **_columns_for(entry), "kind": entry.kind, "content": content,
                "content_hash": content_hash(content), "source_run_id": entry.source_run_id,
                "created_at": self.clock.now(), "embedding": None, "embedding_model": None}

    def recall(self, scope: MemoryScope, query: str, k: int, mode: Mode | None = None) -> list[Recalled]:
        """The `k` entries of `scope` that best match `query`.

        ScopeViolationError if a row outside the scope comes back; RecallError for any other failure.
        """
        mode = mode or self.mode
        if k <= 0 or not query.strip():
            return []
        try:
            with self.reader.connect() as conn:
                fetch = 2 * k
                while True:  # copies of one content (stored before write-back deduplicated) count once
                    ranked = self._rank(conn, scope, query, fetch, mode)
                    best = _distinct(ranked, k)
                    if len(best) == k or len(ranked) < fetch or fetch >= MAX_FETCH_FACTOR * k:
                        break
                    fetch *= 4
        except ScopeViolationError:
            raise
        except Exception as exc:  # database, index or model failure: the caller degrades to no memory
            raise RecallError(f"{mode} recall failed: {type(exc).__name__}: {exc}") from exc
        scope.check([row for row, _ in ranked])
        return [Recalled(r.entry_id, r.tenant_id, r.scope, r.user_id, r.session_id, r.team_id, r.content,
                         r.source_run_id, score) for r, score in best]

    def _rank(self, conn: sa.Connection, scope: MemoryScope, query: str, k: int,
              mode: Mode) -> list[tuple[Any, float]]:
        if mode == "lexical":
            return lexical.search(conn, query, scope, k)
        vector = self._vector(conn, scope, query, k if mode == "vector" else 4 * k)
        if mode == "vector":
            return vector
        return _fuse([lexical.search(conn, query, scope, 4 * k), vector], k)

    def _vector(self, conn: sa.Connection, scope: MemoryScope, query: str, k: int) -> list[tuple[Any, float]]:
        if self.embedder is None:
            raise RecallError("vector recall needs an embedder (the [semantic] extra)")
        m = t.memory_entries
        rows = conn.execute(
            sa.select(m.c.entry_id, m.c.tenant_id, m.c.scope, m.c.team_id, m.c.user_id, m.c.session_id,
                      m.c.content, m.c.source_run_id, m.c.embedding)
            .where(scope.clause(), m.c.embedding_model == self.embedder.name, m.c.embedding.is_not(None)),
            scope.params()).all()
        return top_k(self.embedder.embed([query])[0], rows, k)

    def backfill_embeddings(self, batch: int = 256) -> int:
        """Embed entries stored without an embedding (before the extra was installed); returns how many."""
        if self.embedder is None:
            return 0
        m = t.memory_entries
        done = 0
        while True:
            with self.engine.begin() as conn:
                missing = sa.select(m.c.id, m.c.content).where(m.c.embedding.is_(None)).limit(batch)
                rows = conn.execute(missing).all()
                if not rows:
                    return done
                vectors = self.embedder.embed([r.content for r in rows])
                for row, vector in zip(rows, vectors, strict=True):
                    conn.execute(m.update().where(m.c.id == row.id).values(
                        embedding=to_blob(vector), embedding_model=self.embedder.name))
            done += len(rows)

    def entries_of_run(self, run_id: str) -> list[str]:
        """Ids of the entries a Run wrote back."""
        m = t.memory_entries
        with self.reader.connect() as conn:
            return list(conn.execute(sa.select(m.c.entry_id).where(m.c.source_run_id == run_id)
                                     .order_by(m.c.id)).scalars())

    def forget_user(self, tenant_id: str, user_id: str) -> int:
        """Delete every entry of a user (their user and session scopes); returns how many."""
        m = t.memory_entries
        with self.engine.begin() as conn:
            deleted = conn.execute(m.delete().where(m.c.tenant_id == tenant_id, m.c.user_id == user_id))
        return int(deleted.rowcount)


def _distinct(ranked: Sequence[tuple[Any, float]], k: int) -> list[tuple[Any, float]]:
    """The best `k` entries with distinct content: the same text twice tells the model nothing more (and
    databases written before write-back deduplicated hold such copies)."""
    seen: set[str] = set()
    out: list[tuple[Any, float]] = []
    for row, score in ranked:
        if row.content not in seen and len(out) < k:
            seen.add(row.content)
            out.append((row, score))
    return out


def _scope_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["tenant_id"], row["scope"], row["team_id"], row["user_id"], row["session_id"]


def _same_content(conn: sa.Connection, raw: RawStatements, row: dict[str, Any]) -> str | None:
    """The id of the entry itself if it is already stored (a repeated write-back), else of an entry of the same
    scope with the same content that recall can see (its Run, if any, SUCCEEDED), else None. An entry of a
    Run that never succeeded does not count: it is never recalled."""
    if raw.fetchone(conn, _ENTRY_EXISTS, {"p_entry_id": row["entry_id"]}) is not None:
        return str(row["entry_id"])
    nulls = tuple(row[c] is None for c in _SCOPE_COLUMNS)
    query = _SAME_CONTENT.get(nulls)
    if query is None:
        query = _SAME_CONTENT[nulls] = _same_content_query(nulls)
    found = raw.fetchone(conn, query, {
        "p_tenant_id": row["tenant_id"], "p_content_hash": row["content_hash"], "p_scope": row["scope"],
        **{f"p_{c}": row[c] for c in _SCOPE_COLUMNS if row[c] is not None}})
    return None if found is None else str(found[0])



_SCOPE_COLUMNS = ("team_id", "user_id", "session_id")
_ENTRY_EXISTS = sa.select(t.memory_entries.c.id).where(t.memory_entries.c.entry_id == sa.bindparam("p_entry_id"))
#: one prebuilt statement per pattern of NULL scope columns (`= NULL` matches nothing in SQL)
_SAME_CONTENT: dict[tuple[bool, ...], sa.Select[Any]] = {}


def _same_content_query(nulls: tuple[bool, ...]) -> sa.Select[Any]:
    m = t.memory_entries
    scope = [m.c[c].is_(None) if null else m.c[c] == sa.bindparam(f"p_{c}")
             for c, null in zip(_SCOPE_COLUMNS, nulls, strict=True)]
    succeeded = sa.exists().where(t.runs.c.run_id == m.c.source_run_id, t.runs.c.state == "SUCCEEDED")
    return (sa.select(m.c.entry_id)
            .where(m.c.tenant_id == sa.bindparam("p_tenant_id"), m.c.content_hash == sa.bindparam("p_content_hash"),
                   m.c.scope == sa.bindparam("p_scope"), *scope,
                   sa.or_(m.c.source_run_id.is_(None), succeeded))
            .order_by(m.c.id).limit(1))


def _fuse(rankings: Sequence[Sequence[tuple[Any, float]]], k: int) -> list[tuple[Any, float]]:
    scores: dict[str, float] = {}
    rows: dict[str, Any] = {}
    for ranking in rankings:
        for rank, (row, _) in enumerate(ranking):
            scores[row.entry_id] = scores.get(row.entry_id, 0.0) + 1.0 / (RRF_K + rank + 1)
            rows.setdefault(row.entry_id, row)
    best = sorted(scores, key=lambda e: -scores[e])[:k]
    return [(rows[e], scores[e]) for e in best]


def open_memory(mode: Literal["off", "lexical", "semantic"], engine: sa.Engine, clock: Clock,
                secret_filter: SecretFilter) -> MemoryStore | None:
    """The memory store for a configured mode; semantic without the extra installed is a config error."""
    if mode == "off":
        return None
    embedder: Embedder | None = None
    if mode == "semantic":
        from harness.memory.semantic import MiniLMEmbedder, missing_extra

        reason = missing_extra()
        if reason is not None:
            raise InvalidRequestError(reason)
        embedder = MiniLMEmbedder()
    return MemoryStore(engine, clock, secret_filter, embedder)
