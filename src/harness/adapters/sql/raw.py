"""The kernel's hot statements, compiled once per dialect and run on the DBAPI cursor (perf, issue 9).

SQLAlchemy's per-call execution machinery (statement-cache lookup, execution context, events, result
wrapping) costs several times what SQLite takes to run these small statements, and a Run makes ~50 of
them. Each statement is still built with SQLAlchemy Core (statements.py) and compiled by the engine's
own dialect, so the SQL and the paramstyle are what conn.execute() would send, and driver errors are
translated exactly as SQLAlchemy translates them (IntegrityError stays IntegrityError). Only statements
whose parameters need no bind processing (str, int, float, None) may go through here.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

_T = TypeVar("_T")
_Compiled = tuple[str, tuple[str, ...] | None, dict[str, Any]]
#: a write sent later: its SQL, its arguments, and whether they are many rows (executemany)
_Queued = tuple[str, Any, bool]
#: the writes waiting for each driver connection's next statement, whichever RawStatements queued them
_QUEUES: weakref.WeakKeyDictionary[Any, list[_Queued]] = weakref.WeakKeyDictionary()
#: libpq's PQTRANS_IDLE: no transaction open on the server
_IDLE = 0
#: the pools whose engines send queued writes before anything else (`RawStatements.install`)
_INSTALLED: weakref.WeakSet[Any] = weakref.WeakSet()


class RawStatements:
    """Compile-once, execute-on-the-cursor, for one engine's dialect."""

    def __init__(self, dialect: sa.Dialect) -> None:
        self._dialect = dialect
        self._compiled: dict[tuple[int, tuple[str, ...]], _Compiled] = {}
        #: PostgreSQL through psycopg 3: writes nobody reads a result of wait for the connection's next
        #: statement and go with it in one pipeline (`later`); elsewhere they run at once
        self.pipelines = dialect.name == "postgresql" and dialect.driver == "psycopg"

    # ------------------------------------------------------------------ writes sent with the next statement

    def install(self, engine: sa.Engine) -> None:
        """Keep the queued writes in order with everything else on `engine`'s connections: any statement
        SQLAlchemy sends, a savepoint and a commit send them first; a rollback (to a savepoint, or of
        the transaction, or the pool's reset of a returned connection) drops them with the rest."""
        if not self.pipelines or engine.pool in _INSTALLED:
            return
        _INSTALLED.add(engine.pool)

        def before(conn: sa.Connection, *_args: Any) -> None:
            self.flush(conn)

        def drop(conn: sa.Connection, *_args: Any) -> None:
            # an invalidated connection (the database went away) has no driver connection to ask for
            _drop(_dbapi_if_live(conn))

        def reset(dbapi_connection: Any, *_args: Any) -> None:
            _drop(dbapi_connection)  # None for a checkout that failed to connect

        sa.event.listen(engine, "before_cursor_execute", before)
        sa.event.listen(engine, "savepoint", before)
        sa.event.listen(engine, "commit", self._commit)
        sa.event.listen(engine, "rollback", drop)
        sa.event.listen(engine, "rollback_savepoint", drop)
        sa.event.listen(engine.pool, "reset", reset)
        sa.event.listen(engine.pool, "checkin", reset)

    def later(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any]) -> None:
        """Run a write whose result nobody reads (no rowcount, no rows, no error expected but a broken
        database's) — at once, or on PostgreSQL with the connection's next statement, in one round trip
        with it. Its error, if any, is raised by that statement (or the commit), inside the same
        transaction: it rolls back as it would have."""
        sql, args = self._bound(stmt, params)
        if not self._queues_on(conn):
            self._run(conn, sql, args).close()
            return
        _QUEUES.setdefault(_dbapi(conn), []).append((sql, args, False))

    def later_many(self, conn: sa.Connection, stmt: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """`later` for one statement over many rows (the rows share their keys)."""
        if not rows:
            return
        if not self._queues_on(conn):
            self.executemany(conn, stmt, rows)
            return
        sql, order, _ = self._sql(stmt, tuple(rows[0]))
        args = [[row[k] for k in order] for row in rows] if order is not None else list(rows)
        _QUEUES.setdefault(_dbapi(conn), []).append((sql, args, True))

    def _queues_on(self, conn: sa.Connection) -> bool:
        """Whether writes on this connection may wait: PostgreSQL, inside a transaction (an autocommit
        statement commits by itself), on an engine whose events send them in time."""
        return self.pipelines and conn.engine.pool in _INSTALLED and conn.in_transaction() and \
            not _dbapi(conn).autocommit

    def flush(self, conn: sa.Connection) -> None:
        """Send the queued writes of this connection now (one round trip)."""
        if self.pipelines and (dbapi := _dbapi_if_live(conn)) is not None and _QUEUES.get(dbapi):
            self._run(conn, None, None).close()

    def _commit(self, conn: sa.Connection) -> None:
        """At a commit: the queued writes and the COMMIT in one pipeline (the driver's own commit then
        finds the transaction ended and sends nothing)."""
        queued = _QUEUES.get(_dbapi(conn))
        if queued:
            queued.append(("COMMIT", None, False))
            self._run(conn, None, None).close()

    def _run(self, conn: sa.Connection, sql: str | None, args: Any, many: bool = False) -> Any:
        """Execute `sql` (None: nothing of its own) after this connection's queued writes, all in one
        pipeline when there are any; returns the statement's cursor."""
        if not self.pipelines or (not _QUEUES.get(_dbapi(conn)) and not (sql is not None and _begins(conn))):
            cursor = conn.connection.cursor()
            try:
                if sql is not None:
                    (cursor.executemany if many else cursor.execute)(sql, args)
            except self._dialect.loaded_dbapi.Error as exc:
                cursor.close()
                raise self._translated(sql or "", args, exc) from exc
            return cursor
        cursors = self._pipelined(conn, [] if sql is None else [(sql, args, many)])
        return cursors[0] if cursors else conn.connection.cursor()

    def _pipelined(self, conn: sa.Connection, statements: Sequence[_Queued]) -> list[Any]:
        """This connection's queued writes, then `statements`, in one pipeline: one round trip (the
        driver's BEGIN included); returns the cursors of `statements`, their rows fetched."""
        queued = _QUEUES.pop(_dbapi(conn), None) or []
        dbapi = _dbapi(conn)
        sent, mine = [], []
        # psycopg begins a transaction in a pipeline with a round trip of its own (a Sync after its BEGIN):
        # the BEGIN goes first in the pipeline instead, psycopg told meanwhile that there is none to begin
        begin = _begins(conn)
        try:
            with dbapi.pipeline():
                # the BEGIN and the queued writes, whose results nobody reads, share one cursor (each
                # execute in a pipeline queues its own result; a cursor is a dozen Python objects to make)
                if begin or queued:
                    writes = dbapi.cursor()
                    sent.append(writes)
                    if begin:
                        dbapi._autocommit = True  # read only as a statement is sent; restored below
                        writes.execute(dbapi._get_tx_start_command())  # its isolation level, as psycopg's own
                    for q_sql, q_args, q_many in queued:
                        if q_args is None:
                            writes.execute(q_sql)
                        elif q_many:
                            writes.executemany(q_sql, q_args)
                        else:
                            writes.execute(q_sql, q_args)
                for sql, args, many in statements:
                    cursor = conn.connection.cursor()
                    mine.append(cursor)
                    (cursor.executemany if many else cursor.execute)(sql, args)
        except self._dialect.loaded_dbapi.Error as exc:
            for cursor in mine:
                cursor.close()
            first = statements[0] if statements else (queued[0] if queued else ("", None, False))
            raise self._translated(first[0], first[1], exc) from exc
        finally:
            if begin:
                dbapi._autocommit = False
            for other in sent:
                other.close()
        return mine

    def fetch_each(self, conn: sa.Connection, *queries: tuple[Any, Mapping[str, Any] | None]) -> list[list[Any]]:
        """Run several SELECTs and return each one's rows as tuples: on PostgreSQL in one round trip (one
        pipeline, after the queued writes), elsewhere one after the other. For reads that do not depend
        on each other (a Run and its path, from one snapshot inside the caller's transaction)."""
        return self._each(conn, queries, _as_tuples)

    def mappings_each(self, conn: sa.Connection, *queries: tuple[Any, Mapping[str, Any] | None]) -> list[
            list[dict[str, Any]]]:
        """`fetch_each`, each row as a dict (SELECTs of plain columns, as `mappings`)."""
        return self._each(conn, queries, _as_dicts)

    def _each(self, conn: sa.Connection, queries: Sequence[tuple[Any, Mapping[str, Any] | None]],
              read: Callable[[Any], _T]) -> list[_T]:
        if not self.pipelines:
            return [self._read(conn, stmt, params, read) for stmt, params in queries]
        cursors = self._pipelined(conn, [(*self._bound(stmt, params), False) for stmt, params in queries])
        try:
            return [read(cursor) for cursor in cursors]
        finally:
            for cursor in cursors:
                cursor.close()

    def _sql(self, stmt: Any, keys: tuple[str, ...]) -> _Compiled:
        hit = self._compiled.get((id(stmt), keys))
        if hit is None:
            column_keys = list(keys) if isinstance(stmt, sa.Insert) else None
            compiled = stmt.compile(dialect=self._dialect, column_keys=column_keys)
            order = tuple(compiled.positiontup or ()) if compiled.positional else None
            fixed = {k: v for k, v in compiled.params.items() if k not in keys}  # literals, e.g. id == 1
            hit = self._compiled[(id(stmt), keys)] = (compiled.string, order, fixed)
        return hit

    def _bound(self, stmt: Any, params: Mapping[str, Any] | None) -> tuple[str, Any]:
        """`stmt`'s SQL for this dialect and its arguments in the paramstyle's form (list or dict)."""
        sql, order, fixed = self._sql(stmt, tuple(params or ()))
        values = {**fixed, **(params or {})}
        return sql, [values[k] for k in order] if order is not None else values

    def execute(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> Any:
        """Run `stmt` with `params`; returns the DBAPI cursor (rowcount, fetchone, fetchall)."""
        return self._run(conn, *self._bound(stmt, params))

    def _read(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None,
              read: Callable[[Any], _T]) -> _T:
        cursor = self.execute(conn, stmt, params)
        try:
            return read(cursor)
        finally:
            cursor.close()

    def fetchone(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> Any:
        """Run a SELECT and return its first row as a tuple (None when there is none); closes the cursor."""
        return self._read(conn, stmt, params, lambda cursor: cursor.fetchone())

    def fetchall(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Run a SELECT and return its rows as tuples; closes the cursor."""
        return self._read(conn, stmt, params, _as_tuples)

    def mappings(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> list[
            dict[str, Any]]:
        """Run a SELECT of plain columns (no result processing needed) and return its rows as dicts."""
        return self._read(conn, stmt, params, _as_dicts)

    def executemany(self, conn: sa.Connection, stmt: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run `stmt` once per row (the rows share their keys)."""
        sql, order, _ = self._sql(stmt, tuple(rows[0]))
        args = [[row[k] for k in order] for row in rows] if order is not None else rows
        self._run(conn, sql, args, many=True).close()

    def rows(self, conn: sa.Connection, stmt: Any) -> list[Any]:
        """Run a one-off SELECT of plain columns (no result processing needed) on the DBAPI cursor, its
        parameters, IN lists included, bound into it now; its rows as tuples. For bulk reads, where
        SQLAlchemy's per-row result handling costs more than the database does."""
        compiled = stmt.compile(dialect=self._dialect, compile_kwargs={"render_postcompile": True})
        params = compiled.params
        args = [params[k] for k in compiled.positiontup or ()] if compiled.positional else params
        self.flush(conn)
        cursor = conn.connection.cursor()
        try:
            cursor.execute(compiled.string, args)
            return list(cursor.fetchall())
        except self._dialect.loaded_dbapi.Error as exc:
            raise self._translated(compiled.string, args, exc) from exc
        finally:
            cursor.close()

    def _translated(self, sql: str, args: Any, exc: Exception) -> BaseException:
        base = self._dialect.loaded_dbapi.Error
        return sa.exc.DBAPIError.instance(sql, args, exc, base, dialect=self._dialect)

    @contextlib.contextmanager
    def savepoint(self, conn: sa.Connection, name: str) -> Iterator[None]:
        """A savepoint in the caller's transaction, on the DBAPI cursor: what is done inside is undone
        alone when it raises (the exception goes on). SQLAlchemy's begin_nested() costs ~60 µs for
        the same two statements (its whole execution path, twice). `name` is a fixed identifier.

        On PostgreSQL neither statement costs a round trip of its own: the SAVEPOINT goes with the writes
        queued before it (sent now, so that their failure is not the block's) or, with none, waits for the
        block's first statement; the RELEASE goes with the block's last queued writes (sent before the
        block ends, so that their failure is the block's) or waits for the next statement."""
        queues = self._queues_on(conn)
        opened: _Queued = (f"SAVEPOINT {name}", None, False)
        if queues:
            waiting = _QUEUES.setdefault(_dbapi(conn), [])
            waiting.append(opened)
            if len(waiting) > 1:
                self.flush(conn)
        else:
            self._plain(conn, f"SAVEPOINT {name}")
        try:
            yield
            if queues:
                waiting = _QUEUES.setdefault(_dbapi(conn), [])
                if waiting and waiting[-1] is opened:  # the block sent nothing: nor does the savepoint
                    waiting.pop()
                    return
                waiting.append((f"RELEASE SAVEPOINT {name}", None, False))
                if len(waiting) > 1:
                    self.flush(conn)  # what the block queued runs inside the savepoint, and fails there
                return
            self.flush(conn)
        except BaseException:
            if queues and (dbapi := _dbapi_if_live(conn)) is not None and \
                    any(entry is opened for entry in _QUEUES.get(dbapi, ())):
                _QUEUES.pop(dbapi, None)  # never sent: nothing to undo (nothing before it waited)
                raise
            self._plain(conn, f"ROLLBACK TO SAVEPOINT {name}")
            self._plain(conn, f"RELEASE SAVEPOINT {name}")
            raise
        self._plain(conn, f"RELEASE SAVEPOINT {name}")

    def _plain(self, conn: sa.Connection, sql: str) -> None:
        if self.pipelines and sql.startswith("ROLLBACK TO"):
            _drop(_dbapi_if_live(conn))  # undone with the rest of the savepoint
        self.flush(conn)
        cursor = conn.connection.cursor()
        try:
            cursor.execute(sql)
        except self._dialect.loaded_dbapi.Error as exc:
            raise self._translated(sql, (), exc) from exc
        finally:
            cursor.close()


@functools.cache
def statements_for(dialect: sa.Dialect) -> RawStatements:
    """The RawStatements of a dialect, for code with no store of its own to hold one (compiled once)."""
    return RawStatements(dialect)


def has_queued(dbapi_connection: Any) -> bool:
    """Whether writes wait on this driver connection for its next statement or commit (profilers: the
    COMMIT then goes with them, as a statement)."""
    try:
        return bool(_QUEUES.get(dbapi_connection))
    except TypeError:  # a driver connection that takes no weak reference (sqlite3) never queues
        return False


def _as_tuples(cursor: Any) -> list[Any]:
    """A cursor's rows as tuples."""
    return list(cursor.fetchall())


def _as_dicts(cursor: Any) -> list[dict[str, Any]]:
    """A cursor's rows as dicts of its column names."""
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _begins(conn: sa.Connection) -> bool:
    """Whether psycopg will send a BEGIN before this connection's next statement (a transaction opened by
    SQLAlchemy that has sent nothing yet)."""
    dbapi = _dbapi(conn)
    return not dbapi.autocommit and dbapi.pgconn.transaction_status == _IDLE


def _drop(dbapi_connection: Any) -> None:
    """Forget what waits on a driver connection (none, or one that takes no weak reference: nothing)."""
    if dbapi_connection is not None:
        with contextlib.suppress(TypeError):
            _QUEUES.pop(dbapi_connection, None)


def _dbapi_if_live(conn: sa.Connection) -> Any:
    """The driver's connection, or None when the SQLAlchemy one was invalidated or closed."""
    if conn.invalidated or conn.closed:
        return None
    return conn.connection.dbapi_connection


def _dbapi(conn: sa.Connection) -> Any:
    """The driver's connection under a SQLAlchemy one."""
    return conn.connection.dbapi_connection
