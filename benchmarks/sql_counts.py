"""Commits, statements, round trips and wire bytes a benchmark contender makes per Run (issue 20).

Counted in the contender's own process, on its own connections, for Runs made after the timed ones (the
instruments cost time, so they are never on while the clock runs):

- SQLite: the driver's trace callback (`sqlite3.Connection.set_trace_callback`) sees every statement
  SQLite runs on the connection, BEGIN and COMMIT included. In process, a statement is not a round trip.
- PostgreSQL: libpq's own protocol trace (`PGconn.trace`) of every message each connection sends and
  receives. A statement is an Execute or a Query message; a round trip is each time the client, having
  sent, waits for the server's answer (a pipeline of many statements is one); a transaction is each
  return of the server to "idle" after work (ReadyForQuery "I"), an explicit COMMIT or an autocommit
  statement alike; it wrote when one of its commands inserted, updated or deleted a row (only those
  make the server flush its WAL at commit). Wire bytes are the messages' lengths, both ways.

For harness, a second, Python-level log names the pipeline code each statement came from (the first
frames of the call stack outside the SQL adapter), grouped into transactions: the per-transaction
profile of one Run.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WRITE = re.compile(r'^(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)', re.I)
_FROM = re.compile(r'\bFROM\s+"?(\w+)', re.I)


def summary(sql: str) -> str:
    """'INSERT trace_records', 'SELECT runs', 'COMMIT' …: what a statement does, and to which table."""
    text = sql.strip()
    if text in (";", ""):
        return "ping"  # SQLAlchemy's pre-ping of a pooled connection
    if text.startswith("--"):
        return "internal"  # SQLite's own sub-statement (a trigger's program, FTS5's shadow tables)
    verb = text.split(None, 1)[0].upper().rstrip(";")
    if verb in ("INSERT", "UPDATE", "DELETE"):
        m = _WRITE.match(text)
        return f"{verb} {m.group(1)}" if m else verb
    if verb in ("SELECT", "WITH"):
        m = _FROM.search(text)
        lock = " FOR UPDATE" if re.search(r"\bFOR\s+UPDATE\s*$", text, re.I) else ""
        return f"SELECT {m.group(1) if m else ''}{lock}".rstrip()
    return verb


def caller(depth: int = 3) -> str:
    """The innermost `depth` harness frames outside the SQL adapter: who issued the statement."""
    frame: Any = sys._getframe(2)
    names: list[str] = []
    while frame is not None and len(names) < depth:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("harness.") and not module.startswith("harness.adapters"):
            names.append(f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(names) or "(outside harness)"


@dataclass
class Transaction:
    """One transaction of the Python-level log: who opened it and what it ran."""

    label: str
    statements: list[str] = field(default_factory=list)
    end: str = "open"
    round_trips: int = 0

    def brief(self) -> str:
        """'INSERT runs, INSERT outbox x2, …', in the order each first ran."""
        counts = Counter(self.statements)
        return ", ".join(f"{s} x{n}" if n > 1 else s for s, n in counts.items())


class StatementLog:
    """The Python-level log of one process's statements, per DBAPI connection, grouped in transactions."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.on = False
        self._open: dict[int, Transaction] = {}
        self._pings: dict[int, int] = {}
        self.transactions: list[Transaction] = []

    def mark(self) -> int:
        """A position to slice the transactions made from here on."""
        return len(self.transactions)

    def statement(self, conn_key: int, sql: str, round_trips: int = 1, rows: int = 1,
                  autocommit: bool = False, pipelined: bool = False) -> None:
        if not self.on:
            return
        what = summary(sql)
        if what == "ping":  # the pool's check at checkout: counted with the transaction that follows
            self._pings[conn_key] = self._pings.get(conn_key, 0) + 1
            return
        if self.backend == "sqlite" and what == "BEGIN":
            self._close(conn_key, "implicit")
        tx = self._open.get(conn_key)
        if tx is None:
            tx = Transaction(caller(4))
            pings = self._pings.pop(conn_key, 0)
            tx.statements += ["ping"] * pings
            tx.round_trips += pings
            self.transactions.append(tx)
            if autocommit:  # its own transaction: no BEGIN, no COMMIT on the wire
                tx.statements += [what] * rows
                tx.round_trips += round_trips
                tx.end = "autocommit"
                return
            self._open[conn_key] = tx
            if self.backend == "postgresql":  # psycopg sends its BEGIN before the first statement
                tx.statements.append("BEGIN")
                tx.round_trips += 0 if pipelined else 1  # in a pipeline it goes with the statement
        tx.statements += [what] * rows
        tx.round_trips += round_trips
        # SQLite's COMMIT, or one sent as a statement at the end of a PostgreSQL pipeline (the driver's
        # commit after it sends nothing)
        if what in ("COMMIT", "ROLLBACK") and (self.backend == "sqlite" or pipelined):
            self._close(conn_key, what)

    def end(self, conn_key: int, how: str, autocommit: bool = False) -> None:
        """SQLAlchemy committed or rolled back the connection's transaction (PostgreSQL's end)."""
        if not self.on or autocommit:  # the driver sends nothing in autocommit
            return
        tx = self._open.get(conn_key)
        if tx is not None and self.backend == "postgresql":
            tx.statements.append(how)
            tx.round_trips += 1
            self._close(conn_key, how)

    def _close(self, conn_key: int, how: str) -> None:
        tx = self._open.pop(conn_key, None)
        if tx is not None:
            tx.end = how


