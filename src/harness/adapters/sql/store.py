"""The SQL store: the single write path for Run.state (SPEC K4) and the outbox-fed hash chain (A3, A4).

Every state change is one database transaction that compare-and-sets runs.state and writes the
transition row, the audit events, the legacy Job.status projection and the outbox records together.
The class is assembled from its parts: store_base (shared state, row helpers), store_chain (audit events,
outbox, hash chain), store_runs (creating and moving Runs) and store_reads (reads and probes).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import migrate
from harness.adapters.sql.store_reads import RunReads
from harness.adapters.sql.store_runs import RunWrites
from harness.domain.errors import InvalidRequestError
from harness.ports import Clock

__all__ = ["SqlStore", "open_existing"]


class SqlStore(RunWrites, RunReads):
    """Runs, transitions, audit events and the trace, on SQLite, PostgreSQL or MySQL/MariaDB."""

    @classmethod
    def open(cls, db: str | None = None, clock: Clock | None = None, *, migrate_schema: bool = True) -> SqlStore:
        """Open (and on first use create) the database named by `db`, HARNESS_DATABASE_URL or the default."""
        engine = create_engine(resolve_url(db))
        if migrate_schema:
            migrate(engine)
        return cls(engine, clock)


def open_existing(db: str | None, clock: Clock | None = None) -> SqlStore:
    """The store, refusing to create a new SQLite file (auditing a database that is not there is a mistake)."""
    url = sa.engine.make_url(resolve_url(db))
    path = url.database if url.get_backend_name() == "sqlite" else None
    if path not in (None, "", ":memory:") and not Path(str(path)).is_file():
        raise InvalidRequestError(f"no database at {path}")
    return SqlStore.open(db, clock)
