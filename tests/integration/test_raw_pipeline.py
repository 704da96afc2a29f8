"""Writes sent with the next statement (PostgreSQL's pipeline mode, `RawStatements.later`) behave exactly
as writes sent at once, on every backend: a later read sees them, a failure rolls their transaction back
and is raised before the commit succeeds, a savepoint undoes only its own, a rollback drops them, and
nothing queued ever leaks into the next transaction of a pooled connection."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.raw import RawStatements, has_queued
from harness.adapters.sql.store import SqlStore
from harness.adapters.sql.units import guarded
from harness.audit.verify import verify_chain
from harness.domain.records import TraceRecordIn

_meta = sa.MetaData()
probe = sa.Table("pipeline_probe", _meta, sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
                 sa.Column("note", sa.String(40)))
INSERT = probe.insert()
COUNT = sa.select(sa.func.count()).select_from(probe)


@pytest.fixture
def engine(backend_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(resolve_url(backend_url))
    RawStatements(engine.dialect).install(engine)
    _meta.create_all(engine)
    yield engine
    _meta.drop_all(engine)
    engine.dispose()


def _notes(engine: sa.Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [(r.id, r.note) for r in conn.execute(sa.select(probe).order_by(probe.c.id))]


def test_a_queued_write_is_seen_by_the_next_read_raw_or_not(engine: sa.Engine) -> None:
    raw = RawStatements(engine.dialect)
    with engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 1, "note": "one"})
        raw.later_many(conn, INSERT, [{"id": 2, "note": "two"}, {"id": 3, "note": "three"}])
        assert raw.fetchone(conn, COUNT)[0] == 3  # a raw read sends them first
        raw.later(conn, INSERT, {"id": 4, "note": "four"})
        assert conn.execute(COUNT).scalar() == 4  # so does a statement SQLAlchemy sends
        raw.later(conn, INSERT, {"id": 5, "note": "five"})
    assert [i for i, _ in _notes(engine)] == [1, 2, 3, 4, 5]  # and the commit


def test_a_failing_queued_write_fails_its_transaction_before_it_commits(engine: sa.Engine) -> None:
    raw = RawStatements(engine.dialect)
    with engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 1, "note": "kept"})
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 2, "note": "lost with its transaction"})
        raw.later(conn, INSERT, {"id": 1, "note": "duplicate"})
    assert _notes(engine) == [(1, "kept")]


def test_a_savepoint_undoes_only_the_queued_writes_made_inside_it(engine: sa.Engine) -> None:
    raw = RawStatements(engine.dialect)
    with engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 1, "note": "before"})
        with pytest.raises(sa.exc.IntegrityError), raw.savepoint(conn, "probe"):
            raw.later(conn, INSERT, {"id": 2, "note": "inside"})
            raw.later(conn, INSERT, {"id": 1, "note": "duplicate inside"})
        nested = conn.begin_nested()
        raw.later(conn, INSERT, {"id": 3, "note": "undone by SQLAlchemy's savepoint"})
        nested.rollback()
        raw.later(conn, INSERT, {"id": 4, "note": "after"})
    assert _notes(engine) == [(1, "before"), (4, "after")]


def test_a_rollback_drops_the_queued_writes_and_the_connection_starts_clean(engine: sa.Engine) -> None:
    raw = RawStatements(engine.dialect)
    conn = engine.connect()
    tx = conn.begin()
    raw.later(conn, INSERT, {"id": 1, "note": "rolled back"})
    dbapi = conn.connection.dbapi_connection
    tx.rollback()
    assert not has_queued(dbapi)
    with conn.begin():
        raw.later(conn, INSERT, {"id": 2, "note": "committed"})
    conn.close()
    # a connection returned to the pool with writes still queued (its transaction never ended) sends
    # none of them to the next user
    conn = engine.connect()
    conn.begin()
    raw.later(conn, INSERT, {"id": 3, "note": "abandoned"})
    conn.close()
    with engine.begin() as again:
        raw.later(again, INSERT, {"id": 4, "note": "next user"})
    assert _notes(engine) == [(2, "committed"), (4, "next user")]


def test_outside_a_transaction_nothing_waits(engine: sa.Engine) -> None:
    """An autocommit connection's write is its own transaction: it is sent at once."""
    raw = RawStatements(engine.dialect)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        raw.later(conn, INSERT, {"id": 1, "note": "at once"})
        assert not has_queued(conn.connection.dbapi_connection)
    assert _notes(engine) == [(1, "at once")]


