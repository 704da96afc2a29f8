"""The knowledge base on SQLite (FTS5), PostgreSQL (full-text) and MariaDB (FULLTEXT): ingestion of Markdown,
plain text and PDF, secret filtering on the way in, scoped search, removal and the refusals."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.knowledge import SqlKnowledgeRows
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.context.secrets import SecretFilter
from harness.domain.chain import content_hash
from harness.domain.errors import DocumentError, InvalidRequestError, UnknownDocumentError
from harness.knowledge.base import KnowledgeBase
from harness.knowledge.scope import KnowledgeScope, KnowledgeScopeError
from tests.knowledge_files import HANDBOOK_MD, SHIPPING_TXT, tiny_pdf

FILTER = SecretFilter()
T1 = KnowledgeScope("t1", ("default",))


@pytest.fixture
def kb(backend_url: str) -> Iterator[KnowledgeBase]:
    """A knowledge base on a fresh, migrated database of the backend under test."""
    store = SqlStore.open(backend_url, FakeClock())
    yield KnowledgeBase(SqlKnowledgeRows(store.engine), store.clock, FILTER)
    store.close()


def engine_of(kb: KnowledgeBase) -> sa.Engine:
    """The database under a knowledge base of these tests."""
    assert isinstance(kb.rows, SqlKnowledgeRows)
    return kb.rows.engine


def files(folder: Path) -> dict[str, Path]:
    """One file of each kind the knowledge base reads."""
    (folder / "handbook.md").write_text(HANDBOOK_MD)
    (folder / "shipping.txt").write_text(SHIPPING_TXT)
    return {"md": folder / "handbook.md", "txt": folder / "shipping.txt",
            "pdf": tiny_pdf(folder / "warranty.pdf", ["Warranty claims need the original receipt.",
                                                      "A warranty lasts two years from delivery."])}


def add_texts(kb: KnowledgeBase, folder: Path, text: str, documents: dict[str, dict[str, str]]) -> None:
    """One text document per name (`<name>.txt`, holding `text` and its name), added to tenant t1 unless
    its options say otherwise (another tenant, knowledge base, agent or team)."""
    for name, options in documents.items():
        path = folder / f"{name}.txt"
        path.write_text(f"{text} ({name})")
        kb.add(path, **{"tenant_id": "t1", **options})


def test_markdown_text_and_pdf_are_cut_into_searchable_chunks(kb: KnowledgeBase, tmp_path: Path) -> None:
    """Each kind is ingested with its sections (heading path, page), and a search finds the right chunk of
    each first, on every backend's full-text search."""
    paths = files(tmp_path)
    added = {kind: kb.add(path, tenant_id="t1", tags=("policy",)) for kind, path in paths.items()}
    assert {kind: a.document.media_type for kind, a in added.items()} == {
        "md": "text/markdown", "txt": "text/plain", "pdf": "application/pdf"}
    assert all(a.stored for a in added.values()) and added["md"].document.chunks == 2
    best = kb.search(T1, "refund of 250 EUR: who approves refunds over 100?", 3)[0]
    assert (best.title, best.section) == ("handbook.md", "Refund policy > Refunds over 100 EUR")
    assert "support lead" in best.content and best.content_hash == content_hash(best.content)
    assert best.source == "handbook.md § Refund policy > Refunds over 100 EUR"
    assert kb.search(T1, "when does my parcel to Norway arrive", 2)[0].title == "shipping.txt"
    pdf = kb.search(T1, "warranty claims receipt", 2)[0]
    assert (pdf.title, pdf.section) == ("warranty.pdf", "page 1") and "original receipt" in pdf.content
    assert [d.title for d in kb.documents("t1", tag="policy")] == ["handbook.md", "shipping.txt", "warranty.pdf"]


def test_the_same_file_twice_is_stored_once(kb: KnowledgeBase, tmp_path: Path) -> None:
    """Adding a file the knowledge base already holds answers with the stored document."""
    path = files(tmp_path)["md"]
    first, again = kb.add(path, tenant_id="t1"), kb.add(path, tenant_id="t1")
    assert (first.stored, again.stored) == (True, False)
    assert again.document.document_id == first.document.document_id
    assert len(kb.documents("t1")) == 1


