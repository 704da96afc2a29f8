"""Engines for every supported database (SPEC D1, D3, K4); their schema is `migration`'s."""

from __future__ import annotations

import contextvars
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

from harness.domain.errors import InvalidRequestError
from harness.ports import Tx

DEFAULT_SQLITE_FILE = "harness.db"
#: how long a SQLite writer waits for the write lock before "database is locked"
SQLITE_BUSY_TIMEOUT_MS = 60_000
#: execution option marking a connection that only reads (SQLite: a deferred BEGIN)
READ_ONLY = "harness_read_only"


#: the root of every error the database layer raises, for the edges (HTTP, CLI) that translate it
DatabaseError = sa.exc.SQLAlchemyError
_T = TypeVar("_T")
#: set around the checkout of a read that runs again if its connection is found dead (`read_retried`):
#: the pool's ping is skipped for it, and the checkout says so by appending to the list
_UNPINGED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar("harness_unpinged", default=None)
#: a pooled SQLite connection's record info key: opened while its file could not be written (read-only)
_OPENED_READ_ONLY = "harness_opened_read_only"
#: a pooled connection's record info key: made by this checkout, so nothing to ping yet
_FRESH = "harness_fresh"
#: errors that mean the database cannot be reached or refuses work now (down, connections dropped or
#: refused, read-only, locked, out of disk): retry later, not a bug of the request
_OUTAGES = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.InternalError, sa.exc.DisconnectionError,
            sa.exc.TimeoutError)


def is_outage(exc: BaseException) -> bool:
    """True when `exc` says the database is unavailable (a retry later may succeed)."""
    if isinstance(exc, _OUTAGES):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


def resolve_url(db: str | None) -> str:
    """Turn `--db` / HARNESS_DATABASE_URL into a SQLAlchemy URL; a plain path means SQLite."""
    value = db or os.environ.get("HARNESS_DATABASE_URL") or DEFAULT_SQLITE_FILE
    if "://" in value:
        try:
            sa.engine.make_url(value)
        except sa.exc.ArgumentError as exc:
            raise InvalidRequestError(f"database URL {value!r} is not valid: {exc}") from exc
        return value
    path = Path(value).expanduser().resolve()
    if path.is_dir():
        raise InvalidRequestError(f"database path {str(path)!r} is a directory, not a file")
    if not path.parent.exists():
        raise InvalidRequestError(f"database folder {str(path.parent)!r} does not exist")
    return f"sqlite:///{path}"


def create_engine(url: str, *, sqlite_synchronous: str | None = None) -> sa.Engine:
    """An engine configured so that concurrent writers serialize safely on every backend."""
    u = sa.engine.make_url(url)
    if u.get_backend_name() == "sqlite":
        return _sqlite_engine(url, sqlite_synchronous or os.environ.get("HARNESS_SQLITE_SYNCHRONOUS", "NORMAL"))
    # a server database's pool is sized for one process: the drive loop, the lease renewals, the
    # service's request threads and its housekeeping each hold a connection only inside a transaction,
    # and together they stay under pool + overflow, so the drive loop never queues behind the others.
    # The pool keeps what a busy process uses at once (~23 under a burst of Runs): a connection beyond it
    # is closed as it comes back and opened again a moment later, a new server process each time that
    # prepares every statement anew (with 10 kept: 164 sessions for 1,000 Runs, 2.5 ms more of the
    # server's CPU a Run; with 30: 24 sessions)
    kwargs: dict[str, Any] = {"future": True, "pool_size": _pool_setting("HARNESS_DB_POOL_SIZE", 30),
                              "max_overflow": _pool_setting("HARNESS_DB_MAX_OVERFLOW", 10)}
    if u.get_backend_name() in ("mysql", "mariadb"):
        kwargs["isolation_level"] = "READ COMMITTED"
        tls_options = any(key.startswith("ssl") for key in u.query)
        if u.get_driver_name() == "pymysql" and _loopback(u.host) and not tls_options:
            # PyMySQL builds a TLS context (loading every system CA, ~0.2 s) for each new connection
            # unless told not to; on loopback TLS protects nothing
            kwargs["connect_args"] = {"ssl_disabled": True}
        engine = sa.create_engine(url, **kwargs)
        sa.event.listen(engine, "connect", _mysql_session)
    else:
        engine = sa.create_engine(url, **kwargs)
    _ping_at_checkout(engine)
    return engine


