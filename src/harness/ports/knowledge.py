"""The port of the knowledge-base tables: documents and their chunks, in rows.

A document row has the `kb_documents` columns as attributes (document_id, tenant_id, kb, agent, team_id,
title, media_type, tags, content_hash, chunks, chars, filtered_secrets, created_at); a chunk row the
`kb_chunks` columns (chunk_id, document_id, tenant_id, kb, agent, team_id, seq, section, content,
content_hash) and the document's title (and embedding for `embedded`). Every read of chunks is confined to
the caller's scope by the adapter (in SQL), and the knowledge base checks each returned row again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class KnowledgeScope(Protocol):
    """Which chunks a search may see (harness.knowledge.scope.KnowledgeScope): the caller's tenant, the
    knowledge bases its agent may read, and documents of every agent and team or of its own."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def bases(self) -> tuple[str, ...]: ...

    @property
    def agent(self) -> str | None: ...

    @property
    def team_id(self) -> str | None: ...


class KnowledgeRows(Protocol):
    """Knowledge-base documents and chunks in a database."""

    def same_document(self, tenant_id: str, kb: str, title: str, content_hash: str) -> str | None:
        """The id of a document of this tenant and knowledge base with this title and content, or None."""
        ...

    def insert_document(self, document: dict[str, Any], chunks: Sequence[dict[str, Any]]) -> None:
        """Store a document and its chunks in one transaction."""
        ...

    def documents(self, tenant_id: str, kb: str | None = None, tag: str | None = None) -> list[Any]:
        """The tenant's documents (of one knowledge base, with one tag, when given), oldest first."""
        ...

    def remove_document(self, tenant_id: str, document_id: str) -> int | None:
        """Delete a document of the tenant and its chunks in one transaction; how many chunks, or None when
        the tenant has no document with this id."""
        ...

    def lexical(self, scope: KnowledgeScope, query: str, k: int) -> list[tuple[Any, float]]:
        """The best `k` (chunk row, score) pairs for `query` within `scope`; higher score is better."""
        ...

    def embedded(self, scope: KnowledgeScope, model: str) -> list[Any]:
        """The chunk rows of `scope` embedded by `model`, with their embedding."""
        ...

    def chunks(self, tenant_id: str, chunk_ids: Sequence[str]) -> list[Any]:
        """The tenant's chunks with these ids (an auditor's look at what a Run was given)."""
        ...
