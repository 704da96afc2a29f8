"""The knowledge base: tenant documents in, ranked chunks out.

`add` reads a file (harness.knowledge.files), removes secrets from its text before anything is stored (the
same filter as every context), cuts it into chunks and stores the document with its chunks in one
transaction; the same file added again to the same knowledge base is not stored twice. `search` ranks the
chunks a scope may read: lexically by default (SQLite FTS5, PostgreSQL full-text, an exact BM25 elsewhere),
fused with a vector ranking when an embedder (the `[semantic]` extra) is set. Every search is confined to the
scope in SQL and checked row by row afterwards (KnowledgeScopeError); any other failure is a RecallError,
which the context assembler turns into "no snippets", traced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePath
from typing import Any, Literal, Protocol

from harness.context.errors import RecallError, ScopeViolationError
from harness.context.secrets import SecretFilter
from harness.domain.chain import content_hash
from harness.domain.errors import DocumentError, InvalidRequestError, UnknownDocumentError
from harness.domain.ids import ordered_id
from harness.knowledge.files import Chunk, Section, chunks_of, read_file, sections_of
from harness.knowledge.scope import KnowledgeScope
from harness.memory.semantic import Embedder, embedder_for, fuse, to_blob, top_k
from harness.ports import Clock
from harness.ports.knowledge import KnowledgeRows

Mode = Literal["lexical", "hybrid"]
#: a knowledge base's name, an agent's name, a tag: what the CLI, the API and agent files accept
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
DEFAULT_KB = "default"
MAX_TAGS = 16


@dataclass(frozen=True)
class Document:
    """A stored document: where it belongs, what it was, and how it was cut."""

    document_id: str
    tenant_id: str
    kb: str
    agent: str | None
    team_id: str | None
    title: str
    media_type: str
    tags: tuple[str, ...]
    content_hash: str
    chunks: int
    chars: int
    filtered_secrets: int
    created_at: float

    @classmethod
    def of(cls, row: Any) -> Document:
        """A document from a `kb_documents` row."""
        return cls(row.document_id, row.tenant_id, row.kb, row.agent, row.team_id, row.title, row.media_type,
                   tuple(json.loads(row.tags or "[]")), row.content_hash, int(row.chunks), int(row.chars),
                   int(row.filtered_secrets), float(row.created_at))

    def to_dict(self) -> dict[str, Any]:
        """The document as the CLI and the API show it."""
        return {**asdict(self), "tags": list(self.tags)}


@dataclass(frozen=True)
class Added:
    """What `add` did with one file: the document, and whether it was stored now (False: it already was)."""

    document: Document
    stored: bool

    def to_dict(self) -> dict[str, Any]:
        """The outcome as the CLI and the API show it."""
        return {**self.document.to_dict(), "stored": self.stored}


@dataclass(frozen=True)
class Snippet:
    """A chunk found for a query: what the model reads, where it comes from, and its score."""

    chunk_id: str
    document_id: str
    kb: str
    title: str
    section: str
    content: str
    content_hash: str
    score: float

    @property
    def source(self) -> str:
        """How the model is told to cite it: the document's title and the section."""
        return f"{self.title} § {self.section}" if self.section else self.title


def checked_name(value: str, what: str) -> str:
    """`value` when it is a valid name (letters, digits, `_.-`, at most 64); InvalidRequestError otherwise."""
    if not NAME.match(value):
        raise InvalidRequestError(f"{what}: {value!r} is not a name (letters, digits, '_', '.', '-'; at most 64)")
    return value


@dataclass(frozen=True)
class _Where:
    """Where a document goes: tenant, knowledge base, tags, and optionally one agent or one team."""

    tenant_id: str
    kb: str
    tags: tuple[str, ...]
    agent: str | None
    team_id: str | None

    def __post_init__(self) -> None:
        for value, what in ((self.agent, "agent"), (self.team_id, "team")):
            if value is not None:
                checked_name(value, what)


@dataclass(frozen=True)
class _Prepared:
    where: _Where
    title: str
    media_type: str
    chunks: list[Chunk]
    secrets: int


