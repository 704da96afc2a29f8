"""Engines for every supported database, and schema migration on first use (SPEC D1, D3, K4)."""

from __future__ import annotations

import contextvars
import logging
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from harness.domain.errors import InvalidRequestError, StoreError
from harness.ports import Tx

if TYPE_CHECKING:
    from alembic.config import Config

DEFAULT_SQLITE_FILE = "harness.db"
#: how long a SQLite writer waits for the write lock before "database is locked"
SQLITE_BUSY_TIMEOUT_MS = 60_000
#: execution option marking a connection that only reads (SQLite: a deferred BEGIN)
READ_ONLY = "harness_read_only"
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


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
    cursor.execute(f"SET SESSION sql_mode = CONCAT_WS(',', @@sql_mode, '{','.join(modes)}')")
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


def _alembic_config(connection: sa.Connection | None = None) -> Config:
    from alembic.config import Config  # alembic loads only when a schema is migrated

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str | None:
    """The newest migration this version of harness ships."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


_REVISION_LINE = re.compile(r'^(down_revision|revision) = (None|"[^"]*")$', re.M)


@cache
def shipped_revisions() -> frozenset[str] | None:
    """Every migration this version of harness ships, read from the version files without alembic; None
    when the files are not one plain line of revisions (alembic is asked instead)."""
    line = _shipped_line()
    return None if line is None else frozenset(line[0])


def shipped_head() -> str | None:
    """The newest migration as the version files say it, read without alembic (which costs every process
    ~10 MB and a fraction of a second to load): None when the files are not one plain line of revisions
    (a merge, a branch, a value written another way), and alembic is asked instead."""
    line = _shipped_line()
    return None if line is None else line[1]


@cache
def _shipped_line() -> tuple[set[str], str] | None:
    revisions, parents = set(), set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        found = dict(_REVISION_LINE.findall(path.read_text(encoding="utf-8")))
        if "revision" not in found or "down_revision" not in found:
            return None
        revisions.add(found["revision"].strip('"'))
        parents.add(found["down_revision"].strip('"'))
    heads = revisions - parents
    return (revisions, heads.pop()) if len(heads) == 1 else None


def _known_revisions() -> frozenset[str]:
    shipped = shipped_revisions()
    if shipped is not None:
        return shipped
    from alembic.script import ScriptDirectory

    return frozenset(s.revision for s in ScriptDirectory.from_config(_alembic_config()).walk_revisions())


def refuse_unknown_schema(conn: sa.Connection) -> None:
    """StoreError when the database's schema is at a revision this version of harness does not ship: a newer
    harness-kernel migrated it. Upgrading it from there cannot work, and running on a schema this code was
    not written for could damage Runs, so nothing is done and the error says what to run instead."""
    unknown = [r for r in _current_revisions(conn) if r not in _known_revisions()]
    if unknown:
        newest = shipped_head() or head_revision()
        raise StoreError(
            f"the database's schema is at revision {', '.join(unknown)}, which this version of harness-kernel "
            f"does not know (its newest is {newest}): a newer harness-kernel has migrated this database. Run "
            "that version (or a later one) against it; nothing was changed")


def _current_revisions(conn: sa.Connection) -> list[str]:
    """The revisions the database's alembic_version table holds (none: a new database)."""
    if not sa.inspect(conn).has_table("alembic_version"):
        return []
    return [row[0] for row in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]


def _is_current(conn: sa.Connection) -> bool:
    """Whether the schema is at the newest migration, checked without alembic when the files allow it."""
    head = shipped_head()
    if head is not None:
        return _current_revisions(conn) == [head]
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision() == head_revision()


#: key of the advisory lock that lets one process at a time migrate a database
_MIGRATION_LOCK = 0x6861726E  # "harn"
#: MySQL's named locks are server-wide: one per database (a name may have at most 64 characters)
_MYSQL_LOCK_NAME = "CONCAT('harness_migrate_', MD5(DATABASE()))"


def migrate(engine: sa.Engine) -> None:
    """Bring the schema up to the newest migration; a no-op when it already is.

    Workers that start together on a new database take turns through a database lock (SQLite's write
    lock, PostgreSQL's advisory lock, MySQL's named lock); each re-reads the version once it holds it,
    so one migrates and the others find the schema current. A schema a newer harness-kernel migrated is
    refused with StoreError (`refuse_unknown_schema`), before anything is written.
    """
    with engine.connect() as conn:
        if _is_current(conn):
            return
        refuse_unknown_schema(conn)
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    head = shipped_head() or head_revision()  # alembic's upgrade loads the version files once more itself
    with engine.begin() as conn:
        dialect = conn.dialect.name
        if dialect == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        elif dialect in ("mysql", "mariadb"):
            conn.execute(sa.text(f"SELECT GET_LOCK({_MYSQL_LOCK_NAME}, 600)"))
        try:
            if MigrationContext.configure(conn).get_current_revision() != head:
                refuse_unknown_schema(conn)  # another process may have migrated it meanwhile, with a newer version
                command.upgrade(_alembic_config(conn), "head")
        finally:
            if dialect in ("mysql", "mariadb"):  # a session lock: MySQL's DDL commits as it goes
                conn.execute(sa.text(f"SELECT RELEASE_LOCK({_MYSQL_LOCK_NAME})"))


def migrate_apart(engine: sa.Engine) -> None:
    """`migrate`, with the migration itself made by a short-lived child process when there is one to make.

    For the long-running processes (`harness serve`, `harness worker`): alembic and the migration's work
    cost a process ~16 MB that it never gives back, and those processes would carry them for as long as they
    run. A schema that is already current costs one read here, as in `migrate`; a new database (or one an
    upgrade of harness left behind) is migrated by `python -m harness.adapters.sql.migrate_apart`, which gets
    the URL in its environment (not on its command line, where other users could read a password). An
    in-memory SQLite database lives only in this process, so it is migrated here."""
    with engine.connect() as conn:
        if _is_current(conn):
            return
        refuse_unknown_schema(conn)
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        migrate(engine)
        return
    env = {**os.environ, MIGRATE_URL_ENV: url.render_as_string(hide_password=False),
           "PYTHONPATH": os.pathsep.join(p for p in (str(MIGRATIONS_DIR.parents[1]), os.environ.get("PYTHONPATH"))
                                         if p)}
    done = subprocess.run([sys.executable, "-m", "harness.adapters.sql.migrate_apart"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    reason = f"it exited with status {done.returncode}"
    for line in done.stderr.splitlines():
        name, tab, message = line.partition("\t")
        if name == "error" and tab:
            reason = message
        elif tab:  # a log record of the migration, as `migrate` in this process would have logged it
            logging.getLogger(name).info("%s", message)
        elif line.strip():  # not one of its lines (Python could not start it, say): the reason
            reason = line.strip()
    if done.returncode != 0:
        raise StoreError(f"migrating the database's schema failed: {reason}")


#: the environment variable that gives `python -m harness.adapters.sql.migrate_apart` the database's URL
MIGRATE_URL_ENV = "HARNESS_MIGRATE_URL"


def connection_of(tx: Tx) -> sa.Connection:
    """The SQL connection behind a transaction handle the pipeline carried back to an adapter."""
    if not isinstance(tx, sa.Connection):
        raise TypeError(f"expected a transaction of the SQL store, got {type(tx).__name__}")
    return tx