@pytest.fixture
def store(backend_url: str) -> Iterator[SqlStore]:
    """A store (whose units of work guarded() joins) with the probe table."""
    store = SqlStore.open(backend_url)
    _meta.create_all(store.engine)
    yield store
    _meta.drop_all(store.engine)
    store.close()


def test_a_queued_write_that_fails_inside_a_guarded_block_undoes_only_that_block(store: SqlStore) -> None:
    """guarded() (a savepoint inside a drive's unit of work, for writes whose failure the caller survives)
    sends what its block queued before the savepoint ends: the failure is the block's alone, and the
    drive's transaction goes on and commits."""
    raw = RawStatements(store.engine.dialect)
    with store.unit("run-1"):
        with store.engine.begin() as conn:
            raw.later(conn, INSERT, {"id": 1, "note": "the drive's"})
        with pytest.raises(sa.exc.IntegrityError), guarded(store.engine, write=True) as conn:
            raw.later(conn, INSERT, {"id": 2, "note": "the block's, undone"})
            raw.later(conn, INSERT, {"id": 1, "note": "duplicate"})
        with store.engine.begin() as conn:
            raw.later(conn, INSERT, {"id": 3, "note": "after the block"})
    assert _notes(store.engine) == [(1, "the drive's"), (3, "after the block")]


def test_reads_made_together_answer_as_reads_made_one_after_the_other(engine: sa.Engine) -> None:
    """fetch_each / mappings_each: each read's rows, in order, the writes queued before them seen."""
    raw = RawStatements(engine.dialect)
    by_id = sa.select(probe.c.id, probe.c.note).where(probe.c.id == sa.bindparam("p_id"))
    with engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 1, "note": "one"})
        raw.later(conn, INSERT, {"id": 2, "note": "two"})
        counted, first, missing = raw.fetch_each(conn, (COUNT, None), (by_id, {"p_id": 1}), (by_id, {"p_id": 9}))
        assert (counted, first, missing) == ([(2,)], [(1, "one")], [])
        assert raw.mappings_each(conn, (by_id, {"p_id": 2})) == [[{"id": 2, "note": "two"}]]


def test_a_read_made_together_that_fails_fails_its_transaction(engine: sa.Engine) -> None:
    """An error in any of the reads (or in a write queued before them) is raised, translated as
    SQLAlchemy translates it, and the transaction rolls back."""
    raw = RawStatements(engine.dialect)
    with engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 1, "note": "kept"})
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 2, "note": "lost with its transaction"})
        raw.later(conn, INSERT, {"id": 1, "note": "duplicate"})
        raw.fetch_each(conn, (COUNT, None), (COUNT, None))
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 3, "note": "lost with its transaction"})
        raw.fetch_each(conn, (COUNT, None), (sa.select(sa.text("no_such_column")).select_from(probe), None))
    assert _notes(engine) == [(1, "kept")]


def test_writes_queued_before_a_savepoint_that_fail_are_not_the_blocks(engine: sa.Engine) -> None:
    """The SAVEPOINT goes with the writes waiting before it: their failure is raised as the savepoint
    opens, before its block runs, so a caller that survives its block's failure does not swallow it."""
    raw = RawStatements(engine.dialect)
    with engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 1, "note": "kept"})
    ran = []
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 1, "note": "duplicate, before the savepoint"})
        with raw.savepoint(conn, "probe"):
            ran.append("the block")
    assert ran == [] and _notes(engine) == [(1, "kept")]


def test_a_savepoint_whose_block_sends_nothing_leaves_the_transaction_as_it_was(engine: sa.Engine) -> None:
    raw = RawStatements(engine.dialect)
    with engine.begin() as conn:
        with raw.savepoint(conn, "probe"):
            pass
        with pytest.raises(RuntimeError), raw.savepoint(conn, "probe"):
            raise RuntimeError("nothing sent yet")
        raw.later(conn, INSERT, {"id": 1, "note": "after"})
        with raw.savepoint(conn, "probe"):  # the RELEASE waits for the next statement
            raw.later(conn, INSERT, {"id": 2, "note": "inside"})
        assert raw.fetchone(conn, COUNT)[0] == 2
    assert _notes(engine) == [(1, "after"), (2, "inside")]


