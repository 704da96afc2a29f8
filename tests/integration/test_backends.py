"""The same code on SQLite, PostgreSQL and MariaDB (SPEC D2, D3, A2, K4): migrations, append-only
triggers, the compare-and-set, exact text and time round-trips, concurrent drainers and a full Run."""

from __future__ import annotations

import multiprocessing as mp
import threading
import traceback
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.blobs import blobs
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import MIGRATIONS_DIR, head_revision, migrate
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import reconcile
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.domain.chain import canonical_json
from harness.domain.contracts import CallerIdentity
from harness.domain.records import NewRun, TraceRecordIn
from harness.kernel.states import RunState
from harness.settings import Settings

from ..acceptance.checks import assert_audit_clean
from ..conftest import FIXTURES

APPEND_ONLY = (*t.APPEND_ONLY, "blobs")
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def _alembic(conn: sa.Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = conn
    return cfg


def _tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def _new_run(store: SqlStore, tenant: str = "t1", key: str | None = None) -> str:
    run, _created = store.create_run(NewRun(tenant, "u1", "s1", {"task": "x"}, idempotency_key=key))
    return run.run_id


def test_migrations_upgrade_downgrade_and_upgrade_again(empty_backend_url: str) -> None:
    """Every migration, 0001 to the newest, applies to an empty database, reverts cleanly and re-applies."""
    engine = create_engine(resolve_url(empty_backend_url))
    try:
        migrate(engine)
        with engine.connect() as conn:
            version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
        assert version == head_revision()
        expected = set(t.metadata.tables) | {"alembic_version"}
        assert expected <= _tables(engine)
        with engine.begin() as conn:
            command.downgrade(_alembic(conn), "base")
        assert _tables(engine) - {"alembic_version", "sqlite_sequence"} == set()
        migrate(engine)
        assert expected <= _tables(engine)
        store = SqlStore(engine, FakeClock())
        assert store.chain_head() == (0, "0" * 64)
    finally:
        engine.dispose()


def _fill_append_only(store: SqlStore) -> None:
    """At least one row in every append-only table (row triggers fire only for existing rows)."""
    run_id = _new_run(store)
    store.transition(run_id, RunState.CREATED, RunState.PREPARING, actor="test", reason="fill")
    store.drain_all()
    now = store.clock.now()
    with store.engine.begin() as conn:
        conn.execute(t.costs.insert(), {"run_id": run_id, "tenant_id": "t1", "user_id": "u1", "source": "llm",
                                        "input_tokens": 1, "output_tokens": 1, "usd": 0.5, "at": now})
        conn.execute(t.hitl_decisions.insert(), {
            "decision_id": "d1", "request_id": "r1", "run_id": run_id, "approver": "a", "decision": "approve",
            "actions_hash": "0" * 64, "break_glass": False, "reason": "ok", "outcome": "accepted", "at": now})
        conn.execute(t.hitl_approvals.insert(), {"request_id": "r1", "approver": "a", "decision_id": "d1", "at": now})
        conn.execute(blobs.insert(), {"hash": "f" * 64, "content": "{}"})


def _count(store: SqlStore, table: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def test_append_only_tables_refuse_update_delete_truncate(backend_url: str) -> None:
    """UPDATE, DELETE and TRUNCATE on every append-only table fail inside the database itself (A2)."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        _fill_append_only(store)
        for table in APPEND_ONLY:
            before = _count(store, table)
            assert before > 0, table
            column = {"blobs": "hash", "hitl_approvals": "approver"}.get(table, "run_id")
            statements = [f"UPDATE {table} SET {column} = {column}", f"DELETE FROM {table}"]
            if store.engine.dialect.name != "sqlite":  # SQLite has no TRUNCATE: DELETE without WHERE is it
                statements.append(f"TRUNCATE TABLE {table}")
            for statement in statements:
                with pytest.raises(sa.exc.DBAPIError), store.engine.begin() as conn:
                    conn.execute(sa.text(statement))
            assert _count(store, table) == before, table
    finally:
        store.close()


def test_update_counts_matched_rows(backend_url: str) -> None:
    """An UPDATE that matches a row but changes nothing still counts it, so a compare-and-set or a
    heartbeat at an unchanged time is never mistaken for a lost race (MySQL counts changed rows
    unless the connection asks for found rows)."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        run_id = _new_run(store)
        with store.engine.begin() as conn:
            same = conn.execute(t.runs.update().where(t.runs.c.run_id == run_id).values(state="CREATED"))
            assert same.rowcount == 1
            none = conn.execute(t.runs.update().where(t.runs.c.run_id == "nope").values(state="X"))
            assert none.rowcount == 0
    finally:
        store.close()


def test_update_assignments_read_the_old_row(backend_url: str) -> None:
    """In `SET a = …, b = f(a)` every expression reads the row as it was, as standard SQL says; MySQL
    and MariaDB would otherwise read the new `a` (the lease takeover's stall count depends on it)."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        run_id = _new_run(store)
        with store.engine.begin() as conn:
            conn.execute(t.runs.update().where(t.runs.c.run_id == run_id).values(
                lease_owner="w2",
                stall_count=t.runs.c.stall_count + sa.case((t.runs.c.lease_owner.is_(None), 10), else_=1)))
            stalls = conn.execute(sa.select(t.runs.c.stall_count).where(t.runs.c.run_id == run_id)).scalar()
        assert stalls == 10
    finally:
        store.close()


def test_concurrent_compare_and_set_has_one_winner(backend_url: str) -> None:
    """Eight threads race the same Run out of CREATED: exactly one transition is applied (K4)."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        run_id = _new_run(store)
        barrier = threading.Barrier(8)
        outcomes: list[bool] = []

        def race(i: int) -> None:
            barrier.wait()
            target = RunState.PREPARING if i % 2 else RunState.FAILED
            outcome = store.transition(run_id, RunState.CREATED, target, actor=f"w{i}", reason="race")
            outcomes.append(outcome.applied)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(outcomes) == [False] * 7 + [True]
        assert [r.seq for r in store.transitions_of(run_id)][:2] == [0, 1]
        store.drain_all()
        assert verify_chain(SqlAuditReads(store)).ok
    finally:
        store.close()


def test_identifiers_compare_exactly(backend_url: str) -> None:
    """Tenants and idempotency keys differing only in case or a trailing space are different (no
    case-insensitive or padding collation may merge tenants)."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        ids = {tenant: _new_run(store, tenant, key="k") for tenant in ("acme", "ACME", "acme ")}
        assert len(set(ids.values())) == 3
        assert [r.run_id for r in store.list_runs(tenant_id="acme")] == [ids["acme"]]
        assert _new_run(store, "acme", key="K") != ids["acme"]
        assert _new_run(store, "acme", key="k") == ids["acme"]
    finally:
        store.close()


def test_large_unicode_payloads_round_trip_exactly(backend_url: str) -> None:
    """A 2 MB trace payload and a 1 MB context with 4-byte characters come back byte for byte, and
    the chain over them verifies."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        run_id = _new_run(store)
        big = {"text": "naïve 🚀 " * 200_000, "trailing": "space "}
        store.record([TraceRecordIn("tool", big, run_id)])
        context = {"memo": "ü😀" * 250_000}
        store.save_context(run_id, context)
        store.drain_all()
        [stored] = [r for r in store.trace_of(run_id) if r.kind == "tool"]
        assert stored.payload == canonical_json(big)  # byte for byte, as chained
        assert store.get_run(run_id).context == context
        assert verify_chain(SqlAuditReads(store)).ok
    finally:
        store.close()


def test_times_keep_double_precision(backend_url: str) -> None:
    """Times are stored as 8-byte doubles: microseconds survive on every backend."""
    store = SqlStore.open(backend_url, FakeClock(1_800_000_000.123456))
    try:
        run = store.get_run(_new_run(store))
        assert run.created_at == 1_800_000_000.123456
    finally:
        store.close()


def test_concurrent_drainers_chain_every_record_once(backend_url: str) -> None:
    """Four threads draining at once chain every outbox record exactly once, without a fork (A3)."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        for i in range(20):
            store.record([TraceRecordIn("note", {"i": i, "j": j}) for j in range(50)])
        totals: list[int] = []
        threads = [threading.Thread(target=lambda: totals.append(store.drain_all(batch_size=37)))
                   for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sum(totals) == 1000
        assert store.outbox_backlog() == 0
        report = verify_chain(SqlAuditReads(store))
        assert report.ok and report.records_checked == 1000
    finally:
        store.close()


def _settings(url: str, tmp: Path) -> Settings:
    return Settings(db=url, skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
                    llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                    data_dir=tmp / "data")


def test_full_pipeline_run_is_audit_clean(backend_url: str, tmp_path: Path, call_log: Path) -> None:
    """Runs ending in SUCCEEDED, CLOSED_FAILED and AWAITING_HITL→SUCCEEDED leave a chain that verifies
    and tables that reconcile on every backend."""
    rt = build_runtime(_settings(backend_url, tmp_path), clock=FakeClock())
    try:
        paths: dict[str, Any] = {}
        for task in ("echo hello", "fail", "prose", "echo hello again"):  # the last one recalls memory
            paths[task] = rt.runs.create_run({"task": task, **TESTER}).state
        assert set(paths.values()) == {"SUCCEEDED", "CLOSED_FAILED"}
        assert paths["echo hello"] == paths["echo hello again"] == "SUCCEEDED"
        parked = rt.runs.create_run({"task": "update T-1", **TESTER})
        assert parked.state == "AWAITING_HITL" and parked.approval_request_id
        approver = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
        verdict, done = rt.runs.decide(parked.approval_request_id, approver, "approve")
        assert verdict.accepted and done.state == "SUCCEEDED"
        assert call_log.read_text().count("\n") >= 2
        assert_audit_clean(rt)
        assert reconcile(SqlReconcileReads(rt.store)).ok
    finally:
        rt.close()



def _first_start(url: str, barrier: Any, report: str) -> None:
    """Child process: a worker starting on a database nobody has migrated yet; writes what went wrong."""
    engine = create_engine(resolve_url(url))
    barrier.wait()
    try:
        migrate(engine)
    except Exception:
        Path(report).write_text(traceback.format_exc())
        raise
    finally:
        engine.dispose()


def test_concurrent_first_starts_migrate_once(empty_backend_url: str, tmp_path: Path) -> None:
    """Three worker processes starting together on an empty database all come up: one migrates, the
    others wait for it and find the schema current (D2: several workers, one database)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(3)
    reports = [tmp_path / f"worker-{i}.txt" for i in range(3)]
    workers = [ctx.Process(target=_first_start, args=(empty_backend_url, barrier, str(r))) for r in reports]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [r.read_text() for r in reports if r.exists()] == []
    assert [w.exitcode for w in workers] == [0, 0, 0]
    store = SqlStore.open(empty_backend_url, FakeClock())
    try:
        assert store.chain_head() == (0, "0" * 64)
    finally:
        store.close()
