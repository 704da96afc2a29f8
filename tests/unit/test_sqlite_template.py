"""The fixtures' migrated SQLite copies (tests/sqlite_template.py) are databases as a first open makes them:
at the newest migration, each with an identity of its own, and a database already there is left alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from harness.adapters.sql.migration import shipped_head
from harness.adapters.sql.store import SqlStore
from tests.sqlite_template import migrated_sqlite


def _identity(path: str) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("SELECT database_id FROM database_identity WHERE id = 1").fetchone()[0])
    finally:
        conn.close()


def test_a_copy_is_current_has_its_own_identity_and_never_overwrites(tmp_path: Path) -> None:
    first, second = migrated_sqlite(tmp_path / "a.db"), migrated_sqlite(tmp_path / "b.db")
    conn = sqlite3.connect(first)
    try:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(shipped_head(),)]
    finally:
        conn.close()
    assert _identity(first) != _identity(second)
    store = SqlStore.open(first)  # opens without migrating, and works
    try:
        assert store.database_id() == _identity(first)
    finally:
        store.close()
    before = _identity(first)
    assert migrated_sqlite(tmp_path / "a.db") == first and _identity(first) == before
