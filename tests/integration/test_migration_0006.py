"""Migration 0006 drops the UNIQUE on trace_records.hash on SQLite, PostgreSQL and MariaDB, on a database
holding a real chain: every record kept byte for byte, the chain still verifying, prev_hash and
record_id still UNIQUE (A3), the table still append-only (A2); and it reverts and re-applies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from harness.adapters.sql import schema as t
from harness.adapters.sql import triggers
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import migrate
from harness.adapters.sql.store import SqlStore
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.drive.state_machine import StateMachine

from .test_backends import _alembic
from .test_tamper import PATHS, drive

BEFORE = "0005_memory_content"
AFTER = "0006_trace_hash_not_unique"
TABLE = "trace_records"
ALL_UNIQUE = {("record_id",), ("prev_hash",), ("hash",)}
KEPT_UNIQUE = {("record_id",), ("prev_hash",)}


#: trace_records as the migrations before 0016 leave it: its hashes as hex text, not 32 bytes
HEX_RECORDS = sa.Table(TABLE, sa.MetaData(), *(
    sa.Column(c.name, sa.String(64) if c.name in ("prev_hash", "hash") else c.type, primary_key=c.primary_key)
    for c in t.trace_records.columns))


def records_table(conn: sa.Connection) -> sa.Table:
    """trace_records as the database's revision defines it (hex hashes before 0016, bytes from it on)."""
    kind = next(c["type"] for c in sa.inspect(conn).get_columns(TABLE) if c["name"] == "hash")
    return t.trace_records if kind.python_type is bytes else HEX_RECORDS


def _to(engine: sa.Engine, step: Callable[[Config, str], None], revision: str) -> None:
    """Upgrade or downgrade (`step`) the database to `revision`, in one transaction as harness migrates."""
    with engine.begin() as conn:
        step(_alembic(conn), revision)


def _version(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one())


def _chain_runs(store: SqlStore) -> None:
    """Drive one Run along every path of the tamper tests and chain their records."""
    machine = StateMachine(store)
    for path in PATHS.values():
        drive(machine, path)
    store.drain_all()