def _names(tags: Sequence[str]) -> tuple[str, ...]:
    unique = tuple(dict.fromkeys(checked_name(tag, "tag") for tag in tags))
    if len(unique) > MAX_TAGS:
        raise InvalidRequestError(f"tags: {len(unique)}; at most {MAX_TAGS}")
    return unique


class KnowledgeBase:
    """Tenant documents over the knowledge-base tables (the KnowledgeRows port)."""

    def __init__(self, rows: KnowledgeRows, clock: Clock, secret_filter: SecretFilter,
                 embedder: Embedder | None = None) -> None:
        self.rows = rows
        self.clock = clock
        self.filter = secret_filter
        self.embedder = embedder

    @property
    def mode(self) -> Mode:
        """The ranking: hybrid with an embedder, lexical without."""
        return "hybrid" if self.embedder is not None else "lexical"

    def add(self, path: str | Path, *, tenant_id: str, kb: str = DEFAULT_KB, tags: Sequence[str] = (),
            agent: str | None = None, team_id: str | None = None) -> Added:
        """Ingest one file (Markdown, plain text or PDF); DocumentError naming it when it cannot be."""
        return self.add_files([path], tenant_id=tenant_id, kb=kb, tags=tags, agent=agent, team_id=team_id)[0]

    def add_files(self, paths: Sequence[str | Path], *, tenant_id: str, kb: str = DEFAULT_KB,
                  tags: Sequence[str] = (), agent: str | None = None, team_id: str | None = None) -> list[Added]:
        """Ingest files: every one is read and cut first, so a file that cannot be ingested (DocumentError
        naming it) leaves all of them unstored."""
        where = _Where(tenant_id, checked_name(kb, "knowledge base"), _names(tags), agent, team_id)
        ready = [self._prepare(Path(p).name, read_file(Path(p)), where) for p in paths]
        return [self._store(document) for document in ready]

    def add_bytes(self, name: str, data: bytes, *, tenant_id: str, kb: str = DEFAULT_KB, tags: Sequence[str] = (),
                  agent: str | None = None, team_id: str | None = None) -> Added:
        """Ingest a file's bytes under its name (its suffix says its kind: .md, .txt or .pdf)."""
        where = _Where(tenant_id, checked_name(kb, "knowledge base"), _names(tags), agent, team_id)
        return self._store(self._prepare(name, data, where))

    def _prepare(self, name: str, data: bytes, where: _Where) -> _Prepared:
        """The document's chunks, secrets removed, ready to store; DocumentError when there are none."""
        title = PurePath(name).name[:256]
        if not title:
            raise DocumentError("a document needs a file name (its suffix says its kind: .md, .txt or .pdf)")
        media_type, sections = sections_of(title, data)
        found, clean = 0, []
        for section in sections:  # secrets go before anything is cut, hashed or stored
            scrubbed = self.filter.scrub(section.text)
            found += scrubbed.count
            clean.append(Section(section.where, scrubbed.text))
        chunks = chunks_of(clean)
        if not chunks:
            raise DocumentError(f"{title}: holds no text")
        return _Prepared(where, title, media_type, chunks, found)

    def _store(self, ready: _Prepared) -> Added:
        where, chunks = ready.where, ready.chunks
        digest = content_hash([[c.section, c.text] for c in chunks])
        existing = self.rows.same_document(where.tenant_id, where.kb, ready.title, digest)
        if existing is not None:
            return Added(next(d for d in self.documents(where.tenant_id, where.kb) if d.document_id == existing),
                         False)
        now, document_id = self.clock.now(), ordered_id()
        scope = {"tenant_id": where.tenant_id, "kb": where.kb, "agent": where.agent, "team_id": where.team_id}
        document = {"document_id": document_id, **scope, "title": ready.title, "media_type": ready.media_type,
                    "tags": json.dumps(list(where.tags)), "content_hash": digest, "chunks": len(chunks),
                    "chars": sum(len(c.text) for c in chunks), "filtered_secrets": ready.secrets, "created_at": now}
        rows: list[dict[str, Any]] = [
            {"chunk_id": f"{document_id}:{seq}", "document_id": document_id, **scope, "seq": seq,
             "section": chunk.section[:256], "content": chunk.text, "content_hash": content_hash(chunk.text),
             "created_at": now, "embedding": None, "embedding_model": None}
            for seq, chunk in enumerate(chunks, start=1)]
        if self.embedder is not None:
            vectors = self.embedder.embed([f"{r['section']}\n{r['content']}" for r in rows])
            for row, vector in zip(rows, vectors, strict=True):
                row.update(embedding=to_blob(vector), embedding_model=self.embedder.name)
        self.rows.insert_document(document, rows)
        return Added(Document.of(_Row(document)), True)

    def documents(self, tenant_id: str, kb: str | None = None, tag: str | None = None) -> list[Document]:
        """The tenant's documents, oldest first (of one knowledge base, with one tag, when given)."""
        return [Document.of(row) for row in self.rows.documents(tenant_id, kb, tag)]

    def remove(self, tenant_id: str, document_id: str) -> int:
        """Delete a document of the tenant with its chunks; how many chunks. UnknownDocumentError when the
        tenant has no such document (another tenant's is not touched, and looks the same)."""
        removed = self.rows.remove_document(tenant_id, document_id)
        if removed is None:
            raise UnknownDocumentError(document_id, tenant_id)
        return removed

    def search(self, scope: KnowledgeScope, query: str, k: int) -> list[Snippet]:
        """The `k` chunks of `scope` that best match `query`, best first.

        KnowledgeScopeError if a row outside the scope comes back; RecallError for any other failure.
        """
        if k <= 0 or not query.strip() or not scope.bases:
            return []
        try:
            ranked = self.rows.lexical(scope, query, k if self.embedder is None else 4 * k)
            if self.embedder is not None:
                vector = self.embedder.embed([query])[0]
                by_meaning = top_k(vector, self.rows.embedded(scope, self.embedder.name), 4 * k)
                ranked = fuse([ranked, by_meaning], k, key=lambda row: row.chunk_id)
        except ScopeViolationError:
            raise
        except Exception as exc:  # database, index or model failure: the caller degrades to no snippets
            raise RecallError(f"knowledge search failed: {type(exc).__name__}: {exc}") from exc
        scope.check([row for row, _ in ranked])
        return [Snippet(r.chunk_id, r.document_id, r.kb, r.title, r.section, r.content, r.content_hash, score)
                for r, score in ranked[:k]]


