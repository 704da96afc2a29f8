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

from harness.context.errors import RecallError, ScopeViolationError
from harness.context.secrets import SecretFilter
from harness.domain.chain import content_hash
from harness.domain.ids import ordered_id
from harness.memory.scope import LEVELS, MemoryScope, ScopeLevel
from harness.memory.semantic import Embedder, embedder_for, fuse, to_blob, top_k
from harness.ports import Clock
from harness.ports.memory import MemoryRows

Mode = Literal["lexical", "vector", "hybrid"]
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
    """Scoped memory over the memory table (the MemoryRows port: SQLite, PostgreSQL or MySQL/MariaDB)."""

    def __init__(self, rows: MemoryRows, clock: Clock, secret_filter: SecretFilter,
                 embedder: Embedder | None = None) -> None:
        self.rows = rows
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
        stored = self.rows.same_content(rows)  # read first: embedding must not hold the database's write lock
        kept: dict[tuple[Any, ...], str] = {}  # (scope, content hash) -> id, for this call's own entries
        for row, existing in zip(rows, stored, strict=True):
            key = (*_scope_key(row), row["content_hash"])
            same = kept.get(key) or existing
            if same is None:
                fresh.append(row)
                same = kept[key] = row["entry_id"]
            ids.append(same)
        if fresh and self.embedder is not None:
            for row, vector in zip(fresh, self.embedder.embed([r["content"] for r in fresh]), strict=True):
                row.update(embedding=to_blob(vector), embedding_model=self.embedder.name)
        if fresh:
            self.rows.insert_new(fresh)
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
            fetch = 2 * k
            while True:  # copies of one content (stored before write-back deduplicated) count once
                ranked = self._rank(scope, query, fetch, mode)
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

    def _rank(self, scope: MemoryScope, query: str, k: int, mode: Mode) -> list[tuple[Any, float]]:
        if mode == "lexical":
            return self.rows.lexical(scope, query, k)
        vector = self._vector(scope, query, k if mode == "vector" else 4 * k)
        if mode == "vector":
            return vector
        return fuse([self.rows.lexical(scope, query, 4 * k), vector], k, key=lambda row: row.entry_id)

    def _vector(self, scope: MemoryScope, query: str, k: int) -> list[tuple[Any, float]]:
        if self.embedder is None:
            raise RecallError("vector recall needs an embedder (the [semantic] extra)")
        return top_k(self.embedder.embed([query])[0], self.rows.embedded(scope, self.embedder.name), k)

    def backfill_embeddings(self, batch: int = 256) -> int:
        """Embed entries stored without an embedding (before the extra was installed); returns how many."""
        embedder = self.embedder
        if embedder is None:
            return 0

        def embed(texts: list[str]) -> list[bytes]:
            return [to_blob(vector) for vector in embedder.embed(texts)]

        done = 0
        while True:
            n = self.rows.backfill(batch, embed, embedder.name)
            if n == 0:
                return done
            done += n

    def entries_of_run(self, run_id: str) -> list[str]:
        """Ids of the entries a Run wrote back."""
        return self.rows.entries_of_run(run_id)

    def forget_user(self, tenant_id: str, user_id: str) -> int:
        """Delete every entry of a user (their user and session scopes); returns how many."""
        return self.rows.forget_user(tenant_id, user_id)


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


def open_memory(mode: Literal["off", "lexical", "semantic"], rows: MemoryRows, clock: Clock,
                secret_filter: SecretFilter) -> MemoryStore | None:
    """The memory store for a configured mode; semantic without the extra installed is a config error."""
    if mode == "off":
        return None
    return MemoryStore(rows, clock, secret_filter, embedder_for(mode))
