"""On PostgreSQL a pooled connection whose session the server ended (a terminated backend, a failover, the
server restarting) is replaced at checkout, so the caller's first statement runs on a live connection; a
read that can run twice skips that checkout's ping and runs again on a live connection instead."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from harness.adapters.sql.database import create_engine, read_retried, resolve_url
from harness.adapters.sql.units import Units, joining
from harness.domain.errors import InvalidRequestError

from .conftest import PG_ADMIN

BACKENDS = ["postgresql"]


@pytest.fixture
def engine(backend_url: str) -> Iterator[sa.Engine]:
    e = create_engine(resolve_url(backend_url))
    yield e
    e.dispose()


@pytest.fixture
def pings(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ping the engine's dialect sends, in order."""
    sent: list[Any] = []
    ping = engine.dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        sent.append(dbapi_connection)
        return ping(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    return sent


def _backend_pid(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(pid: int, *, wait: bool = True) -> None:
    """End the session as an operator or a failover would; with `wait`, until its backend is gone."""
    with psycopg.connect(PG_ADMIN.replace("+psycopg", ""), autocommit=True) as admin:
        timeout = 10000 if wait else 0
        assert admin.execute("SELECT pg_terminate_backend(%s, %s)", (pid, timeout)).fetchone() == (True,)


def _terminate_pooled_sessions(engine: sa.Engine, n: int) -> list[int]:
    """Pool `n` sessions, then end them all, as a restart or failover does; their backend pids."""
    held = [engine.connect() for _ in range(n)]
    pids = [int(c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()) for c in held]
    for conn in held:
        conn.close()
    for pid in pids:
        _terminate(pid)
    return pids


def test_a_terminated_session_is_replaced_at_checkout(engine: sa.Engine, pings: list[Any]) -> None:
    """The pooled connection whose backend was terminated is discarded at checkout; the caller's first
    statement, a write in a transaction, runs on a new session and nothing fails."""
    dead = _backend_pid(engine)
    _terminate(dead)
    with engine.begin() as conn:
        assert int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()) != dead
        conn.execute(sa.text("CREATE TEMPORARY TABLE probe (x int)"))
    assert len(pings) <= 1  # a socket with the server's goodbye on it is pinged once, then dropped
    assert _backend_pid(engine) != dead


def test_every_pooled_session_terminated_at_once_is_replaced(engine: sa.Engine) -> None:
    """A restart or failover ends every session: each pooled connection is replaced as it is checked
    out, however many there are."""
    pids = _terminate_pooled_sessions(engine, 3)
    again = [engine.connect() for _ in range(3)]
    try:
        now = {int(c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()) for c in again}
    finally:
        for conn in again:
            conn.close()
    assert len(now) == 3 and not now & set(pids)



def test_a_session_terminated_a_moment_before_the_checkout_is_replaced(engine: sa.Engine) -> None:
    """The checkout right after the termination, before the server has closed the socket (the window a
    check of the socket alone misses, and the chaos test once hit): the caller's read still succeeds."""
    for _ in range(20):
        dead = _backend_pid(engine)
        _terminate(dead, wait=False)
        assert _backend_pid(engine) != dead


def _pid_read(calls: list[int]) -> Any:
    """A read of the session's backend pid that counts its runs."""
    def read(conn: sa.Connection) -> int:
        calls.append(1)
        return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
    return read


def test_a_read_that_can_run_twice_is_checked_out_without_a_ping(engine: sa.Engine, pings: list[Any]) -> None:
    """The checkout of a read that runs again if its connection was dead sends no ping, and on a live
    connection the read runs once, on the pooled session; any other checkout is still pinged."""
    calls: list[int]
    pid, calls = _backend_pid(engine), []
    pings.clear()
    assert read_retried(engine, _pid_read(calls)) == pid
    assert (calls, pings) == ([1], [])
    _backend_pid(engine)
    assert len(pings) == 1


def test_a_read_on_a_session_terminated_a_moment_before_runs_again_on_a_live_one(engine: sa.Engine) -> None:
    """The window of the checkout right after a termination (the server has not closed the socket yet), and
    every pooled session terminated at once (a failover): the read fails on the dead connection, which
    is discarded, and runs once more on a live session; nothing reaches the caller but the answer."""
    calls: list[int]
    for _ in range(10):
        dead, calls = _backend_pid(engine), []
        _terminate(dead, wait=False)
        assert read_retried(engine, _pid_read(calls)) != dead
        assert len(calls) in (1, 2)  # 1: the termination had not yet ended the session when the read ran
    pids = _terminate_pooled_sessions(engine, 3)
    calls = []
    assert read_retried(engine, _pid_read(calls)) not in pids and calls == [1, 1]
    assert _backend_pid(engine) not in pids


def test_a_read_that_fails_for_another_reason_is_not_run_again(engine: sa.Engine) -> None:
    """Only a dead connection makes a read run again: a read the database refuses fails at once, once."""
    calls: list[int] = []

    def bad(conn: sa.Connection) -> None:
        calls.append(1)
        conn.execute(sa.text("SELECT * FROM no_such_table"))

    with pytest.raises(sa.exc.ProgrammingError, match="no_such_table"):
        read_retried(engine, bad)
    assert calls == [1]


def test_a_read_in_a_drives_open_transaction_is_never_run_again(engine: sa.Engine) -> None:
    """Inside a drive's open transaction a read joins it (no checkout of its own): if that session dies the
    transaction is gone, and running the read again elsewhere would hide it, so the error is the caller's."""
    units = Units(engine)
    joined = joining(engine, units)
    calls: list[int] = []
    with units.unit("run-1"):
        with joined.begin() as conn:
            conn.execute(sa.text("CREATE TEMPORARY TABLE probe (x int)"))
            pid = int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
        _terminate(pid)
        with pytest.raises(sa.exc.OperationalError):
            read_retried(joined, _pid_read(calls))
    assert calls == [1]


def _leases(engine: sa.Engine) -> tuple[Any, Any, Any]:
    from harness.adapters.sql.leases import Leases
    from harness.adapters.sql.store import SqlStore
    from harness.domain.records import NewRun

    store = SqlStore(engine)
    leases = Leases(store, ttl_s=30)
    run, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    lease = leases.acquire(run.run_id, "driver-a")
    assert lease is not None
    return store, leases, lease


def _statements(engine: sa.Engine) -> list[str]:
    """Every statement psycopg sends from now on, BEGIN and COMMIT included (its own, not SQLAlchemy's)."""
    sent: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement.split(None, 1)[0].upper())

    @sa.event.listens_for(engine, "begin")
    def _begun(conn: sa.Connection) -> None:
        driver = conn.connection.driver_connection
        assert driver is not None
        if not driver.autocommit:
            sent.append("BEGIN")

    @sa.event.listens_for(engine, "commit")
    def _committed(conn: sa.Connection) -> None:
        driver = conn.connection.driver_connection
        assert driver is not None
        if not driver.autocommit:
            sent.append("COMMIT")

    return sent