class _Row:
    """A dict's keys as attributes, for `Document.of` on a row not read back from the database."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:  # pragma: no cover - every column is set
        raise AttributeError(name)


class KnowledgeSearch(Protocol):
    """What the context assembler asks of a knowledge base: its ranking's name, and the best chunks."""

    @property
    def mode(self) -> str: ...

    def search(self, scope: KnowledgeScope, query: str, k: int) -> list[Snippet]: ...


class RecordedSearch:
    """The search of a replay: whatever it is asked, the chunks the Run's trace says it was given, in that
    order, read from the replay's copy of the tenant's documents. A chunk removed since is missing, so the
    model's request differs from the recording: a divergence, not a silent substitute."""

    def __init__(self, knowledge: KnowledgeBase, chunk_ids: Sequence[str]) -> None:
        self.knowledge = knowledge
        self.chunk_ids = list(chunk_ids)

    @property
    def mode(self) -> str:
        """The ranking the replayed Run's knowledge base uses."""
        return self.knowledge.mode

    def search(self, scope: KnowledgeScope, query: str, k: int) -> list[Snippet]:
        """The recorded chunks (of the caller's scope, checked), best first as recorded."""
        rows = {r.chunk_id: r for r in self.knowledge.rows.chunks(scope.tenant_id, self.chunk_ids)}
        scope.check(list(rows.values()))
        ranked = [rows[c] for c in self.chunk_ids if c in rows]
        return [Snippet(r.chunk_id, r.document_id, r.kb, r.title, r.section, r.content, r.content_hash,
                        1.0 / rank) for rank, r in enumerate(ranked[:k], start=1)]


def open_knowledge(mode: Literal["off", "lexical", "semantic"], rows: KnowledgeRows, clock: Clock,
                   secret_filter: SecretFilter) -> KnowledgeBase | None:
    """The knowledge base for a configured mode; semantic without the extra installed is a config error."""
    if mode == "off":
        return None
    return KnowledgeBase(rows, clock, secret_filter, embedder_for(mode))