def _pool_setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} must be a whole number, not {raw!r}") from None
    if not 0 <= value <= 1_000:
        raise InvalidRequestError(f"{name} must lie within 0-1000, not {value}")
    return value


def _ping_at_checkout(engine: sa.Engine) -> None:
    """SQLAlchemy's pre-ping, as a checkout event: a pooled connection is pinged as it is checked out and,
    when its session has ended (a terminated backend, a failover, a restart), replaced — with every
    connection pooled before it — so the caller's first statement runs on a live one. A connection the
    pool has just made is not pinged, and neither is the checkout of a read that runs again on a pinged
    connection if its own turns out dead (`read_retried`): the ping is a round trip of its own, at every
    checkout."""
    dialect = engine.dialect

    @sa.event.listens_for(engine.pool, "connect")
    def _made(_dbapi_connection: Any, record: Any) -> None:
        record.info[_FRESH] = True

    @sa.event.listens_for(engine.pool, "checkout")
    def _ping(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.pop(_FRESH, False):
            return
        unpinged = _UNPINGED.get()
        if unpinged is not None:
            unpinged.append(True)
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi_connection, None):
                raise sa.exc.InvalidatePoolError(str(exc)) from exc
            raise


def read_retried(engine: sa.Engine, read: Callable[[sa.Connection], _T]) -> _T:
    """`read(conn)` on a connection of `engine`, checked out without the pool's ping; when that connection
    turns out dead (its session ended while it sat in the pool), `read` runs once more, on a pinged one.
    Only for reads outside a transaction, which can run twice: a read that joins a drive's open
    transaction, or runs on a new connection, is never run again."""
    unpinged: list[bool] = []
    token = _UNPINGED.set(unpinged)
    try:
        opened = engine.connect()
    finally:
        _UNPINGED.reset(token)
    with opened as conn:
        try:
            return read(conn)
        except sa.exc.DBAPIError as exc:
            # a failure of the connection, not of the read (bad SQL, a constraint): its session may have
            # ended before the driver marked it so (a socket closed right after a termination); a read
            # that can run twice loses nothing by running again if it was not
            if not unpinged or not is_outage(exc):
                raise
            conn.invalidate()  # never handed out again
    with engine.connect() as conn:
        return read(conn)


def write_retried(engine: sa.Engine, write: Callable[[sa.Connection], _T]) -> _T:
    """`write(conn)` committed on its own, for one statement that sets values and can run twice with the
    same outcome (a lease's renewal): checked out without the pool's ping, and run once more on a pinged
    connection when its own turns out dead, as `read_retried` does. On PostgreSQL the statement runs in
    autocommit, one round trip where ping, BEGIN, the statement and COMMIT were four. `engine` is
    `autocommit_writes(engine)`."""

    def once(conn: sa.Connection) -> _T:
        value = write(conn)
        conn.commit()  # PostgreSQL (autocommit): nothing to send; elsewhere the statement's COMMIT
        return value

    return read_retried(engine, once)


def autocommit_writes(engine: sa.Engine) -> sa.Engine:
    """The engine's view for `write_retried`: autocommit on PostgreSQL, the engine itself elsewhere (a
    SQLite write takes the write lock with its BEGIN IMMEDIATE; MariaDB's transactions stay explicit)."""
    if engine.dialect.name == "postgresql":
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine


def read_only(engine: sa.Engine) -> sa.Engine:
    """The engine's view for connections that only read.

    SQLite: a deferred BEGIN (a WAL snapshot, without queueing behind writers). PostgreSQL: autocommit.
    Under its READ COMMITTED every statement reads its own snapshot inside a transaction too, so a read
    sees exactly what it did; what goes is the BEGIN and the ROLLBACK around it (two round trips each
    time) and the rollback's toll on the driver: psycopg forgets its prepared statements at every
    ROLLBACK (sending DEALLOCATE ALL), so before this no statement of a Run stayed prepared. A reader
    that needs one snapshot across statements asks for REPEATABLE READ on its connection.
    """
    options: dict[str, Any] = {READ_ONLY: True}
    if engine.dialect.name == "postgresql":
        options["isolation_level"] = "AUTOCOMMIT"
    return engine.execution_options(**options)


