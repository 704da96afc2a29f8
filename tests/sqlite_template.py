"""A migrated SQLite database for the fixtures that promise one, copied instead of migrated again.

Migrating a new SQLite file runs every migration through alembic (~0.2 s of CPU each time), and a test
process opens hundreds of them: unit and acceptance tests alone made 332 in one run, 67 s of the two
workers' time. As the PostgreSQL and MariaDB fixtures clone a template database, each test process
migrates one SQLite file with the code under test, the first time a fixture asks for one, and copies it
from then on. A copy gets an identity of its own (`database_identity`), as a database created anew
would. Tests of the migrations themselves start from empty files and never come here.
"""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import tempfile
import time
from functools import cache
from pathlib import Path

from harness.adapters.sql.store import SqlStore
from harness.domain.ids import ordered_id


@cache
def _template() -> Path:
    """This process's migrated database (checkpointed and closed: one file, no WAL beside it)."""
    folder = Path(tempfile.mkdtemp(prefix="harness-sqlite-template-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "template.db"
    SqlStore.open(str(path)).close()
    for leftover in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if leftover.exists():
            raise RuntimeError(f"the template database was not closed cleanly: {leftover} remains")
    return path


def migrated_sqlite(path: Path) -> str:
    """A migrated database at `path`: a copy of the template where there is none yet (a database already
    there, one a test reopens, is left as it is); returns the path as `--db` takes it."""
    if path.exists():
        return str(path)
    shutil.copyfile(_template(), path)
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute("UPDATE database_identity SET database_id = ?, created_at = ? WHERE id = 1",
                         (ordered_id(), time.time()))
    finally:
        conn.close()
    return str(path)
