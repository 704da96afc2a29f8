"""Knowledge-base snippets in a Run's context, on SQLite, PostgreSQL and MariaDB: the support example's refund
answer cites its policy handbook, the trace names the chunks the model was given (id and content hash), and a
chunk of another tenant fails the Run instead of reaching the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.config import Runtime, build_runtime
from harness.domain.chain import content_hash
from harness.examples.support import HANDBOOK_KB, handbook_files
from harness.kernel.states import RunState
from harness.settings import Settings

REFUND = "Refund 42.50 EUR for order A-1001"
CITATION = "Policy [refund-policy.md § Refund policy > Refunds up to 100 EUR]: A support agent may refund up to 100 EUR"


@pytest.fixture
def rt(backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """The support example on the backend under test, its handbook in the default tenant's `handbook` base."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    runtime = build_runtime(Settings(db=backend_url, data_dir=tmp_path / "data"))
    assert runtime.knowledge is not None
    runtime.knowledge.add_files(handbook_files(), tenant_id="default", kb=HANDBOOK_KB)
    yield runtime
    runtime.close()


def refund(rt: Runtime, user: str = "alice", tenant: str = "default") -> Any:
    """The example's self-confirmed refund, confirmed by its requester; the final result."""
    result = rt.runs.create_run({"task": REFUND, "user_id": user, "tenant_id": tenant})
    assert result.approval_request_id, result
    _, result = rt.runs.decide(result.approval_request_id, rt.identities.resolve(f"{tenant}/{user}"), "approve",
                               reason="test")
    return result


def context_record(rt: Runtime, run_id: str) -> dict[str, Any]:
    """The Run's one `context` trace record."""
    rt.store.drain_all()
    found = [r.data() for r in rt.store.trace_of(run_id) if r.kind == "context"]
    assert len(found) == 1, found
    return found[0]


def test_the_refund_answer_cites_the_handbook_and_the_trace_names_the_chunk(rt: Runtime) -> None:
    """The answer quotes the handbook's snippet by its source; the trace lists every chunk the model was
    given, and the cited one's content hash is the stored chunk's."""
    result = refund(rt)
    assert result.state == RunState.SUCCEEDED.value and CITATION in (result.answer or "")
    record = context_record(rt, result.run_id)
    given = record["knowledge"]
    assert record["knowledge_mode"] == "lexical" and given
    cited = next(c for c in given if c["source"] == "refund-policy.md § Refund policy > Refunds up to 100 EUR")
    assert rt.knowledge is not None
    stored = rt.knowledge.rows.chunks("default", [cited["chunk_id"]])
    assert [(s.chunk_id, s.content_hash) for s in stored] == [(cited["chunk_id"], cited["content_hash"])]
    assert content_hash(stored[0].content) == cited["content_hash"]
    assert sum(c["tokens"] for c in given) <= record["tokens_used"] <= record["token_budget"]


def test_a_run_given_snippets_replays_without_divergence(rt: Runtime) -> None:
    """The replay's database is seeded with the tenant's documents of the time, so the model's request holds
    the same snippets and the cited answer replays unchanged."""
    from harness.replay.runner import replay

    result = refund(rt)
    report = replay(result.run_id, rt.store, rt.settings)
    assert report.ok, report.divergences


def test_another_tenant_is_given_none_of_the_handbook(rt: Runtime) -> None:
    """The handbook belongs to the default tenant: acme's refund is answered without it, and its trace names
    no chunk."""
    result = refund(rt, user="zoe", tenant="acme")
    assert result.state == RunState.SUCCEEDED.value and "Policy [" not in (result.answer or "")
    assert context_record(rt, result.run_id)["knowledge"] == []


def test_a_chunk_of_another_tenant_fails_the_run_before_the_model(rt: Runtime,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A search that returns another tenant's chunk (a query bug or a tampered row) fails the Run in PREPARING
    with a knowledge_scope_violation; the model is never called."""
    assert rt.knowledge is not None
    foreign = SimpleNamespace(chunk_id="x:1", document_id="x", tenant_id="acme", kb=HANDBOOK_KB, agent=None,
                              team_id=None, section="", content="acme's secret policy", content_hash="0" * 64,
                              title="acme.md")
    monkeypatch.setattr(rt.knowledge.rows, "lexical", lambda scope, query, k: [(foreign, 1.0)])
    result = rt.runs.create_run({"task": REFUND, "user_id": "alice"})
    assert result.state == RunState.CLOSED_FAILED.value
    rt.store.drain_all()
    kinds = [(r.kind, r.data().get("error_code")) for r in rt.store.trace_of(result.run_id)]
    assert ("error", "knowledge_scope_violation") in kinds and not any(kind == "llm" for kind, _ in kinds)


def test_the_python_api_manages_the_knowledge_bases_a_run_reads(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`Harness.knowledge`: the handbook added through the library reaches the refund's context (the answer
    cites it), is listed and removed by id; a file of another kind and an unknown id are refused by name and
    store or remove nothing."""
    from harness import Harness
    from harness.domain.errors import DocumentError, UnknownDocumentError

    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    with Harness(db=str(tmp_path / "h.db"), data_dir=tmp_path / "data") as h:
        added = h.knowledge.add_files(handbook_files(), tenant_id="default", kb=HANDBOOK_KB, tags=["policy"])
        assert added and all(a.stored for a in added)
        assert [d.document_id for d in h.knowledge.documents("default", tag="policy")] == \
            [a.document.document_id for a in added]
        with pytest.raises(DocumentError, match=r"notes\.docx"):
            h.knowledge.add_bytes("notes.docx", b"PK\x03\x04", tenant_id="default", kb=HANDBOOK_KB)
        with pytest.raises(UnknownDocumentError):
            h.knowledge.remove("default", "no-such-document")
        assert len(h.knowledge.documents("default")) == len(added)

        run = h.run(REFUND, user="alice")
        assert run.approval_request_id, run
        done = h.approve(run.approval_request_id, as_="alice", reason="mine").run
        assert done.state == RunState.SUCCEEDED.value and CITATION in (done.answer or "")
        context = next(e.data for e in h.trace(done.run_id) if e.kind == "context")
        assert any(c["source"].startswith("refund-policy.md") for c in context["knowledge"])

        for a in added:
            assert h.knowledge.remove("default", a.document.document_id) == a.document.chunks
        assert h.knowledge.documents("default") == []
        again = h.run(REFUND, user="alice")  # nothing left to cite: the answer stands without the policy
        assert again.approval_request_id
        assert CITATION not in (h.approve(again.approval_request_id, as_="alice").run.answer or "")
