"""Migration 0022 notes which sandbox provider holds a kept instance's process, on SQLite, PostgreSQL and
MariaDB: instances kept before it were all started by this host's sandbox and read back "local"; it reverts
and re-applies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import head_revision, migrate

from .test_migration_0006 import _to, _version

BEFORE = "0021_knowledge"
AFTER = "0022_sandbox_instance_provider"
ROW = {"instance_id": "sbx-1", "run_id": "r1", "skill_id": "test.devserver", "tenant_id": "t1", "user_id": "u1",
       "host": "h1", "state": "live", "isolation": "bwrap", "pid": 4242, "pid_start": 7, "owner": "h1:1",
       "created_at": 1.0, "started_at": 1.0, "used_at": 1.0, "lease_expires_at": 60.0}


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def _providers(engine: sa.Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT instance_id, provider FROM sandbox_instances"))]


def test_instances_kept_before_are_local_and_it_reverts(engine: sa.Engine) -> None:
    """A live instance written at 0021 reads "local" after the upgrade; a new row may name "remote"; the
    downgrade drops the column and keeps the rows, and the upgrade applies again."""
    _to(engine, command.upgrade, BEFORE)
    with engine.begin() as conn:
        conn.execute(sa.table("sandbox_instances", *(sa.column(k) for k in ROW)).insert().values(**ROW))
    migrate(engine)
    head = head_revision()
    assert head is not None
    assert _version(engine) == head and head >= AFTER
    assert _providers(engine) == [("sbx-1", "local")]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE sandbox_instances SET provider = 'remote'"))
    assert _providers(engine) == [("sbx-1", "remote")]
    _to(engine, command.downgrade, BEFORE)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("sandbox_instances")}
    assert "provider" not in columns
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM sandbox_instances")).scalar_one() == 1
    migrate(engine)
    assert _providers(engine) == [("sbx-1", "local")]
