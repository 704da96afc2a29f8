"""Reads on PostgreSQL run in autocommit: no BEGIN and ROLLBACK around them, and the driver keeps its
prepared statements (issue 20: round trips per Run)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState

BACKENDS = ("postgresql",)


@pytest.fixture
def store(backend_url: str) -> Iterator[SqlStore]:
    """A store on a fresh, migrated PostgreSQL database."""
    s = SqlStore.open(backend_url, FakeClock())
    yield s
    s.close()


def test_reads_keep_the_drivers_prepared_statements(store: SqlStore) -> None:
    """psycopg prepares a statement run five times on a connection, and forgets them all at a ROLLBACK: the
    Run reads between its steps must not end in one, or no statement of theirs ever stays prepared."""
    run, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    for _ in range(8):
        assert store.state_of(run.run_id) == RunState.CREATED
        assert store.get_run(run.run_id).run_id == run.run_id
    with store.reader.connect() as conn:
        prepared = conn.execute(sa.text("SELECT statement FROM pg_prepared_statements WHERE statement LIKE :p"),
                                {"p": "%FROM runs%"}).scalars().all()
    assert prepared, "the reads' statements were never prepared: something rolls their connection back"


def test_a_read_sees_what_another_connection_just_committed(store: SqlStore) -> None:
    """Autocommit reads read committed data, statement by statement, as the read transactions did."""
    run, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    with store.reader.connect() as reader:
        assert reader.connection.driver_connection.autocommit  # type: ignore[union-attr]
        before = reader.execute(sa.text("SELECT state FROM runs WHERE run_id = :r"), {"r": run.run_id}).scalar()
        StateMachine(store).transition(run.run_id, RunState.CREATED, RunState.PREPARING, actor="t", reason="go")
        after = reader.execute(sa.text("SELECT state FROM runs WHERE run_id = :r"), {"r": run.run_id}).scalar()
    assert (before, after) == ("CREATED", "PREPARING")
    with store.engine.connect() as writer:  # the writers' connections are left as they were
        assert not writer.connection.driver_connection.autocommit  # type: ignore[union-attr]


def test_a_snapshot_reader_still_gets_one(store: SqlStore) -> None:
    """A reader that asks for REPEATABLE READ on its connection (the audit's mirror check) still reads one
    snapshot across its statements."""
    run, _ = store.create_run(NewRun("acme", "alice", "s", {}))
    conn = store.reader.connect().execution_options(isolation_level="REPEATABLE READ")
    with conn, conn.begin():
        before = conn.execute(sa.text("SELECT state FROM runs WHERE run_id = :r"), {"r": run.run_id}).scalar()
        StateMachine(store).transition(run.run_id, RunState.CREATED, RunState.PREPARING, actor="t", reason="go")
        after = conn.execute(sa.text("SELECT state FROM runs WHERE run_id = :r"), {"r": run.run_id}).scalar()
    assert before == after == "CREATED"