def _rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    """Every trace record, every column, in chain order."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(t.trace_records).order_by(t.trace_records.c.seq))]


def _unique_columns(engine: sa.Engine) -> set[tuple[str | None, ...]]:
    """The column sets of trace_records that a unique constraint or unique index covers."""
    inspector = sa.inspect(engine)
    found: set[tuple[str | None, ...]] = {tuple(c["column_names"]) for c in inspector.get_unique_constraints(TABLE)}
    return found | {tuple(i["column_names"]) for i in inspector.get_indexes(TABLE) if i["unique"]}


def _columns(engine: sa.Engine) -> list[tuple[str, str, bool]]:
    """(name, type, nullable) of every trace_records column, as the database reports them."""
    return [(c["name"], str(c["type"]), c["nullable"]) for c in sa.inspect(engine).get_columns(TABLE)]


def _assert_append_only(engine: sa.Engine) -> None:
    """UPDATE and DELETE (and TRUNCATE, where it exists) on trace_records fail and change nothing."""
    before = _rows(engine)
    refused = [f"UPDATE {TABLE} SET run_id = run_id", f"DELETE FROM {TABLE}"]
    for statement in refused:
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text(statement))
    if engine.dialect.name != "sqlite":
        with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
            conn.execute(sa.text(f"TRUNCATE TABLE {TABLE}"))
    assert _rows(engine) == before


def _probe_insert(engine: sa.Engine, **columns: Any) -> None:
    """Insert a record after the newest one, with `columns` taken from existing records, and roll back."""
    seq = _rows(engine)[-1][0] + 1
    row = {"seq": seq, "record_id": "probe", "run_id": None, "kind": "note", "payload": "{}",
           "prev_hash": "e" * 64, "hash": "f" * 64, **columns}
    with engine.connect() as conn:
        tx = conn.begin()
        try:
            conn.execute(records_table(conn).insert(), row)
        finally:
            tx.rollback()


def _assert_schema_after_0006(engine: sa.Engine) -> None:
    """hash takes a duplicate; prev_hash and record_id do not; the index and the triggers are there."""
    assert _unique_columns(engine) == KEPT_UNIQUE
    assert "ix_trace_records_run" in {i["name"] for i in sa.inspect(engine).get_indexes(TABLE)}
    assert "trace_records_rebuilt" not in sa.inspect(engine).get_table_names()
    rows = _rows(engine)
    first, last = rows[0], rows[-1]
    _probe_insert(engine, hash=last[6])
    with pytest.raises(sa.exc.IntegrityError):
        _probe_insert(engine, prev_hash=last[5])
    with pytest.raises(sa.exc.IntegrityError):
        _probe_insert(engine, record_id=first[1])
    _assert_append_only(engine)


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def test_upgrade_keeps_the_chain_and_drops_only_the_hash_unique(engine: sa.Engine) -> None:
    """A chain written at 0005 survives the upgrade byte for byte and verifies; hash is no longer
    UNIQUE, prev_hash and record_id still are, the table is still append-only and new Runs chain on."""
    _to(engine, command.upgrade, BEFORE)
    store = SqlStore(engine, FakeClock())
    _chain_runs(store)
    rows, columns, head = _rows(engine), _columns(engine), store.chain_head()
    assert len(rows) > 20 and _unique_columns(engine) == ALL_UNIQUE
    _to(engine, command.upgrade, AFTER)
    assert _version(engine) == AFTER
    assert _rows(engine) == rows
    assert _columns(engine) == columns
    assert store.chain_head() == head
    report = verify_chain(SqlAuditReads(store))
    assert report.ok and report.records_checked == len(rows)
    _assert_schema_after_0006(engine)
    _chain_runs(store)
    report = verify_chain(SqlAuditReads(store))
    assert report.ok and report.records_checked == len(_rows(engine)) > len(rows)


def test_downgrade_puts_the_unique_back_and_upgrade_drops_it_again(engine: sa.Engine) -> None:
    """Down to 0005 the hash is UNIQUE again under the name the database gives it, with every record
    kept and the table append-only; back up at 0006 it is not, and the chain still verifies."""
    _to(engine, command.upgrade, BEFORE)
    names_at_0005 = {c["name"] for c in sa.inspect(engine).get_unique_constraints(TABLE)}
    _to(engine, command.upgrade, AFTER)
    store = SqlStore(engine, FakeClock())
    _chain_runs(store)
    rows, columns = _rows(engine), _columns(engine)
    _to(engine, command.downgrade, BEFORE)
    assert _version(engine) == BEFORE
    assert _unique_columns(engine) == ALL_UNIQUE
    assert {c["name"] for c in sa.inspect(engine).get_unique_constraints(TABLE)} == names_at_0005
    assert _rows(engine) == rows and _columns(engine) == columns
    with pytest.raises(sa.exc.IntegrityError):
        _probe_insert(engine, hash=rows[-1][6])
    _assert_append_only(engine)
    assert verify_chain(SqlAuditReads(store)).ok
    _to(engine, command.upgrade, AFTER)
    assert _version(engine) == AFTER
    assert _rows(engine) == rows and _columns(engine) == columns
    _assert_schema_after_0006(engine)
    _chain_runs(store)
    assert verify_chain(SqlAuditReads(store)).ok


def test_a_failed_sqlite_rebuild_leaves_the_table_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite rebuild runs in the migration's transaction: failing at its last step (the triggers),
    after the old table was dropped, leaves the database at 0005 with the old table, rows and triggers."""
    engine = create_engine(resolve_url(str(tmp_path / "harness.db")))
    try:
        _to(engine, command.upgrade, BEFORE)
        store = SqlStore(engine, FakeClock())
        _chain_runs(store)
        rows = _rows(engine)

        def broken(dialect: str, table: str) -> list[str]:
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(triggers, "append_only_ddl", broken)
        with pytest.raises(RuntimeError, match="disk on fire"):
            migrate(engine)
        monkeypatch.undo()
        assert _version(engine) == BEFORE
        assert _rows(engine) == rows
        assert _unique_columns(engine) == ALL_UNIQUE
        assert "trace_records_rebuilt" not in sa.inspect(engine).get_table_names()
        _assert_append_only(engine)
        assert verify_chain(SqlAuditReads(store)).ok
    finally:
        engine.dispose()