# ------------------------------------------------------------------------------------------ SQLite

class SqliteCounts:
    """Statements and commits on sqlite3 connections, through their trace callbacks."""

    def __init__(self, log: StatementLog | None = None) -> None:
        self.statements = 0
        self.commits = 0
        self.write_commits = 0
        self.rollbacks = 0
        self._wrote: set[int] = set()
        self.log = log
        self._conns: list[Any] = []

    def attach(self, conn: Any) -> None:
        if any(c is conn for c in self._conns):
            return
        key = id(conn)

        def traced(sql: str) -> None:
            if sql.lstrip().startswith("--"):
                return  # SQLite's own sub-statements (triggers, FTS5): part of the statement that ran them
            self.statements += 1
            head = sql.lstrip()[:11].upper()
            if head.startswith(("INSERT", "UPDATE", "DELETE", "REPLACE")):
                self._wrote.add(key)
            elif head.startswith("COMMIT"):
                self.commits += 1
                if key in self._wrote:
                    self.write_commits += 1
                self._wrote.discard(key)
            elif head.startswith("ROLLBACK") and not head.startswith("ROLLBACK TO"):
                self.rollbacks += 1
                self._wrote.discard(key)
            if self.log is not None:
                self.log.statement(key, sql)

        conn.set_trace_callback(traced)
        self._conns.append(conn)

    def detach(self) -> dict[str, int]:
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.set_trace_callback(None)
        self._conns.clear()
        return {"statements": self.statements, "round_trips": self.statements, "commits": self.commits,
                "write_commits": self.write_commits, "rollbacks": self.rollbacks, "wire_bytes": 0}


# ------------------------------------------------------------------------------------------ PostgreSQL

_ROWS = re.compile(r'CommandComplete\s+"(INSERT \d+|UPDATE|DELETE|MERGE) (\d+)"')


def parse_pq_trace(text: str) -> dict[str, int]:
    """Count a libpq protocol trace (REGRESS_MODE, no timestamps): see the module's docstring."""
    statements = round_trips = transactions = writes = wire = commits = rollbacks = 0
    last_dir = "B"
    worked = wrote = rolled = False
    for line in text.splitlines():
        parts = line.split("\t", 3)
        if len(parts) < 3 or parts[0] not in ("F", "B"):
            continue
        direction, length, kind = parts[0], parts[1], parts[2].strip()
        wire += int(length) + 1 if length.isdigit() else 0
        if direction == "B" and last_dir == "F":
            round_trips += 1
        last_dir = direction
        if direction == "F" and kind in ("Execute", "Query"):
            statements += 1
            if kind == "Query" and '"COMMIT"' in line:
                commits += 1
            if kind == "Query" and '"ROLLBACK"' in line:
                rolled = True
            if kind == "Query" and any(f'"{w}' in line for w in ("BEGIN", "COMMIT", "ROLLBACK", ";", "DEALLOCATE")):
                continue  # transaction control, the pool's ping (";"), psycopg's DEALLOCATE: no work
            worked = True
        elif direction == "B" and kind == "CommandComplete":
            m = _ROWS.search(line)
            if m and int(m.group(2)) > 0:
                wrote = True
        elif direction == "B" and kind == "ReadyForQuery":
            status = parts[3].strip() if len(parts) > 3 else ""
            if status == "I" and worked:
                if rolled:
                    rollbacks += 1
                else:
                    transactions += 1
                    writes += wrote
                worked = wrote = rolled = False
    return {"statements": statements, "round_trips": round_trips, "commits": transactions,
            "write_commits": writes, "rollbacks": rollbacks, "explicit_commits": commits, "wire_bytes": wire}


