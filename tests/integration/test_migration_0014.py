"""Migration 0014 on SQLite, PostgreSQL and MariaDB: it reverts and re-applies, and after a downgrade
the append-only guards refuse a granted DELETE again (the prune's door is gone with it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import head_revision, migrate

from .test_migration_0006 import _to, _version

BEFORE = "0013_database_id"


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def _granted_delete(engine: sa.Engine) -> None:
    """Insert an audit row, grant its Run, delete it."""
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO audit_events (event_id, run_id, event, actor, detail, at) "
                             "VALUES ('e1', 'r1', 'x', 'test', '{}', 1.0)"))
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO prune_grants (run_id, segment_id) VALUES ('r1', 's')"))
        conn.execute(sa.text("DELETE FROM audit_events WHERE run_id = 'r1'"))
        conn.execute(sa.text("DELETE FROM prune_grants"))


def test_0014_reverts_and_reapplies(engine: sa.Engine) -> None:
    """At head a granted DELETE goes through; at 0013 the tables and the door are gone, and a DELETE is
    refused again; upgrading restores both."""
    migrate(engine)
    assert _version(engine) == head_revision()
    _granted_delete(engine)
    _to(engine, command.downgrade, BEFORE)
    assert "pruned_records" not in sa.inspect(engine).get_table_names()
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO audit_events (event_id, run_id, event, actor, detail, at) "
                             "VALUES ('e2', 'r2', 'x', 'test', '{}', 1.0)"))
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM audit_events WHERE run_id = 'r2'"))
    _to(engine, command.upgrade, "head")
    assert _version(engine) == head_revision()
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO prune_grants (run_id, segment_id) VALUES ('r2', 's')"))
        deleted = conn.execute(sa.text("DELETE FROM audit_events WHERE run_id = 'r2'")).rowcount
        conn.execute(sa.text("DELETE FROM prune_grants"))
    assert deleted == 1