def test_secrets_never_reach_the_chunks(kb: KnowledgeBase, tmp_path: Path) -> None:
    """A document's text is filtered before it is cut and stored: the chunks hold placeholders."""
    path = tmp_path / "ops.md"
    path.write_text("# Deploying\nDeploy with the key AKIAQ7CANARY4EXAMPLE1 and nothing else.\n")
    added = kb.add(path, tenant_id="t1")
    assert added.document.filtered_secrets == 1
    with engine_of(kb).connect() as conn:
        stored = " ".join(conn.execute(sa.select(t.kb_chunks.c.content)).scalars())
    assert "AKIAQ7CANARY4EXAMPLE1" not in stored and "[REDACTED:aws_key]" in stored


def test_a_search_sees_only_the_callers_tenant_bases_agent_and_team(kb: KnowledgeBase, tmp_path: Path) -> None:
    """Another tenant's, another knowledge base's, another agent's and another team's documents are never
    found; the tenant's shared ones and the caller's own agent's and team's are."""
    add_texts(kb, tmp_path, "Refunds are issued within five days.", {
        "shared": {}, "other-tenant": {"tenant_id": "t2"}, "other-base": {"kb": "drafts"},
        "own-agent": {"agent": "support"}, "other-agent": {"agent": "sales"}, "own-team": {"team_id": "desk"},
        "other-team": {"team_id": "field"}})
    scope = KnowledgeScope("t1", ("default",), agent="support", team_id="desk")
    assert {s.title for s in kb.search(scope, "refunds issued", 10)} == {"shared.txt", "own-agent.txt",
                                                                        "own-team.txt"}
    assert {s.title for s in kb.search(KnowledgeScope("t1", ("default",)), "refunds", 10)} == {"shared.txt"}
    assert kb.search(KnowledgeScope("t1", ()), "refunds", 10) == []
    assert {s.title for s in kb.search(KnowledgeScope("t2", ("default",)), "refunds", 10)} == {"other-tenant.txt"}


def test_each_shape_of_scope_is_searched_with_its_own_values(kb: KnowledgeBase, tmp_path: Path) -> None:
    """A search's statement is built once per shape of scope (an agent or not, a team or not, how many
    knowledge bases) and reused: each search still sees only its own scope's values, whichever shape and
    values came before it."""
    add_texts(kb, tmp_path, "Parcels are traced by their number.", {
        "shared": {}, "drafts": {"kb": "drafts"}, "sales": {"agent": "sales"}, "support": {"agent": "support"},
        "field": {"team_id": "field"}, "desk": {"team_id": "desk"}, "t2": {"tenant_id": "t2"}})

    def found(scope: KnowledgeScope) -> set[str]:
        return {s.title.removesuffix(".txt") for s in kb.search(scope, "parcels traced", 10)}

    for _ in range(2):  # the second round runs every shape again, on statements made in the first
        assert found(KnowledgeScope("t1", ("default", "drafts"))) == {"shared", "drafts"}
        assert found(KnowledgeScope("t1", ("drafts", "default"), agent="sales")) == {"shared", "drafts", "sales"}
        assert found(KnowledgeScope("t1", ("default",), agent="support")) == {"shared", "support"}
        assert found(KnowledgeScope("t1", ("default",), team_id="field")) == {"shared", "field"}
        assert found(KnowledgeScope("t1", ("default",), team_id="desk")) == {"shared", "desk"}
        assert found(KnowledgeScope("t2", ("default",))) == {"t2"}
        assert found(KnowledgeScope("t1", ("drafts",))) == {"drafts"}
    assert len(kb.search(KnowledgeScope("t1", ("default", "drafts"), agent="sales", team_id="desk"),
                         "parcels", 2)) == 2  # at most k