def _loopback(host: str | None) -> bool:
    return host in (None, "", "localhost", "::1") or str(host).startswith("127.")


#: how long a GROUP_CONCAT may grow on a MySQL/MariaDB session (4 MB; the servers' default is 1 MB or 1 KB)
GROUP_CONCAT_MAX_LEN = 4 * 1024 * 1024


def _mysql_session(dbapi_connection: Any, _record: Any) -> None:
    """Make MySQL/MariaDB behave as the SQL standard (and PostgreSQL, SQLite) on two points the store
    relies on: a too-long value is an error, never silently truncated (a tenant id cut short would be
    another tenant); and in `UPDATE … SET a = …, b = f(a)` every expression reads the old row
    (MariaDB's SIMULTANEOUS_ASSIGNMENT; MySQL has no such mode and reads the new `a`)."""
    cursor = dbapi_connection.cursor()
    cursor.execute("SELECT VERSION()")
    modes = ["STRICT_ALL_TABLES"]
    if "mariadb" in str(cursor.fetchone()[0]).lower():
        modes.append("SIMULTANEOUS_ASSIGNMENT")
    # group_concat_max_len: a memory recall lists its window's entries in one GROUP_CONCAT (adapters.sql.memory)
    cursor.execute(f"SET SESSION sql_mode = CONCAT_WS(',', @@sql_mode, '{','.join(modes)}'), "
                   f"group_concat_max_len = {GROUP_CONCAT_MAX_LEN}")
    cursor.close()


def _use_wal(cursor: Any) -> None:
    """Put the database in WAL mode (it stays so), waiting for other connections as a writer would.

    The switch needs the database to itself, and SQLite answers "database is locked" at once, without
    its busy timeout, when another connection's write transaction holds the lock (waiting could
    deadlock): processes opening a database that others use retry here, up to the busy timeout. A
    database already in WAL mode (the usual case) is only read."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def _sqlite_engine(url: str, synchronous: str) -> sa.Engine:
    if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise InvalidRequestError(f"HARNESS_SQLITE_SYNCHRONOUS must be NORMAL, FULL or EXTRA, not {synchronous!r}")
    # every use of a pooled connection goes through a SQLAlchemy Connection, which commits or rolls back
    # its own transaction before it returns the connection: the pool's extra rollback on return would be
    # a second, empty one on every transaction of the hot path
    engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False},
                              pool_reset_on_return=None)
    file = sa.engine.make_url(url).database or ""
    on_disk = file not in ("", ":memory:") and not file.startswith("file:")

    @sa.event.listens_for(engine.pool, "connect")
    def _opened(_dbapi_connection: Any, record: Any) -> None:
        # SQLite opens a file it may not write read-only, and the connection stays so after the file is
        # writable again (an outage over: a full disk, a read-only mount, an immutable file)
        if on_disk and os.path.exists(file) and not os.access(file, os.W_OK):
            record.info[_OPENED_READ_ONLY] = True

    @sa.event.listens_for(engine.pool, "checkout")
    def _writable(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.get(_OPENED_READ_ONLY) and os.access(file, os.W_OK):
            # replaced by the pool (with every connection pooled before it): its writes would fail for good
            raise sa.exc.DisconnectionError(f"opened while {file} could not be written, which it now can")

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves: pysqlite's implicit BEGIN is DEFERRED, which turns
        # concurrent writers into "database is locked" errors instead of waiting (SPEC K4).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _use_wal(cursor)
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # writers take the write lock up front and queue on the busy timeout; connections marked
        # read-only (SqlStore.reader) read a WAL snapshot without queueing behind writers
        # straight on the driver: exec_driver_sql runs SQLAlchemy's whole execution path (context, events,
        # result) for a statement that returns nothing, on every transaction
        begin = "BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE"
        driver = conn.connection.driver_connection
        assert driver is not None  # a live pooled connection always has its driver connection
        driver.execute(begin)

    return engine


def connection_of(tx: Tx) -> sa.Connection:
    """The SQL connection behind a transaction handle the pipeline carried back to an adapter."""
    if not isinstance(tx, sa.Connection):
        raise TypeError(f"expected a transaction of the SQL store, got {type(tx).__name__}")
    return tx
