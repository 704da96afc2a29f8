"""Migration 0015 on SQLite, PostgreSQL and MariaDB: a database of the version before gains the sandbox
instance and lease tables, empty, and the migration reverts and re-applies; a unit is taken once (the
primary key refuses a second lease of the same port)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import head_revision

from .test_migration_0006 import _to, _version

BEFORE = "0014_retention"
TABLES = ("sandbox_instances", "sandbox_leases")


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def test_the_tables_come_and_go_with_the_revision(engine: sa.Engine) -> None:
    """Upgraded from the revision before, the database has both tables (empty, leases keyed by resource
    and unit); downgraded, neither; upgraded again, both."""
    _to(engine, command.upgrade, BEFORE)
    assert not set(TABLES) & set(sa.inspect(engine).get_table_names())
    head = head_revision()
    assert head is not None
    _to(engine, command.upgrade, head)
    assert _version(engine) == head
    assert set(TABLES) <= set(sa.inspect(engine).get_table_names())
    assert sa.inspect(engine).get_pk_constraint("sandbox_leases")["constrained_columns"] == ["resource", "unit"]
    row = {"resource": "port:h", "unit": 41000, "instance_id": "sbx-a", "acquired_at": 1.0}
    with engine.begin() as conn:
        conn.execute(t.sandbox_leases.insert(), row)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(t.sandbox_leases.insert(), {**row, "instance_id": "sbx-b"})
    with engine.begin() as conn:
        conn.execute(t.sandbox_leases.delete())
    _to(engine, command.downgrade, BEFORE)
    assert not set(TABLES) & set(sa.inspect(engine).get_table_names())
    _to(engine, command.upgrade, head)
    assert set(TABLES) <= set(sa.inspect(engine).get_table_names())
