"""Migration 0016 stores the chain's hashes as 32 bytes on SQLite, PostgreSQL and MariaDB, on a database
holding a real chain: every record reads back as it was (hex above the store), the chain verifies, the
linear-chain trigger and the append-only guards still hold, new Runs chain on; it reverts to hex and
re-applies, and a store keeps chaining on either form."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql import triggers
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.migration import head_revision, migrate
from harness.adapters.sql.store import SqlStore
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.domain.chain import GENESIS_HASH

from .test_migration_0006 import _assert_append_only, _chain_runs, _rows, _to, _version
from .test_migration_0007 import _assert_linear_chain_enforced

BEFORE = "0015_sandbox_instances"
AFTER = "0016_binary_hashes"


def _stored_hashes(engine: sa.Engine) -> set[tuple[type, int]]:
    """(Python type, length) of every hash value as the driver returns it, chain head included."""
    with engine.connect() as conn:
        values = [v for row in conn.execute(sa.text("SELECT prev_hash, hash FROM trace_records")) for v in row]
        values.append(conn.execute(sa.text("SELECT hash FROM chain_head")).scalar_one())
    return {(str, len(v)) if isinstance(v, str) else (bytes, len(bytes(v))) for v in values}


def _hash_types(engine: sa.Engine) -> dict[str, type]:
    """The Python type of each hash column as the database declares it."""
    inspector = sa.inspect(engine)
    out = {f"trace_records.{c['name']}": c["type"].python_type for c in inspector.get_columns("trace_records")
           if c["name"] in ("prev_hash", "hash")}
    out["chain_head.hash"] = next(c["type"].python_type for c in inspector.get_columns("chain_head")
                                  if c["name"] == "hash")
    return out


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def test_upgrade_turns_every_hash_into_its_32_bytes_and_the_chain_goes_on(engine: sa.Engine) -> None:
    """A chain written at 0015 reads back identically after the upgrade, its hashes now 32 bytes each;
    it verifies, the triggers hold, and the same store chains new Runs onto it."""
    _to(engine, command.upgrade, BEFORE)
    store = SqlStore(engine, FakeClock())
    _chain_runs(store)
    rows, head = _rows(engine), store.chain_head()
    assert len(rows) > 20 and _stored_hashes(engine) == {(str, 64)}
    migrate(engine)
    assert _version(engine) == head_revision()
    assert _hash_types(engine) == dict.fromkeys(("trace_records.prev_hash", "trace_records.hash",
                                                 "chain_head.hash"), bytes)
    assert _stored_hashes(engine) == {(bytes, 32)}
    assert _rows(engine) == rows and store.chain_head() == head
    assert rows[0][5] == GENESIS_HASH
    report = verify_chain(SqlAuditReads(store))
    assert report.ok and report.records_checked == len(rows)
    _assert_linear_chain_enforced(engine)
    _assert_append_only(engine)
    _chain_runs(store)
    report = verify_chain(SqlAuditReads(store))
    assert report.ok and report.records_checked == len(_rows(engine)) > len(rows)
    assert _stored_hashes(engine) == {(bytes, 32)}


def test_downgrade_gives_the_hex_back_and_upgrade_converts_it_again(engine: sa.Engine) -> None:
    """Down to 0015 every hash is its hex again and a store chains on it in hex; back up at 0016 the
    whole chain, old and new records, is bytes and verifies."""
    migrate(engine)
    store = SqlStore(engine, FakeClock())
    _chain_runs(store)
    rows = _rows(engine)
    _to(engine, command.downgrade, BEFORE)
    assert _version(engine) == BEFORE
    assert set(_hash_types(engine).values()) == {str}
    assert _stored_hashes(engine) == {(str, 64)}
    assert _rows(engine) == rows
    _assert_linear_chain_enforced(engine)
    _assert_append_only(engine)
    _chain_runs(store)  # the store writes the form the chain head is in
    assert _stored_hashes(engine) == {(str, 64)}
    assert verify_chain(SqlAuditReads(store)).ok
    both = _rows(engine)
    _to(engine, command.upgrade, AFTER)
    assert _rows(engine) == both and _stored_hashes(engine) == {(bytes, 32)}
    _assert_linear_chain_enforced(engine)
    _chain_runs(store)
    assert verify_chain(SqlAuditReads(store)).ok


def test_a_failed_sqlite_conversion_leaves_the_hex_chain_as_it_was(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite rebuild runs in the migration's transaction: failing at its last step (the new trigger),
    after both tables were rebuilt, leaves the database at 0015 with its hex chain and its triggers."""
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
        assert _rows(engine) == rows and _stored_hashes(engine) == {(str, 64)}
        assert not {"trace_records_rebuilt", "chain_head_rebuilt"} & set(sa.inspect(engine).get_table_names())
        _assert_linear_chain_enforced(engine)
        _assert_append_only(engine)
        assert verify_chain(SqlAuditReads(store)).ok
    finally:
        engine.dispose()
