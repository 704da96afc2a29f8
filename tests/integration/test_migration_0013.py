"""Migration 0013 on SQLite, PostgreSQL and MariaDB: a database gets an id (existing ones when upgraded,
new ones at creation, each its own), the outbox its index by Run, and the approval rows written before it
their chained mirrors; a chain written by the earlier version keeps verifying (with a warning naming what
it does not prove), its approval rows are then proven too, and the migration reverts and re-applies."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql import schema as t
from harness.adapters.sql.approvals import SqlApprovals
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import head_revision, migrate
from harness.adapters.sql.store import SqlStore
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.domain.contracts import CallerIdentity
from harness.domain.records import TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.pipeline.sandbox_pool import SandboxPool
from harness.settings import Settings

from ..conftest import FIXTURES
from .test_migration_0006 import _to, _version
from .test_tamper_rows import drop_append_only

BEFORE = "0012_webhooks_costs"
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def _as_the_earlier_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Write records as the version before 0013 did: a RunTrace of version 1 (no result hash, no record
    ids), approval rows without their mirror records."""
    run_trace = StateMachine._run_trace

    def old_run_trace(self: StateMachine, *args: Any) -> TraceRecordIn:
        rec = run_trace(self, *args)
        return TraceRecordIn(rec.kind, {k: v for k, v in rec.payload.items() if k not in ("v", "result_hash")},
                             rec.run_id)

    monkeypatch.setattr(StateMachine, "_run_trace", old_run_trace)
    monkeypatch.setattr(SqlStore, "_with_record_commitment", lambda self, conn, run_id, outbox: outbox)
    monkeypatch.setattr(SqlApprovals, "_chain", lambda self, conn, kind, payload, run_id: None)
    # and it had no sandbox instances (their table came later)
    monkeypatch.setattr(SandboxPool, "on_transition", lambda self, conn, run_id, source, target: None)


def _database_id(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.select(t.database_identity.c.database_id)).scalar_one())


def test_a_chain_of_the_earlier_version_keeps_verifying_and_its_approvals_are_proven(
        engine: sa.Engine, tmp_path: Path, call_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs closed and approvals decided as the version before 0013 wrote them verify after the upgrade,
    with a warning that their RunTraces prove neither result nor completeness; the approval rows are
    mirrored by the migration, so an edit of an old decision is named; the database has an id.

    Today's code drives on today's schema (it reads columns later revisions add), so the Runs are written
    at head with the earlier version's records and the database is then taken down to 0012, which drops
    what 0013 and later revisions added; the upgrade under test starts from there."""
    migrate(engine)
    settings = Settings(db=str(engine.url.render_as_string(hide_password=False)), skills_dirs=(FIXTURES / "skills",),
                        policy_file=FIXTURES / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                        identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data", memory="off")
    with monkeypatch.context() as patch:
        _as_the_earlier_version(patch)
        rt = build_runtime(settings, clock=FakeClock(), store=SqlStore(engine, FakeClock()))
        rt.runs.create_run({"task": "echo old", **TESTER})
        parked = rt.runs.create_run({"task": "update T-1", **TESTER})
        approver = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
        rt.runs.decide(str(parked.approval_request_id), approver, "approve")
        rt.store.drain_all()
    rt.close()
    _to(engine, command.downgrade, BEFORE)
    assert _version(engine) == BEFORE and "database_identity" not in sa.inspect(engine).get_table_names()
    migrate(engine)
    assert _version(engine) == head_revision()
    store = SqlStore(engine, FakeClock())
    assert str(uuid.UUID(store.database_id())) == store.database_id()
    assert "ix_outbox_run" in {i["name"] for i in sa.inspect(engine).get_indexes("outbox")}
    assert store.outbox_backlog() == 2  # the request's and the decision's mirrors, waiting to be chained
    store.drain_all()
    report = verify_chain(SqlAuditReads(store))
    assert report.ok, report.problems
    assert any("2 Run(s) were closed by a version" in w for w in report.warnings), report.warnings
    new = build_runtime(settings, clock=FakeClock(), store=store)
    new.runs.create_run({"task": "echo new", **TESTER})
    store.drain_all()
    assert verify_chain(SqlAuditReads(store)).ok
    with engine.begin() as conn:
        drop_append_only(conn, "hitl_decisions")
        conn.execute(sa.text("UPDATE hitl_decisions SET approver = 't1/lee'"))
    problems = verify_chain(SqlAuditReads(store)).problems
    assert [(p.table, p.field) for p in problems] == [("hitl_decisions", "approver")]
    new.close()


def test_every_database_gets_its_own_id_and_the_migration_reverts(engine: sa.Engine, tmp_path: Path) -> None:
    """A database migrated from empty has an id, another database another one; down to 0012 the table and
    the index go, and up again the database gets an id again."""
    migrate(engine)
    first = _database_id(engine)
    other = SqlStore.open(str(tmp_path / "other.db"), FakeClock())
    assert other.database_id() != first
    other.close()
    _to(engine, command.downgrade, BEFORE)
    assert "database_identity" not in sa.inspect(engine).get_table_names()
    assert "ix_outbox_run" not in {i["name"] for i in sa.inspect(engine).get_indexes("outbox")}
    migrate(engine)
    assert _version(engine) == head_revision() and _database_id(engine) != first
