"""Migration 0011 scopes idempotency keys per (tenant, user) and adds runs.request_hash and the health
heartbeat on SQLite, PostgreSQL and MariaDB, on a database holding Runs with keys: every row is kept as it
was, a key used before the upgrade still returns its Run, another user of the tenant may now use the same
key, schema.py matches the database; it reverts and re-applies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import head_revision, migrate
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.errors import IdempotencyConflictError
from harness.domain.records import NewRun

from .test_migration_0006 import _to, _version

BEFORE = "0009_approval_uniqueness"
#: the columns runs had at 0008, in order
COLUMNS_0008 = [c.name for c in t.runs.columns  # added by 0011, 0017, 0020
                if c.name not in ("request_hash", "start_by", "lease_waiting")]


def _create_directly(engine: sa.Engine, count: int) -> None:
    """Runs as a harness at 0008 created them: keys per tenant, no request hash."""
    rows = [{"run_id": f"run-{i:03d}", "tenant_id": ("acme", "globex")[i % 2], "user_id": ("ana", "bo", "cy")[i % 3],
             "session_id": "s1", "state": "CREATED", "version": 0, "idempotency_key": f"key-{i // 2}",
             "created_at": 1_800_000_000.0 + i, "last_state_change_at": 1_800_000_000.0 + i, "lease_epoch": 0,
             "stall_count": 0, "request": f'{{"task": "t{i}"}}'} for i in range(count)]
    with engine.begin() as conn:
        conn.execute(sa.table("runs", *[sa.column(c) for c in rows[0]]).insert(), rows)


def _rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    cols = ", ".join(COLUMNS_0008)
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(f"SELECT {cols} FROM runs ORDER BY run_id")]


def _unique_keys(engine: sa.Engine) -> set[tuple[str | None, ...]]:
    inspector = sa.inspect(engine)
    found = {tuple(c["column_names"]) for c in inspector.get_unique_constraints("runs")}
    return found | {tuple(i["column_names"]) for i in inspector.get_indexes("runs") if i["unique"]}


def _assert_schema_after_0011(engine: sa.Engine) -> None:
    """runs and health_heartbeat have the columns, nullability and keys schema.py declares."""
    inspector = sa.inspect(engine)
    for table in (t.runs, t.health_heartbeat):
        assert [(c["name"], c["nullable"]) for c in inspector.get_columns(table.name)] == [
            (c.name, c.nullable) for c in table.columns], table.name
    assert _unique_keys(engine) == {("tenant_id", "user_id", "idempotency_key")}
    assert {i["name"] for i in inspector.get_indexes("runs") if not i["unique"]} >= {
        "ix_runs_state_changed", "ix_runs_tenant_created"}


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def test_upgrade_keeps_every_run_and_scopes_keys_per_user(engine: sa.Engine) -> None:
    """Runs created at 0008 are kept column for column; their keys still return them (with or without a
    body hash: they have none); another user may now reuse a key; a new key is bound to its body."""
    _to(engine, command.upgrade, BEFORE)
    _create_directly(engine, 30)
    before = _rows(engine)
    assert _unique_keys(engine) == {("tenant_id", "idempotency_key")}
    migrate(engine)
    assert _version(engine) == head_revision()
    assert _rows(engine) == before
    _assert_schema_after_0011(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.select(t.runs.c.request_hash).distinct()).scalars().all() == [None]
        assert conn.execute(sa.select(t.health_heartbeat.c.id)).scalars().all() == [1]
    store = SqlStore(engine, FakeClock())
    old, created = store.create_run(NewRun("acme", "ana", "s1", {"task": "again"}, idempotency_key="key-0",
                                           request_hash="f" * 64))
    assert (old.run_id, created) == ("run-000", False)
    other, created = store.create_run(NewRun("acme", "bo", "s1", {"task": "mine"}, idempotency_key="key-0",
                                             request_hash="f" * 64))
    assert created and other.run_id != "run-000"
    with pytest.raises(IdempotencyConflictError, match=other.run_id):
        store.create_run(NewRun("acme", "bo", "s1", {"task": "else"}, idempotency_key="key-0",
                                request_hash="e" * 64))
    store.probe_write()


def test_downgrade_restores_keys_per_tenant_and_upgrade_applies_again(engine: sa.Engine) -> None:
    """Down to 0008 the column, the heartbeat and the per-user key are gone and the per-tenant key is back,
    every Run kept; up again, the hashes are empty and the new key is in place."""
    migrate(engine)
    store = SqlStore(engine, FakeClock())
    for i in range(6):
        store.create_run(NewRun("acme", f"u{i}", "s1", {"task": i}, idempotency_key=f"k{i}", request_hash="a" * 64))
    before = _rows(engine)
    _to(engine, command.downgrade, BEFORE)
    assert _version(engine) == BEFORE
    assert "health_heartbeat" not in sa.inspect(engine).get_table_names()
    assert "request_hash" not in {c["name"] for c in sa.inspect(engine).get_columns("runs")}
    assert _unique_keys(engine) == {("tenant_id", "idempotency_key")}
    assert _rows(engine) == before
    migrate(engine)
    assert _rows(engine) == before
    _assert_schema_after_0011(engine)
