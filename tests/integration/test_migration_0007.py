"""Migration 0007 replaces UNIQUE(prev_hash) on trace_records by a trigger that keeps the chain linear, on
SQLite, PostgreSQL and MariaDB, on a database holding a real chain: every record kept byte for byte, the
chain still verifying, forks, gaps and wrong links refused as integrity errors (A3), the table still
append-only (A2), schema.py matching the migrated database; it reverts and re-applies, and a database
migrated from empty has the trigger from its first record on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql import schema as t
from harness.adapters.sql import triggers
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import migrate
from harness.adapters.sql.store import SqlStore
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.domain.chain import GENESIS_HASH, record_hash

from .test_migration_0006 import (
    TABLE,
    _assert_append_only,
    _chain_runs,
    _columns,
    _rows,
    _to,
    _unique_columns,
    _version,
    records_table,
)

BEFORE = "0006_trace_hash_not_unique"
AFTER = "0007_linear_chain"
UNIQUE_AT_0006 = {("record_id",), ("prev_hash",)}
KEPT_UNIQUE = {("record_id",)}
#: what the trigger's refusal says on every backend
REFUSED = "fork or gap refused"


def _insert(engine: sa.Engine, seq: int, prev_hash: str, record_id: str = "probe") -> None:
    """Insert a self-consistent record at `seq` linking to `prev_hash`, then roll it back."""
    payload = '{"probe":true}'
    row = {"seq": seq, "record_id": record_id, "run_id": None, "kind": "note", "payload": payload,
           "prev_hash": prev_hash, "hash": record_hash(seq, record_id, None, "note", prev_hash, payload)}
    with engine.connect() as conn:
        tx = conn.begin()
        try:
            conn.execute(records_table(conn).insert(), row)
        finally:
            tx.rollback()


def _indexed_columns(engine: sa.Engine) -> set[str]:
    """Every trace_records column that some index or unique constraint covers."""
    inspector = sa.inspect(engine)
    indexes = {str(name) for i in inspector.get_indexes(TABLE) for name in i["column_names"]}
    return indexes | {name for c in inspector.get_unique_constraints(TABLE) for name in c["column_names"]}


def _assert_linear_chain_enforced(engine: sa.Engine) -> None:
    """Forks, gaps and wrong links are refused as integrity errors; the next record in line goes in."""
    rows = _rows(engine)
    first, last = rows[0], rows[-1]
    seq, prev_hash, digest = last[0], last[5], last[6]
    with pytest.raises(sa.exc.IntegrityError, match=REFUSED):
        _insert(engine, seq + 1, prev_hash)  # a fork of the newest record's predecessor
    with pytest.raises(sa.exc.IntegrityError, match=REFUSED):
        _insert(engine, seq + 1, GENESIS_HASH)  # a second chain from the genesis
    with pytest.raises(sa.exc.IntegrityError):
        _insert(engine, seq, prev_hash)  # a fork at the seq it forks from: the primary key refuses it
    with pytest.raises(sa.exc.IntegrityError, match=REFUSED):
        _insert(engine, seq + 2, digest)  # a gap
    with pytest.raises(sa.exc.IntegrityError, match=REFUSED):
        _insert(engine, seq + 1, "e" * 64)  # a wrong link
    with pytest.raises(sa.exc.IntegrityError, match=REFUSED):
        _insert(engine, 0, GENESIS_HASH)  # before the genesis
    with pytest.raises(sa.exc.IntegrityError):
        _insert(engine, seq + 1, digest, record_id=first[1])  # record_id is still UNIQUE
    _insert(engine, seq + 1, digest)
    assert _rows(engine) == rows


def _assert_schema_after_0007(engine: sa.Engine) -> None:
    """Only record_id is UNIQUE and prev_hash is in no index, as schema.py says; the run index and the
    triggers are there, and the trigger keeps the chain linear."""
    assert _unique_columns(engine) == KEPT_UNIQUE
    schema_unique = {tuple(c.name for c in uc.columns) for uc in t.trace_records.constraints
                     if isinstance(uc, sa.UniqueConstraint)}
    assert schema_unique == KEPT_UNIQUE  # schema.py agrees with the migrated database
    assert "prev_hash" not in _indexed_columns(engine)
    assert {tuple(c.name for c in i.columns) for i in t.trace_records.indexes} == {("run_id",)}
    assert "ix_trace_records_run" in {i["name"] for i in sa.inspect(engine).get_indexes(TABLE)}
    assert "trace_records_rebuilt" not in sa.inspect(engine).get_table_names()
    _assert_linear_chain_enforced(engine)
    _assert_append_only(engine)


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def test_upgrade_keeps_the_chain_and_guards_it_with_the_trigger(engine: sa.Engine) -> None:
    """A chain written at 0006 survives the upgrade byte for byte and verifies; prev_hash is no longer
    UNIQUE, the trigger refuses forks, gaps and wrong links, the table is still append-only and new
    Runs chain on."""
    _to(engine, command.upgrade, BEFORE)
    store = SqlStore(engine, FakeClock())
    _chain_runs(store)
    rows, columns, head = _rows(engine), _columns(engine), store.chain_head()
    assert len(rows) > 20 and _unique_columns(engine) == UNIQUE_AT_0006
    _to(engine, command.upgrade, AFTER)
    assert _version(engine) == AFTER
    assert _rows(engine) == rows
    assert _columns(engine) == columns
    assert store.chain_head() == head
    report = verify_chain(SqlAuditReads(store))
    assert report.ok and report.records_checked == len(rows)
    _assert_schema_after_0007(engine)
    _chain_runs(store)
    report = verify_chain(SqlAuditReads(store))
    assert report.ok and report.records_checked == len(_rows(engine)) > len(rows)


def test_downgrade_puts_the_unique_back_and_upgrade_replaces_it_again(engine: sa.Engine) -> None:
    """Down to 0006 prev_hash is UNIQUE again under the name the database gives it and the trigger is
    gone, with every record kept and the table append-only; back up at 0007 the trigger guards the
    chain again, and it still verifies."""
    _to(engine, command.upgrade, BEFORE)
    names_at_0006 = {c["name"] for c in sa.inspect(engine).get_unique_constraints(TABLE)}
    _to(engine, command.upgrade, AFTER)
    store = SqlStore(engine, FakeClock())
    _chain_runs(store)
    rows, columns = _rows(engine), _columns(engine)
    _to(engine, command.downgrade, BEFORE)
    assert _version(engine) == BEFORE
    assert _unique_columns(engine) == UNIQUE_AT_0006
    assert {c["name"] for c in sa.inspect(engine).get_unique_constraints(TABLE)} == names_at_0006
    assert _rows(engine) == rows and _columns(engine) == columns
    last = rows[-1]
    with pytest.raises(sa.exc.IntegrityError):
        _insert(engine, last[0] + 1, last[5])  # the UNIQUE refuses the fork again
    _insert(engine, last[0] + 2, "e" * 64)  # the trigger is gone: a gap and a wrong link go in
    _assert_append_only(engine)
    assert verify_chain(SqlAuditReads(store)).ok
    _to(engine, command.upgrade, AFTER)
    assert _version(engine) == AFTER
    assert _rows(engine) == rows and _columns(engine) == columns
    _assert_schema_after_0007(engine)
    _chain_runs(store)
    assert verify_chain(SqlAuditReads(store)).ok


def test_a_database_migrated_from_empty_starts_the_chain_at_the_genesis(engine: sa.Engine) -> None:
    """The trigger is there from the first record on: seq 1 must link to GENESIS_HASH, nothing may start
    past it, and the store's own chain goes in and verifies."""
    migrate(engine)
    assert _rows(engine) == [] and _unique_columns(engine) == KEPT_UNIQUE
    assert "prev_hash" not in _indexed_columns(engine)
    with pytest.raises(sa.exc.IntegrityError, match=REFUSED):
        _insert(engine, 1, "e" * 64)
    with pytest.raises(sa.exc.IntegrityError, match=REFUSED):
        _insert(engine, 2, GENESIS_HASH)
    _insert(engine, 1, GENESIS_HASH)
    store = SqlStore(engine, FakeClock())
    _chain_runs(store)
    assert _rows(engine)[0][5] == GENESIS_HASH
    assert verify_chain(SqlAuditReads(store)).ok
    _assert_schema_after_0007(engine)


def test_a_failed_sqlite_rebuild_leaves_the_table_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite rebuild runs in the migration's transaction: failing at its last step (the new trigger),
    after the old table was dropped, leaves the database at 0006 with the old table, rows and triggers."""
    engine = create_engine(resolve_url(str(tmp_path / "harness.db")))
    try:
        _to(engine, command.upgrade, BEFORE)
        store = SqlStore(engine, FakeClock())
        _chain_runs(store)
        rows = _rows(engine)

        def broken(dialect: str, **_: object) -> list[str]:
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(triggers, "linear_chain_ddl", broken)
        with pytest.raises(RuntimeError, match="disk on fire"):
            migrate(engine)
        monkeypatch.undo()
        assert _version(engine) == BEFORE
        assert _rows(engine) == rows
        assert _unique_columns(engine) == UNIQUE_AT_0006
        assert "trace_records_rebuilt" not in sa.inspect(engine).get_table_names()
        _assert_append_only(engine)
        _insert(engine, rows[-1][0] + 2, "e" * 64)  # no linear-chain trigger was left behind
        assert verify_chain(SqlAuditReads(store)).ok
    finally:
        engine.dispose()