class PgTrace:
    """libpq's protocol trace on psycopg connections, one file per connection, parsed at the end."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="pqtrace-"))
        self._live: list[tuple[Any, Any]] = []
        self._files: list[Path] = []

    def attach(self, conn: Any) -> None:
        """Start tracing a psycopg connection (idempotent)."""
        if any(c is conn for c, _ in self._live):
            return
        from psycopg import pq

        path = self._dir / f"{len(self._files)}.trace"
        handle = open(path, "w")  # noqa: SIM115 - libpq writes to it until detach
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        self._live.append((conn, handle))
        self._files.append(path)

    def release(self, conn: Any) -> None:
        """Stop tracing a connection about to close (libpq flushes its trace on untrace)."""
        for i, (c, handle) in enumerate(self._live):
            if c is conn:
                with contextlib.suppress(Exception):
                    c.pgconn.untrace()
                handle.close()
                del self._live[i]
                return

    def detach(self) -> dict[str, int]:
        for conn, _ in list(self._live):
            self.release(conn)
        total: Counter[str] = Counter()
        for path in self._files:
            total.update(parse_pq_trace(path.read_text()))
            os.unlink(path)
        os.rmdir(self._dir)
        return dict(total)


# ------------------------------------------------------------------------------------------ harness's engine

@contextlib.contextmanager
def on_harness_engine(engine: Any) -> Iterator[tuple[StatementLog, dict[str, int]]]:
    """Count every statement harness's engine sends while the block runs; yields the Python-level log
    and a dict filled with the totals when the block ends."""
    import sqlalchemy as sa

    backend = "postgresql" if engine.dialect.name == "postgresql" else engine.dialect.name
    log = StatementLog(backend)
    totals: dict[str, int] = {}
    counter: Any = SqliteCounts(log) if backend == "sqlite" else PgTrace()
    originals: list[tuple[Any, Any]] = []

    def instrument(dbapi_conn: Any) -> None:
        if backend == "sqlite":
            counter.attach(dbapi_conn)
            return
        counter.attach(dbapi_conn)
        if not any(c is dbapi_conn for c, _ in originals):
            originals.append((dbapi_conn, dbapi_conn.cursor_factory))
            dbapi_conn.cursor_factory = _logging_cursor(dbapi_conn.cursor_factory, log, id(dbapi_conn))

    def on_checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        instrument(dbapi_conn)

    def on_close(dbapi_conn: Any, _record: Any) -> None:
        if backend != "sqlite":
            counter.release(dbapi_conn)

    try:  # harness from this tree (a baseline tree, or another contender, may not have it)
        from harness.adapters.sql.raw import has_queued
    except ImportError:
        def has_queued(_dbapi: Any) -> bool:
            return False

    def on_commit(conn: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        if has_queued(dbapi):
            return  # harness sends its queued writes and the COMMIT in one pipeline: logged as statements
        log.end(id(dbapi), "COMMIT", bool(getattr(dbapi, "autocommit", False)))

    def on_rollback(conn: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        log.end(id(dbapi), "ROLLBACK", bool(getattr(dbapi, "autocommit", False)))

    sa.event.listen(engine, "checkout", on_checkout)
    sa.event.listen(engine, "close", on_close)
    sa.event.listen(engine, "commit", on_commit)
    sa.event.listen(engine, "rollback", on_rollback)
    log.on = True
    try:
        yield log, totals
    finally:
        log.on = False
        for name, fn in (("checkout", on_checkout), ("close", on_close), ("commit", on_commit),
                         ("rollback", on_rollback)):
            sa.event.remove(engine, name, fn)
        for conn, factory in originals:
            conn.cursor_factory = factory
        totals.update(counter.detach())


def _logging_cursor(base: Any, log: StatementLog, key: int) -> Any:
    """A psycopg cursor class that tells `log` each statement it runs (and who ran it)."""

    seen_pipelines: list[int] = []

    def trips(cursor: Any) -> tuple[int, bool]:
        """Round trips of a statement: one, or inside a pipeline one for the whole pipeline (its first)."""
        pipeline = getattr(cursor.connection, "_pipeline", None)
        if pipeline is None:
            return 1, False
        if seen_pipelines and seen_pipelines[-1] == id(pipeline):
            return 0, True
        seen_pipelines[:] = [id(pipeline)]
        return 1, True

    def autocommit(cursor: Any) -> bool:
        """A statement that is its own transaction: on an autocommit connection with none open (harness
        sends its own BEGIN at the head of a pipeline, the connection said autocommit meanwhile)."""
        conn = cursor.connection
        return bool(conn.autocommit) and conn.pgconn.transaction_status == 0  # PQTRANS_IDLE

    def text_of(query: Any) -> str:
        return query.decode() if isinstance(query, bytes) else str(query)

    class LoggingCursor(base):  # type: ignore[misc, valid-type]
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            text = text_of(query)
            if text.startswith("BEGIN"):  # the log writes each transaction's BEGIN itself
                return super().execute(query, params, **kwargs)
            round_trips, pipelined = trips(self)
            log.statement(key, text, round_trips=round_trips, autocommit=autocommit(self), pipelined=pipelined)
            return super().execute(query, params, **kwargs)

        def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
            rows = list(params_seq)
            round_trips, pipelined = trips(self)
            log.statement(key, text_of(query), round_trips=round_trips, rows=len(rows), autocommit=autocommit(self),
                          pipelined=pipelined)
            return super().executemany(query, rows, **kwargs)

    return LoggingCursor
