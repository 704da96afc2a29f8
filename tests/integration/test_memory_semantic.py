"""Semantic memory, the optional `[semantic]` extra: a bundled MiniLM model and exact vector search (C2).

Skipped, with the install command as the reason, when the extra is not installed — or failed instead
under HARNESS_REQUIRE_SEMANTIC=1 (CI, where a silent skip would hide that one mode went untested).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.memory import SqlMemoryRows
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.context.secrets import SecretFilter
from harness.memory.scope import MemoryScope
from harness.memory.semantic import DIM, MiniLMEmbedder, missing_extra
from harness.memory.store import MemoryStore, NewMemory
from harness.settings import Settings

MISSING = missing_extra()
REQUIRED = os.environ.get("HARNESS_REQUIRE_SEMANTIC") == "1"
pytestmark = pytest.mark.skipif(MISSING is not None and not REQUIRED, reason=str(MISSING))

ALICE = MemoryScope("t1", "alice", "s1")
NOTES = (("refund", "Refunds for damaged parcels are issued as store credit"),
         ("carrier", "Orders to Austria ship with DHL and arrive in three days"),
         ("address", "Alice moved house; deliveries now go to Vienna"))
PARAPHRASE = "How do I get my money back for a broken item?"


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    """One model load for the module (a few seconds on the CPU)."""
    if MISSING is not None:
        pytest.fail(f"HARNESS_REQUIRE_SEMANTIC=1 but {MISSING}")
    model = MiniLMEmbedder()
    model.embed(["warm up"])
    return model


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    """A migrated SQLite database."""
    s = SqlStore.open(str(tmp_path / "sem.db"), FakeClock())
    yield s
    s.close()


def test_embeddings_are_unit_float32_vectors_of_the_model(embedder: MiniLMEmbedder) -> None:
    """The bundled model loads offline and gives 384-dimensional unit vectors."""
    vectors = embedder.embed(["hello", "refund for a broken parcel"])
    assert vectors.shape == (2, DIM) and str(vectors.dtype) == "float32"
    assert abs(float((vectors[0] ** 2).sum()) - 1.0) < 1e-4


def test_vector_recall_finds_a_paraphrase_that_lexical_recall_misses(store: SqlStore,
                                                                     embedder: MiniLMEmbedder) -> None:
    """No shared word, same meaning: lexical finds nothing, vector and hybrid recall rank it first."""
    memory = MemoryStore(SqlMemoryRows(store.engine), store.clock, SecretFilter(), embedder)
    memory.add([NewMemory("t1", "user", text, user_id="alice", entry_id=key) for key, text in NOTES])
    assert memory.recall(ALICE, PARAPHRASE, 3, mode="lexical") == []
    assert memory.recall(ALICE, PARAPHRASE, 3, mode="vector")[0].entry_id == "refund"
    assert memory.recall(ALICE, PARAPHRASE, 3)[0].entry_id == "refund"  # hybrid is the default
    with store.engine.connect() as conn:
        blob = conn.execute(sa.select(t.memory_entries.c.embedding).limit(1)).scalar_one()
    assert len(blob) == DIM * 4


def test_vector_recall_stays_inside_the_callers_scope(store: SqlStore, embedder: MiniLMEmbedder) -> None:
    """Another user's and another tenant's identical entries are never candidates for scoring."""
    memory = MemoryStore(SqlMemoryRows(store.engine), store.clock, SecretFilter(), embedder)
    text = NOTES[0][1]
    memory.add([NewMemory("t1", "user", text, user_id="bob", entry_id="bob"),
                NewMemory("t2", "user", text, user_id="alice", entry_id="t2-alice"),
                NewMemory("t1", "user", "Alice likes tea", user_id="alice", entry_id="own")])
    assert [r.entry_id for r in memory.recall(ALICE, PARAPHRASE, 5, mode="vector")] == ["own"]


def test_entries_stored_before_the_extra_are_backfilled(store: SqlStore, embedder: MiniLMEmbedder) -> None:
    """Entries written in lexical mode get embeddings by backfill and are then found by meaning."""
    MemoryStore(SqlMemoryRows(store.engine), store.clock, SecretFilter()).add(
        [NewMemory("t1", "user", text, user_id="alice", entry_id=key) for key, text in NOTES])
    memory = MemoryStore(SqlMemoryRows(store.engine), store.clock, SecretFilter(), embedder)
    assert memory.recall(ALICE, PARAPHRASE, 3, mode="vector") == []
    assert memory.backfill_embeddings() == len(NOTES)
    assert memory.recall(ALICE, PARAPHRASE, 3, mode="vector")[0].entry_id == "refund"


def test_a_runtime_in_semantic_mode_recalls_by_meaning(tmp_path: Path, embedder: MiniLMEmbedder,
                                                        call_log: Path) -> None:
    """HARNESS_MEMORY=semantic wires the model into the assembler; a Run's context holds the paraphrase."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    rt = build_runtime(Settings(db=str(tmp_path / "rt.db"), skills_dirs=(fixtures / "skills",),
                                policy_file=fixtures / "policy.yaml", llm_rules=fixtures / "llm_rules.yaml",
                                identities_file=fixtures / "identities.yaml", data_dir=tmp_path / "data",
                                memory="semantic"), clock=FakeClock())
    try:
        memory = rt.runs.assembler.memory
        assert memory is not None and memory.mode == "hybrid"
        memory.embedder = embedder  # the module's loaded model: one load per module keeps this file fast
        memory.add([NewMemory("t1", "user", NOTES[0][1], user_id="tess", entry_id="refund")])
        result = rt.runs.create_run({"task": f"echo {PARAPHRASE}", "tenant_id": "t1", "user_id": "tess",
                                     "roles": ["tester"]})
        assert result.state == "SUCCEEDED"
        context = rt.runs.assembled_context(result.run_id)
        assert list(context.memory_ids) == ["refund"] and context.recall_mode == "hybrid"
    finally:
        rt.close()
