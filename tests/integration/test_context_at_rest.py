"""A Run's RunContext at rest: on SQLite, which keeps long text in its rows, a long context is stored
compressed (a BLOB) and a short one as text; PostgreSQL and MariaDB keep text (they move long values out
of the row themselves). Every read gives back exactly the context written, whichever form the row holds,
a row written before the change included; a damaged one is named, never read as something else."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.documents import PACK_FROM, pack, unpack
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.domain.chain import canonical_json
from harness.domain.errors import StoreError
from harness.domain.records import NewRun, TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState as S
from harness.settings import Settings

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "fixtures" / "bench_rules.yaml"
#: a context over the packing size: the shape of a finished Run's (plan, steps, pinned manifests)
LONG: dict[str, Any] = {
    "plan": {"steps": [{"id": f"s{i}", "tool_call": {"skill": "orders.lookup", "arguments": {"order_id": i}}}
                       for i in range(12)]},
    "steps": {f"s{i}": {"status": "ok", "output": {"text": "é" * 20, "n": i}} for i in range(12)},
    "manifests": {f"skill.{i}": {"hash": f"{i:064x}", "version": "1.0.0"} for i in range(5)},
}
SHORT: dict[str, Any] = {"plan": None, "steps": {}}


@pytest.fixture
def store(backend_url: str) -> Iterator[SqlStore]:
    s = SqlStore.open(backend_url, FakeClock())
    yield s
    s.close()


def _stored(store: SqlStore, run_id: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.select(t.runs.c.context).where(t.runs.c.run_id == run_id)).scalar_one()


def _executing(store: SqlStore) -> str:
    run, _ = store.create_run(NewRun("acme", "alice", "s", {"task": "t"}))
    machine = StateMachine(store)
    for source, target in ((S.CREATED, S.PREPARING), (S.PREPARING, S.PLANNING), (S.PLANNING, S.POLICY_CHECK),
                           (S.POLICY_CHECK, S.EXECUTING)):
        machine.transition(run.run_id, source, target, actor="test", reason="test")
    return run.run_id


def test_a_context_reads_back_as_written_in_the_form_its_backend_keeps(store: SqlStore, backend: str) -> None:
    """A long context is a compressed BLOB on SQLite (less than half its text) and text elsewhere; a short
    one is text everywhere; both read back equal, through the store and through a transition's write."""
    run_id = _executing(store)
    assert len(canonical_json(LONG).encode()) >= PACK_FROM  # the case under test
    assert store.save_context(run_id, LONG)
    stored = _stored(store, run_id)
    if backend == "sqlite":
        assert isinstance(stored, bytes)
        assert len(stored) < len(canonical_json(LONG).encode()) / 2
        assert zlib.decompress(stored).decode() == canonical_json(LONG)
    else:
        assert stored == canonical_json(LONG)
    assert store.get_run(run_id).context == LONG

    store.save_context(run_id, SHORT)
    assert _stored(store, run_id) == canonical_json(SHORT)
    assert store.get_run(run_id).context == SHORT

    StateMachine(store).transition(run_id, S.EXECUTING, S.TRACING, actor="test", reason="done", context=LONG)
    assert store.get_run(run_id).context == LONG
    assert isinstance(_stored(store, run_id), bytes if backend == "sqlite" else str)


def test_a_started_mark_reads_a_packed_context_and_a_text_one(store: SqlStore) -> None:
    """The non-idempotent step's mark reads the stored context to find the step already reached, whether
    the row holds it compressed or as the text written before the change."""
    run_id = _executing(store)
    reached = {**LONG, "steps": {**LONG["steps"], "note": {"status": "started"}}}
    assert store.mark_step_started(run_id, "note", reached, lease_epoch=None) is None
    assert store.mark_step_started(run_id, "note", reached, lease_epoch=None) == "started"
    with store.engine.begin() as conn:  # the row as a database written before holds it
        conn.execute(t.runs.update().where(t.runs.c.run_id == run_id).values(context=canonical_json(reached)))
    assert store.mark_step_started(run_id, "note", reached, lease_epoch=None) == "started"
    assert store.get_run(run_id).context == reached


def test_a_save_without_a_context_keeps_the_stored_one_and_is_never_fenced_by_itself(store: SqlStore) -> None:
    """Step results saved in a started mark's transaction (which writes the RunContext itself) append their
    records and leave the stored context as it is; asked to fence a write it does not make, the save is
    refused naming why, and writes nothing."""
    run_id = _executing(store)
    store.save_context(run_id, LONG)
    record = TraceRecordIn(kind="tool", payload={"step_id": "s1"}, run_id=run_id, record_id="r-without-context")
    assert store.save_context(run_id, None, [record])
    assert store.get_run(run_id).context == LONG
    store.drain_all()
    assert [r.record_id for r in store.trace_of(run_id) if r.kind == "tool"] == ["r-without-context"]
    with pytest.raises(ValueError, match="no write to fence"):
        store.save_context(run_id, None, [record], lease_epoch=1)


def test_a_damaged_packed_context_is_named(tmp_path: Path) -> None:
    """A BLOB that is not a compressed context (the row was changed outside harness) is an error naming
    the context, not a Run read with some other context."""
    store = SqlStore.open(str(tmp_path / "h.db"), FakeClock())
    run_id = _executing(store)
    with store.engine.begin() as conn:
        conn.execute(t.runs.update().where(t.runs.c.run_id == run_id).values(context=b"\x78\x9c not zlib"))
    with pytest.raises(StoreError, match=f"Run {run_id}'s stored context is damaged: its compressed form"):
        store.get_run(run_id)
    with store.engine.begin() as conn:
        conn.execute(t.runs.update().where(t.runs.c.run_id == run_id).values(context='{"plan": '))
    with pytest.raises(StoreError, match=f"Run {run_id}'s stored context is damaged: its text form"):
        store.get_run(run_id)
    store.close()


def test_pack_and_unpack() -> None:
    text = canonical_json(LONG)
    assert pack(text, packs=False) == text
    assert isinstance(pack(text, packs=True), bytes)
    assert pack(canonical_json(SHORT), packs=True) == canonical_json(SHORT)
    assert unpack(pack(text, packs=True)) == LONG
    assert unpack(memoryview(pack(text, packs=True))) == LONG  # type: ignore[arg-type]
    assert unpack(text) == LONG
    assert unpack(None) is None


def test_a_finished_example_run_on_sqlite_keeps_its_context_packed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled example's finished Run: its row holds the context compressed, and its RunContext,
    its result and its replay-relevant parts read back whole."""
    from harness.examples.support import EXAMPLE_DIR

    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = build_runtime(Settings(db=str(tmp_path / "ex.db"), data_dir=tmp_path / "data", llm_rules=BENCH,
                                identities_file=EXAMPLE_DIR / "identities.yaml"))
    try:
        result = rt.runs.create_run({"task": "bench A-1001", "user_id": "alice", "roles": ["support_agent"]})
        assert result.state == "SUCCEEDED"
        stored = _stored(rt.store, result.run_id)
        assert isinstance(stored, bytes)
        context = rt.store.get_run(result.run_id).context
        assert context is not None and unpack(stored) == context
        assert set(context["steps"]) == {"lookup", "customer", "note"}
        assert "orders.lookup" in context["manifests"]
    finally:
        rt.close()
