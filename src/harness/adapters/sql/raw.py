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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

_Compiled = tuple[str, tuple[str, ...] | None, dict[str, Any]]


class RawStatements:
    """Compile-once, execute-on-the-cursor, for one engine's dialect."""

    def __init__(self, dialect: sa.Dialect) -> None:
        self._dialect = dialect
        self._compiled: dict[tuple[int, tuple[str, ...]], _Compiled] = {}

    def _sql(self, stmt: Any, keys: tuple[str, ...]) -> _Compiled:
        hit = self._compiled.get((id(stmt), keys))
        if hit is None:
            column_keys = list(keys) if isinstance(stmt, sa.Insert) else None
            compiled = stmt.compile(dialect=self._dialect, column_keys=column_keys)
            order = tuple(compiled.positiontup or ()) if compiled.positional else None
            fixed = {k: v for k, v in compiled.params.items() if k not in keys}  # literals, e.g. id == 1
            hit = self._compiled[(id(stmt), keys)] = (compiled.string, order, fixed)
        return hit

    def execute(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> Any:
        """Run `stmt` with `params`; returns the DBAPI cursor (rowcount, fetchone, fetchall)."""
        sql, order, fixed = self._sql(stmt, tuple(params or ()))
        values = {**fixed, **(params or {})}
        args = [values[k] for k in order] if order is not None else values
        cursor = conn.connection.cursor()
        try:
            cursor.execute(sql, args)
        except self._dialect.loaded_dbapi.Error as exc:
            raise self._translated(sql, args, exc) from exc
        return cursor

    def fetchone(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> Any:
        """Run a SELECT and return its first row as a tuple (None when there is none); closes the cursor."""
        cursor = self.execute(conn, stmt, params)
        try:
            return cursor.fetchone()
        finally:
            cursor.close()

    def fetchall(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Run a SELECT and return its rows as tuples; closes the cursor."""
        cursor = self.execute(conn, stmt, params)
        try:
            return list(cursor.fetchall())
        finally:
            cursor.close()

    def mappings(self, conn: sa.Connection, stmt: Any, params: Mapping[str, Any] | None = None) -> list[
            dict[str, Any]]:
        """Run a SELECT of plain columns (no result processing needed) and return its rows as dicts."""
        cursor = self.execute(conn, stmt, params)
        try:
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def executemany(self, conn: sa.Connection, stmt: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run `stmt` once per row (the rows share their keys)."""
        sql, order, _ = self._sql(stmt, tuple(rows[0]))
        args = [[row[k] for k in order] for row in rows] if order is not None else rows
        cursor = conn.connection.cursor()
        try:
            cursor.executemany(sql, args)
        except self._dialect.loaded_dbapi.Error as exc:
            raise self._translated(sql, args, exc) from exc
        finally:
            cursor.close()

    def rows(self, conn: sa.Connection, stmt: Any) -> list[Any]:
        """Run a one-off SELECT of plain columns (no result processing needed) on the DBAPI cursor, its
        parameters, IN lists included, bound into it now; its rows as tuples. For bulk reads, where
        SQLAlchemy's per-row result handling costs more than the database does."""
        compiled = stmt.compile(dialect=self._dialect, compile_kwargs={"render_postcompile": True})
        params = compiled.params
        args = [params[k] for k in compiled.positiontup or ()] if compiled.positional else params
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
        the same two statements (its whole execution path, twice). `name` is a fixed identifier."""
        self._plain(conn, f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self._plain(conn, f"ROLLBACK TO SAVEPOINT {name}")
            self._plain(conn, f"RELEASE SAVEPOINT {name}")
            raise
        self._plain(conn, f"RELEASE SAVEPOINT {name}")

    def _plain(self, conn: sa.Connection, sql: str) -> None:
        cursor = conn.connection.cursor()
        try:
            cursor.execute(sql)
        except self._dialect.loaded_dbapi.Error as exc:
            raise self._translated(sql, (), exc) from exc
        finally:
            cursor.close()