def test_a_chunk_of_another_tenant_is_a_hard_failure(kb: KnowledgeBase) -> None:
    """The row check refuses a foreign chunk (a query bug or a tampered row) instead of filtering it out,
    and the knowledge base passes the refusal on rather than degrading."""
    foreign = SimpleNamespace(chunk_id="x:1", tenant_id="t2", kb="default", agent=None, team_id=None)
    with pytest.raises(KnowledgeScopeError, match="refused"):
        T1.check([foreign])

    class LeakyRows:
        def lexical(self, scope: Any, query: str, k: int) -> list[tuple[Any, float]]:
            return [(foreign, 1.0)]

    leaky = KnowledgeBase(LeakyRows(), FakeClock(), FILTER)  # type: ignore[arg-type]
    with pytest.raises(KnowledgeScopeError):
        leaky.search(T1, "refunds", 3)


def test_removing_a_document_removes_its_chunks_and_only_in_its_tenant(kb: KnowledgeBase, tmp_path: Path) -> None:
    """A document is removed with its chunks; another tenant cannot remove it, and an unknown id is named."""
    doc = kb.add(files(tmp_path)["md"], tenant_id="t1").document
    with pytest.raises(UnknownDocumentError, match="no knowledge-base document"):
        kb.remove("t2", doc.document_id)
    assert kb.search(T1, "refund approval", 3)
    assert kb.remove("t1", doc.document_id) == 2
    assert kb.search(T1, "refund approval", 3) == [] and kb.documents("t1") == []
    with pytest.raises(UnknownDocumentError):
        kb.remove("t1", doc.document_id)


def test_unreadable_empty_and_unknown_files_are_refused_by_name(kb: KnowledgeBase, tmp_path: Path) -> None:
    """A missing file, a folder, an empty file, a file of another kind, a broken PDF and a bad name are
    refused with a message naming the file (or the field); nothing is stored."""
    (tmp_path / "empty.md").write_text("  \n\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a pdf")
    (tmp_path / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "folder.md").mkdir()
    for name, message in (("missing.md", "no such file"), ("folder.md", "not a file"), ("empty.md", "holds no text"),
                          ("image.png", "not a Markdown"), ("broken.pdf", "not a readable PDF"),
                          ("latin.txt", "not UTF-8")):
        with pytest.raises(DocumentError, match=message) as caught:
            kb.add(tmp_path / name, tenant_id="t1")
        assert name in str(caught.value)
    with pytest.raises(InvalidRequestError, match="knowledge base"):
        kb.add_bytes("a.md", b"text", tenant_id="t1", kb="no spaces")
    assert kb.documents("t1") == []


class WordEmbedder:
    """A deterministic stand-in for the semantic extra: each word lights one of 64 dimensions."""

    name = "test-words"
    dim = 64

    def embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype="<f4")
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, hashlib.sha256(word.strip(".,:?").encode()).digest()[0] % self.dim] += 1
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-9)
        return out


def test_with_an_embedder_chunks_are_embedded_and_ranked_by_both(backend_url: str, tmp_path: Path) -> None:
    """With the semantic extra's embedder, ingestion stores each chunk's embedding and a search fuses the
    vector ranking with the lexical one, within the same scope."""
    pytest.importorskip("numpy")
    store = SqlStore.open(backend_url, FakeClock())
    try:
        kb = KnowledgeBase(SqlKnowledgeRows(store.engine), store.clock, FILTER, WordEmbedder())
        kb.add(files(tmp_path)["md"], tenant_id="t1")
        kb.add(files(tmp_path)["md"], tenant_id="t2", kb="default")
        assert kb.mode == "hybrid"
        with store.engine.connect() as conn:
            models = set(conn.execute(sa.select(t.kb_chunks.c.embedding_model)).scalars())
        assert models == {"test-words"}
        found = kb.search(T1, "damaged parcel photo", 2)
        assert found[0].section == "Refund policy > Damaged parcels"
        assert {s.document_id for s in found} <= {d.document_id for d in kb.documents("t1")}
    finally:
        store.close()