def test_nested_guarded_blocks_each_undo_only_themselves(store: SqlStore) -> None:
    """A guarded block inside another has a savepoint of its own (MySQL replaces a savepoint of the same
    name): the outer block's failure after the inner one succeeded undoes both, and the drive's writes stay."""
    raw = RawStatements(store.engine.dialect)
    with store.unit("run-1"):
        with store.engine.begin() as conn:
            raw.later(conn, INSERT, {"id": 1, "note": "the drive's"})
        with pytest.raises(sa.exc.IntegrityError), guarded(store.engine, write=True) as outer:
            raw.later(outer, INSERT, {"id": 2, "note": "outer, undone"})
            with guarded(store.engine, write=True) as inner:
                raw.later(inner, INSERT, {"id": 3, "note": "inner, undone with the outer"})
            raw.later(outer, INSERT, {"id": 1, "note": "duplicate"})
        with store.engine.begin() as conn:
            raw.later(conn, INSERT, {"id": 4, "note": "after the block"})
    assert _notes(store.engine) == [(1, "the drive's"), (4, "after the block")]


@pytest.mark.parametrize("count", [1, 18, 300])
def test_many_rows_are_written_in_their_order_queued_or_at_once(engine: sa.Engine, count: int) -> None:
    """Many rows are written exactly as given, in their order, whether they wait for the next statement
    (on PostgreSQL, in the pipeline) or go at once."""
    raw = RawStatements(engine.dialect)
    rows = [{"id": i, "note": f"row {i}"} for i in range(count)]
    with engine.begin() as conn:
        raw.later_many(conn, INSERT, rows[: count // 2])
        raw.executemany(conn, INSERT, [{"id": 1000 + i, "note": f"row {1000 + i}"} for i in range(count)])
        raw.later_many(conn, INSERT, rows[count // 2:])
    expected = sorted([(i, f"row {i}") for i in range(count)] + [(1000 + i, f"row {1000 + i}") for i in range(count)])
    assert _notes(engine) == expected


def test_a_row_that_fails_among_many_writes_none_of_its_transaction(engine: sa.Engine) -> None:
    raw = RawStatements(engine.dialect)
    with engine.begin() as conn:
        raw.later(conn, INSERT, {"id": 7, "note": "kept"})
    for write in (raw.later_many, raw.executemany):
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            write(conn, INSERT, [{"id": i, "note": "lost with its transaction"} for i in range(20)])
    assert _notes(engine) == [(7, "kept")]


def test_a_long_batch_of_records_chains_in_one_drain(backend_url: str) -> None:
    """A drain of hundreds of records links each to the one before it (the linear-chain trigger passes
    every one) and the chain verifies."""
    store = SqlStore.open(backend_url)
    try:
        store.drain()
        store.record([TraceRecordIn("note", {"n": i}, None) for i in range(700)])
        assert store.drain(batch_size=1000) == 700
        assert store.outbox_backlog() == 0
        report = verify_chain(SqlAuditReads(store))
        assert report.ok, report
    finally:
        store.close()


def test_a_drain_takes_its_batch_from_the_outbox_and_nothing_else(backend_url: str) -> None:
    """A batch smaller than the outbox chains the oldest records and removes exactly those from the outbox;
    the rest wait, in order, for the next drain."""
    store = SqlStore.open(backend_url)
    try:
        store.drain_all()
        store.record([TraceRecordIn("note", {"n": i}, None) for i in range(10)])
        assert store.drain(batch_size=4) == 4
        assert store.outbox_backlog() == 6
        with store.engine.connect() as conn:
            left = [json.loads(p)["n"] for p in conn.execute(
                sa.select(t.outbox.c.payload).order_by(t.outbox.c.id)).scalars()]
        assert left == list(range(4, 10))
        assert store.drain(batch_size=4) == 4 and store.outbox_backlog() == 2
        assert store.drain(batch_size=4) == 2 and store.outbox_backlog() == 0
        assert verify_chain(SqlAuditReads(store)).ok
    finally:
        store.close()