def test_a_lease_renewal_is_one_statement_without_a_ping(engine: sa.Engine, pings: list[Any]) -> None:
    """A renewal sets the lease's expiry and its waiting mark, which it can do twice with the same outcome:
    it runs alone in autocommit on a connection checked out without a ping (the four round trips of ping,
    BEGIN, UPDATE and COMMIT are one), and the Run's row says what it wrote."""
    _store, leases, lease = _leases(engine)
    pings.clear()
    sent = _statements(engine)
    renewed = leases.heartbeat(lease, waiting=True)
    assert renewed is not None and renewed.expires_at > lease.expires_at
    assert (sent, pings) == (["UPDATE"], [])
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT lease_waiting, lease_expires_at FROM runs WHERE run_id = :r"),
                           {"r": lease.run_id}).one()
    assert (row[0], float(row[1])) == (1, renewed.expires_at)


def test_a_lease_renewal_on_a_session_terminated_a_moment_before_runs_again(engine: sa.Engine) -> None:
    """The renewal's connection had its session ended just before (a failover): the renewal runs once more
    on a live one and the lease is renewed, not lost."""
    _store, leases, lease = _leases(engine)
    for _ in range(10):
        _terminate(_backend_pid(engine), wait=False)
        renewed = leases.heartbeat(lease)
        assert renewed is not None
        lease = renewed
    _terminate_pooled_sessions(engine, 3)
    assert leases.heartbeat(lease) is not None


def _lease_row(engine: sa.Engine, run_id: str) -> tuple[int, float]:
    """The Run's committed waiting mark and lease expiry, read on a session of its own."""
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as other:
        row = other.execute("SELECT lease_waiting, lease_expires_at FROM runs WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def test_a_lease_renewal_in_a_drives_open_transaction_goes_with_it(engine: sa.Engine) -> None:
    """Inside the drive's open transaction (which holds the Run's row) the renewal joins it rather than
    wait for that row on a connection of its own: it is seen once the drive commits, not before."""
    store, leases, lease = _leases(engine)
    before = (0, float(lease.expires_at))
    with store.unit(lease.run_id):
        with store.engine.begin() as conn:  # the drive writes: its transaction holds the Run's row
            conn.execute(sa.text("UPDATE runs SET stall_count = stall_count WHERE run_id = :r"), {"r": lease.run_id})
        renewed = leases.heartbeat(lease, waiting=True)  # no wait on its own row
        assert renewed is not None
        assert _lease_row(engine, lease.run_id) == before
    assert _lease_row(engine, lease.run_id) == (1, renewed.expires_at)


def _burst(engine: sa.Engine, n: int) -> set[int]:
    """`n` connections in use at once, as a busy moment of the drive loop has them; their backend pids."""
    held = [engine.connect() for _ in range(n)]
    try:
        return {int(c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()) for c in held}
    finally:
        for conn in held:
            conn.close()


def test_the_pool_keeps_the_connections_a_busy_moment_uses(engine: sa.Engine) -> None:
    """A burst of 25 connections at once (a burst of Runs uses ~23), then another: the second finds the
    first's sessions kept, none closed on its return and opened again (each a new server process that
    prepares every statement anew). Beyond the kept 30, 10 more may be opened, and no more."""
    first = _burst(engine, 25)
    assert _burst(engine, 25) == first
    assert engine.pool.size() == 30 and engine.pool._max_overflow == 10  # type: ignore[attr-defined]


def test_the_pool_is_set_by_its_two_settings_and_a_bad_value_is_named(backend_url: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_DB_POOL_SIZE", "5")
    monkeypatch.setenv("HARNESS_DB_MAX_OVERFLOW", "0")
    engine = create_engine(resolve_url(backend_url))
    try:
        assert engine.pool.size() == 5 and engine.pool._max_overflow == 0  # type: ignore[attr-defined]
    finally:
        engine.dispose()
    monkeypatch.setenv("HARNESS_DB_POOL_SIZE", "many")
    with pytest.raises(InvalidRequestError, match="HARNESS_DB_POOL_SIZE must be a whole number, not 'many'"):
        create_engine(resolve_url(backend_url))
