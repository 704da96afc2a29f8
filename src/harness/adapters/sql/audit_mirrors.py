"""The rows people read, checked against the chained records they mirror, in a live database (SPEC
A1-A3, K8): the rows and records (chained, or still waiting in the outbox) read here, the comparison
in audit.row_check.

Runs are read in batches of `batch`, each batch in one repeatable-read snapshot (records and rows of a
live database then agree), so memory stays bounded however many Runs there are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.retention_schema import erased_runs
from harness.adapters.sql.store import SqlStore
from harness.audit.row_check import MIRRORED, Record, RowChecker, audit_rows, check_run, parsed
from harness.domain.audit import ChainReport

__all__ = ["check_rows"]

_ROW_TABLES = (t.transitions, t.audit_events, t.costs, t.hitl_requests, t.hitl_decisions)


class _Checker(RowChecker):
    """The row check over a live database: the columns of the mirrored tables it has, read once."""

    def __init__(self, report: ChainReport) -> None:
        super().__init__(report)
        self._columns: dict[str, list[sa.Column[Any]]] | None = None

    def columns(self, conn: sa.Connection) -> dict[str, list[sa.Column[Any]]]:
        """The columns of the mirrored tables this database has, read once per verify."""
        if self._columns is None:
            self._columns = {table.name: _columns(conn, table) for table in (t.runs, t.jobs, *_ROW_TABLES)}
        return self._columns


def _records_of(conn: sa.Connection, run_ids: list[str] | None) -> dict[str | None, list[Record]]:
    """The records of these Runs (None: of no Run), outbox first so a record drained meanwhile is seen
    (once: by id), payloads only for the mirrored kinds."""
    found: dict[str | None, dict[str, Record]] = defaultdict(dict)
    for table, seq in ((t.outbox, sa.null()), (t.trace_records, t.trace_records.c.seq)):
        payload = sa.case((table.c.kind.in_(MIRRORED), table.c.payload), else_=sa.null())
        where = table.c.run_id.is_(None) if run_ids is None else table.c.run_id.in_(run_ids)
        order = table.c.id if table is t.outbox else table.c.seq
        query = sa.select(seq, table.c.record_id, table.c.run_id, table.c.kind, payload).where(where).order_by(order)
        for r in conn.execute(query):
            found[r[2]][r[1]] = Record(r[0], r[1], r[3], parsed(r[4]))
    return {k: sorted(v.values(), key=lambda r: (r.seq is None, r.seq or 0)) for k, v in found.items()}


def _columns(conn: sa.Connection, table: sa.Table) -> list[sa.Column[Any]]:
    """The table's columns this database has: a database at an older revision (opened without migrating)
    lacks the newer ones, and what its rows do not hold is not compared."""
    present = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    return [c for c in table.c if c.name in present]


def _rows_of(conn: sa.Connection, table: sa.Table, run_ids: list[str],
             columns: list[sa.Column[Any]]) -> dict[str, list[Mapping[Any, Any]]]:
    grouped: dict[str, list[Mapping[Any, Any]]] = defaultdict(list)
    order = table.c.seq if table is t.transitions else table.c.id if "id" in table.c else table.c.created_at
    for r in conn.execute(sa.select(*columns).where(table.c.run_id.in_(run_ids)).order_by(order)).mappings():
        grouped[r["run_id"]].append(r)
    return grouped


def _snapshot(store: SqlStore) -> sa.Connection:
    """A read connection whose transaction sees one snapshot (records and rows of a live database agree)."""
    conn = store.reader.connect()
    if store.engine.dialect.name != "sqlite":  # SQLite's deferred BEGIN already reads one WAL snapshot
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
    return conn


def _check_batch(store: SqlStore, checker: _Checker, run_ids: list[str]) -> None:
    with _snapshot(store) as conn, conn.begin():
        records = _records_of(conn, run_ids)
        cols = checker.columns(conn)
        runs = {r["run_id"]: r for r in conn.execute(
            sa.select(*cols[t.runs.name]).where(t.runs.c.run_id.in_(run_ids))).mappings()}
        jobs = {r["job_id"]: r for r in conn.execute(
            sa.select(*cols[t.jobs.name]).where(t.jobs.c.job_id.in_(run_ids))).mappings()}
        rows = {table.name: _rows_of(conn, table, run_ids, cols[table.name]) for table in _ROW_TABLES}
    for run_id in run_ids:
        recs = records.get(run_id, [])
        if not recs or run_id not in runs:
            continue  # a Run with no record at all is named by verify (run_trace_missing)
        check_run(checker, run_id, runs[run_id], jobs.get(run_id), recs,
                   {name: grouped.get(run_id, []) for name, grouped in rows.items()})


def _check_runless(store: SqlStore, checker: _Checker) -> None:
    """Audit events of no Run (e.g. an illegal transition asked for an unknown Run)."""
    with _snapshot(store) as conn, conn.begin():
        records = [r for r in _records_of(conn, None).get(None, []) if r.kind == "audit"]
        rows = list(conn.execute(sa.select(t.audit_events).where(t.audit_events.c.run_id.is_(None))
                                 .order_by(t.audit_events.c.id)).mappings())
    audit_rows(checker, rows, records, None)


def _check_orphans(store: SqlStore, checker: _Checker, limit: int) -> None:
    """Rows and records that name a Run the runs table does not hold (its row deleted?)."""
    def no_run(column: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
        return sa.and_(column.is_not(None), ~sa.exists().where(t.runs.c.run_id == column))

    with store.reader.connect() as conn:
        for table in (*_ROW_TABLES, t.jobs):
            column = table.c.job_id if table is t.jobs else table.c.run_id
            for run_id in conn.execute(sa.select(column).where(no_run(column)).distinct().limit(limit)).scalars():
                checker.problem("row_of_no_run", table.name, f"run {run_id}", "rows of a Run that has no runs row",
                                run_id=run_id)
        for table in (t.trace_records, t.outbox):
            query = sa.select(table.c.run_id).where(no_run(table.c.run_id)).distinct().limit(limit)
            for run_id in conn.execute(query).scalars():
                checker.problem("run_row_missing", "runs", f"run {run_id}",
                                f"{table.name} holds records of this Run but the runs table has no row for it",
                                run_id=run_id)


def check_rows(store: SqlStore, report: ChainReport, *, batch: int = 200) -> None:
    """Check every mirrored row against its record; problems go to `report`, the rest to its warnings."""
    checker = _Checker(report)
    after = ""
    with store.reader.connect() as conn:
        erasable = sa.inspect(conn).has_table(erased_runs.name)  # not on a database of an earlier version
    while True:
        with store.reader.connect() as conn:
            query = sa.select(t.runs.c.run_id).where(t.runs.c.run_id > after)
            if erasable:
                # a Run whose personal data an erasure replaced has no rows left that its records could prove
                query = query.where(~sa.exists().where(erased_runs.c.run_id == t.runs.c.run_id))
            ids = list(conn.execute(query.order_by(t.runs.c.run_id).limit(batch)).scalars())
        if not ids:
            break
        _check_batch(store, checker, ids)
        after = ids[-1]
    _check_runless(store, checker)
    _check_orphans(store, checker, report.limit)
    if checker.legacy_run_traces:
        report.warnings.append(
            f"{checker.legacy_run_traces} Run(s) were closed by a version whose RunTrace commits neither to "
            "the Run's result nor to its records: their results and completeness are not proven by the chain")
