"""On PostgreSQL a pooled connection whose session the server ended (a terminated backend, a failover, the
server restarting) is replaced at checkout, so the caller's first statement runs on a live connection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from harness.adapters.sql.database import create_engine, resolve_url

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
    held = [engine.connect() for _ in range(3)]
    pids = [int(c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()) for c in held]
    for conn in held:
        conn.close()
    for pid in pids:
        _terminate(pid)
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
