"""Migration 0019 on SQLite, PostgreSQL and MariaDB: on upgrade it links every stored blob to the Runs whose
records name it (blob_refs), and the blobs' DELETE guard opens only for a granted hash; a downgrade shuts
that door again."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql.blobs import record_llm_call
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import head_revision
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.records import NewRun

from .test_migration_0006 import _to, _version

BEFORE = "0018_archived_costs"


def _refs(engine: sa.Engine) -> set[tuple[str, str]]:
    with engine.connect() as conn:
        return {(h, r) for h, r in conn.execute(sa.text("SELECT hash, run_id FROM blob_refs"))}


def test_0019_links_stored_blobs_to_their_runs_and_guards_their_delete(backend_url: str, tmp_path: Path) -> None:
    """Refs written by a Run's LLM exchange are rebuilt by the upgrade from the records alone; an
    ungranted DELETE of a blob is refused, a granted one goes through, and after a downgrade it is refused."""
    store = SqlStore.open(backend_url, FakeClock())
    runs = [store.create_run(NewRun("acme", user, "s1", {"task": "t"}))[0].run_id for user in ("ana", "bo")]
    for run_id in runs:
        record_llm_call(store, run_id, "plan", {"ask": "shared"}, response={"text": f"answer of {run_id}"})
    store.drain_all()
    written = _refs(store.engine)
    assert len(written) == 4 and {r for _, r in written} == set(runs)
    store.close()
    engine = create_engine(resolve_url(backend_url))
    try:
        _to(engine, command.downgrade, BEFORE)
        assert "blob_refs" not in sa.inspect(engine).get_table_names()
        _to(engine, command.upgrade, "head")
        assert _version(engine) == head_revision()
        assert _refs(engine) == written
        shared = next(h for h, r in written if r == runs[0] and (h, runs[1]) in written)
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM blobs WHERE hash = :h"), {"h": shared})
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO blob_grants (hash) VALUES (:h)"), {"h": shared})
            assert conn.execute(sa.text("DELETE FROM blobs WHERE hash = :h"), {"h": shared}).rowcount == 1
            conn.execute(sa.text("DELETE FROM blob_grants"))
        _to(engine, command.downgrade, BEFORE)
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM blobs"))
    finally:
        engine.dispose()
